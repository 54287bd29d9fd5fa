"""stop_on_signals: SIGINT and SIGTERM stop a command alike, even when it inherited SIGINT ignored."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from specdecode_exporter.core.process.signals import stop_on_signals


@pytest.fixture
def sigint_ignored() -> Iterator[None]:
    """This process as a background job of a shell starts: SIGINT ignored."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("sigint_ignored")
@pytest.mark.parametrize(("signum", "name", "code"), [(signal.SIGINT, "interrupted", 130),
                                                      (signal.SIGTERM, "terminated", 143)], ids=["SIGINT", "SIGTERM"])
def test_either_signal_raises_keyboard_interrupt_and_says_which(signum: int, name: str, code: int) -> None:
    term_before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), stop_on_signals() as stop:
        os.kill(os.getpid(), signum)
        signal.pause()  # the handler runs at the latest here
    assert (stop.name, stop.exit_code) == (name, code)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "the inherited disposition is back"
    assert signal.getsignal(signal.SIGTERM) is term_before


@pytest.mark.usefixtures("sigint_ignored")
def test_sigterm_cancels_asyncio_run_cleanly_as_ctrl_c_does() -> None:
    """Under asyncio.run the main task is cancelled (its cleanup runs), then KeyboardInterrupt is raised."""
    cleaned_up = []

    async def main() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(3600)
        finally:
            cleaned_up.append(True)

    with pytest.raises(KeyboardInterrupt), stop_on_signals() as stop:
        asyncio.run(main())
    assert cleaned_up == [True] and stop.exit_code == 143
