"""Shared bench helpers: timing with medians, a fake clock, free ports, /proc readers."""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable

from devtools.procs import free_port as free_port  # re-exported: benches take it from here
from exporter.simulator.clock import ManualClock

CLK_TCK = os.sysconf("SC_CLK_TCK")


FakeClock = ManualClock


def time_call(fn: Callable[[], object], *, repeat: int, number: int = 1) -> list[float]:
    """Seconds per call for ``repeat`` rounds of ``number`` calls each (GC off while timing, like timeit)."""
    out: list[float] = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                fn()
            out.append((time.perf_counter() - start) / number)
    finally:
        if enabled:
            gc.enable()
    return out


def interleaved(fns: dict[str, Callable[[], object]], *, rounds: int, number: dict[str, int]) -> dict[str, float]:
    """Median seconds per call for each fn, measured round-robin so that machine noise hits all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].extend(time_call(fn, repeat=1, number=number.get(name, 1)))
    return {name: statistics.median(values) for name, values in samples.items()}


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (threads included)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms" if seconds < 0.01 else f"{seconds * 1000:.1f} ms"
