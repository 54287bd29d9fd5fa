"""Progress on stderr: a bar redrawn in place when stderr is a terminal, else a line per finished row and a
line every few seconds (logs and CI keep them readable)."""

from __future__ import annotations

import time
from typing import TextIO

from specdecode_exporter.probe.measure import Row

BAR_WIDTH = 24
REDRAW_SECONDS = 0.1
LINE_EVERY_SECONDS = 10.0


def _seconds(value: float) -> str:
    minutes, seconds = divmod(int(value), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    def __init__(self, stream: TextIO, tty: bool | None = None, every: float = LINE_EVERY_SECONDS) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.every = every
        self.total = 0
        self.rows = 0
        self.done = 0
        self.rows_done = 0
        self.label = ""
        self.started = time.monotonic()
        self._last_output = 0.0
        self._drawn = False

    def start(self, total_requests: int, total_rows: int, done: int = 0) -> None:
        """Once the first response said the server is fit to measure (before it, a fault is one line)."""
        self.total, self.rows, self.done = total_requests, total_rows, done
        self._last_output = time.monotonic()
        if not self.tty:
            self._line(f"measuring {total_rows} rows, {total_requests} requests")

    def working_on(self, label: str) -> None:
        self.label = label
        self._draw(force=True)

    def advance(self) -> None:
        self.done += 1
        self._draw(force=False)

    def row_done(self, row: Row) -> None:
        self.rows_done += 1
        alpha = "–" if row.acceptance_ratio is None else f"{row.acceptance_ratio:.3f}"
        speedup = "" if row.speedup_p50 is None else f", speedup p50 {row.speedup_p50:.2f}×"
        self._line(f"row {self.rows_done}/{self.rows} T={row.temperature:g} {row.group}: α {alpha}{speedup}, "
                   f"{row.verdict}")

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _line(self, text: str) -> None:
        self.close()
        self.stream.write(f"probe: {text}\n")
        self.stream.flush()
        self._last_output = time.monotonic()
        if self.tty:
            self._draw(force=True)

    def _draw(self, force: bool) -> None:
        now = time.monotonic()
        if not self.total:
            return
        if self.tty:
            if not force and now - self._last_output < REDRAW_SECONDS:
                return
            filled = BAR_WIDTH * self.done // self.total
            self.stream.write(f"\r\x1b[Kprobe [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} "
                              f"requests  {self.label}  {_seconds(now - self.started)}")
            self.stream.flush()
            self._drawn = True
            self._last_output = now
        elif now - self._last_output >= self.every:
            self._line(f"{self.done}/{self.total} requests, {self.rows_done}/{self.rows} rows ({self.label}), "
                       f"{_seconds(now - self.started)}")
