"""SIGINT and SIGTERM stop a foreground command alike, whatever signal dispositions the process inherited.

A shell starts a background job (`cmd &`) with SIGINT ignored, and an ignored signal stays ignored across exec:
Python then installs no KeyboardInterrupt handler, asyncio.run none either, and Ctrl-C or a test's SIGINT does
nothing. Kubernetes, systemd and process supervisors stop with SIGTERM, which Python does not handle at all.
Within ``stop_on_signals()`` both raise KeyboardInterrupt in the main thread (through asyncio.run's own SIGINT
handler while it runs, so the running task is cancelled cleanly), and ``Stop.signal`` says which one came.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType


@dataclass
class Stop:
    """Which signal asked the command to stop: SIGINT unless SIGTERM came (a KeyboardInterrupt is a Ctrl-C)."""

    signal: signal.Signals = signal.SIGINT

    @property
    def name(self) -> str:
        return "terminated" if self.signal == signal.SIGTERM else "interrupted"

    @property
    def exit_code(self) -> int:
        """The shell's convention for a command a signal ended: 128 + its number (130 SIGINT, 143 SIGTERM)."""
        return 128 + int(self.signal)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """Within: SIGINT and SIGTERM raise KeyboardInterrupt in the main thread; on leaving, the former handlers."""
    stop = Stop()

    def on_sigterm(_signum: int, frame: FrameType | None) -> None:
        stop.signal = signal.SIGTERM
        # Whatever handles SIGINT now: asyncio.run's (cancels the main task, then raises KeyboardInterrupt) while it
        # runs, else Python's default (raises it here).
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGTERM: signal.signal(signal.SIGTERM, on_sigterm)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)
