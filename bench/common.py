"""Shared bench helpers: timing with medians, a fake clock, free ports, /proc readers."""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
from collections.abc import Callable

from devtools.procs import child_pids
from devtools.procs import free_port as free_port  # re-exported: benches take it from here
from specdecode_exporter.simulator.clock import ManualClock

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


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def proc_cpu_seconds(pid: int) -> float:
    """CPU seconds a process has run, threads included. utime + stime count whole clock ticks (10 ms), which a
    relay that spends a few ms in a short run rounds to 0; so live threads count the scheduler's nanoseconds
    (/proc/PID/task/*/schedstat) and only threads that have ended (an HTTP server's per-request ones) count in
    ticks, as the process's total less its live threads' ticks."""
    process_ticks = _ticks(f"/proc/{pid}/stat")
    live_ticks, live_ns = 0, 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile counts among the ended
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as f:
                ns = int(f.read().split()[0])
            live_ticks, live_ns = live_ticks + _ticks(f"/proc/{pid}/task/{task}/stat"), live_ns + ns
    if not live_ns:  # no schedstat (a kernel without CONFIG_SCHED_INFO): ticks only
        return process_ticks / CLK_TCK
    return max(0, process_ticks - live_ticks) / CLK_TCK + live_ns / 1e9


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and the children it runs now (proc_cpu_seconds of each)."""
    total = proc_cpu_seconds(pid)
    for child in child_pids(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += proc_cpu_seconds(child)
    return total


def _ticks(stat_path: str) -> int:
    with open(stat_path, encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def proc_rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms" if seconds < 0.01 else f"{seconds * 1000:.1f} ms"


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0…1) of ``values``."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def p99(values: list[float]) -> float:
    """NaN without values (a phase that recorded no scrape)."""
    return percentile(values, 0.99) if values else float("nan")
