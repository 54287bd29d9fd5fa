"""Bench 3's breakdown: where the real sidecar process's CPU per collection goes at a real-size page.

The sidecar runs as `specdecode-exporter run` does (cli.main in a process of its own), wrapped by this module's
``profiled`` command: cProfile with a CPU-time timer (time.process_time), switched on by SIGUSR1 once the warm-up
is over and off by SIGUSR2, plus a gc.callbacks counter that times each cyclic GC pass (a pass is charged to
whatever Python code ran when it started, so cProfile alone cannot see it). The target moves (the captured
vLLM 0.32.0 page, its counters scaled at every fetch); a scraper asks for /metrics as Prometheus does.

Each part is the CPU time of the functions that do it, inclusive, taken from the profile (cumulative time of the
root function of that work; the profile's CPU time, not wall time). The profiler's own cost inflates Python-heavy
parts alike, so the parts are given as shares of the profiled total and scaled to the process's CPU per
collection measured without the profiler in the same bench (bench 3's row).

    python -m bench.breakdown                # a 51 KiB target, interval 1 s, scraped every 15 s, 60 s profiled
    python -m bench.breakdown profiled OUT.json -- run --config.file … # the wrapped sidecar itself
"""

from __future__ import annotations

import cProfile
import gc
import json
import pstats
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

# (part, [(file suffix, function name)]): the roots whose inclusive CPU time is that part. A root inside
# another part's root (a render a scrape waited for) is taken out of the outer part.
PARTS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("fetch (HTTP client)", (("pipeline/scrape.py", "fetch"),)),
    ("decode + store", (("sidecar/collection.py", "selected"), ("sidecar/collection.py", "decode_selection"),
                        ("sidecar/collection.py", "store_decoded"))),
    ("views (publish)", (("sidecar/collection.py", "_publish_sliced"), ("sidecar/collection.py", "publish"))),
    ("page render (spec-decode part)", (("sidecar/page.py", "_render"),)),
    ("scrape: live families, gzip copy", (("sidecar/web.py", "render"),)),
    ("scrape: HTTP server (uvicorn, starlette)", (("uvicorn/protocols/http/httptools_impl.py", "data_received"),
                                                  ("uvicorn/protocols/http/h11_impl.py", "data_received"),
                                                  ("uvicorn/protocols/http/httptools_impl.py", "run_asgi"),
                                                  ("uvicorn/protocols/http/h11_impl.py", "run_asgi"))),
    ("keep_fresh polling", (("sidecar/page.py", "_keep_fresh"),)),
    ("logging", (("logging/__init__.py", "_log"),)),
    ("status model", (("sidecar/status.py", "status_json"),)),
    ("collection loop (schedule, semaphore)", (("sidecar/collection.py", "_loop"),)),
)
# Which parts sit inside which (outer part: inner parts), so that no CPU second is counted twice.
NESTED: dict[str, tuple[str, ...]] = {
    "collection loop (schedule, semaphore)": ("fetch (HTTP client)", "decode + store", "views (publish)",
                                              "logging"),
    "scrape: HTTP server (uvicorn, starlette)": ("scrape: live families, gzip copy", "page render (spec-decode part)",
                                                 "status model", "logging"),
    "scrape: live families, gzip copy": ("page render (spec-decode part)",),
    "keep_fresh polling": ("page render (spec-decode part)",),
}


class GCTimer:
    """CPU seconds spent in cyclic GC passes, per generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.passes = 0
        self._started = 0.0
        self.on = False

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        elif self.on:
            self.seconds += time.process_time() - self._started
            self.passes += 1


def _roots(stats: dict[Any, Any], file_suffix: str, name: str) -> float:
    return sum(ct for (file, _, func), (_, _, _, ct, _) in stats.items()
               if func == name and file.replace("\\", "/").endswith(file_suffix))


def parts_of(stats: dict[Any, Any]) -> dict[str, float]:
    """Each part's own CPU seconds (inclusive of its roots, less the parts nested in it)."""
    inclusive = {part: sum(_roots(stats, f, n) for f, n in roots) for part, roots in PARTS}
    own = dict(inclusive)
    for outer, inner in NESTED.items():
        own[outer] = max(0.0, inclusive[outer] - sum(inclusive[i] for i in inner))
    return own


def profiled(out: str, argv: list[str]) -> int:
    """cli.main(argv) with the profiler switched by SIGUSR1 (on) and SIGUSR2 (off, results written to ``out``)."""
    from specdecode_exporter import cli

    profile = cProfile.Profile(time.process_time)
    timer = GCTimer()
    gc.callbacks.append(timer)
    started = [0.0]

    def on(_signum: int, _frame: FrameType | None) -> None:
        started[0] = time.process_time()
        timer.on = True
        profile.enable()

    def off(_signum: int, _frame: FrameType | None) -> None:
        profile.disable()
        timer.on = False
        total = time.process_time() - started[0]
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        top = sorted(stats.items(), key=lambda item: -item[1][3])[:60]
        Path(out).write_text(json.dumps({
            "total": total, "gc": timer.seconds, "gc_passes": timer.passes, "parts": parts_of(stats),
            "top": [[f"{file}:{line}:{func}", tt, ct] for (file, line, func), (_, _, tt, ct, _) in top],
        }))

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    return cli.main(argv)


@dataclass(frozen=True)
class Breakdown:
    collections: int
    scrapes: int
    profiled_total: float  # CPU seconds under the profiler
    parts: dict[str, float]  # CPU seconds, each part's own
    gc: float
    gc_passes: int
    top: list[tuple[str, float, float]]

    def shares(self) -> Iterator[tuple[str, float]]:
        """(part, share of the profiled total); GC, then the rest (event loop, selector, whatever no part names)."""
        named = sum(self.parts.values()) + self.gc
        yield from ((part, seconds / self.profiled_total) for part, seconds in self.parts.items())
        yield "cyclic GC", self.gc / self.profiled_total
        yield "event loop and the rest", max(0.0, self.profiled_total - named) / self.profiled_total


def measure(body: bytes, interval: float = 1.0, span: float = 60.0, scrape_interval: float = 15.0,
            warmup: float | None = None) -> Breakdown:
    import os
    import tempfile

    from bench import collect
    from bench.procs import Scraper, fetch_stats, sidecar, static_server

    warmup = 2 * scrape_interval + 1.0 if warmup is None else warmup
    bodies = collect.moving_bodies(body, int((warmup + span) / interval) + 10)
    with tempfile.TemporaryDirectory(prefix="bench-breakdown-") as tmp, static_server(*bodies) as base:
        out = Path(tmp) / "profile.json"
        wrapper = [sys.executable, "-m", "bench.breakdown", "profiled", str(out), "--"]
        with sidecar([base + "/metrics/b"], interval=f"{interval:g}s", command=wrapper) as (proc, url), \
                Scraper(url + "/metrics", scrape_interval) as scraper:
            scraper.running.set()
            time.sleep(warmup)
            before, scraped = len(fetch_stats(base).get("/metrics/b", [])), len(scraper.latencies)
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(span)
            os.kill(proc.pid, signal.SIGUSR2)
            collections = len(fetch_stats(base).get("/metrics/b", [])) - before
            scrapes = len(scraper.latencies) - scraped
            for _ in range(100):
                if out.exists() and out.stat().st_size:
                    break
                time.sleep(0.1)
        data = json.loads(out.read_text())
    return Breakdown(collections, scrapes, data["total"], data["parts"], data["gc"], data["gc_passes"],
                     [(name, tt, ct) for name, tt, ct in data["top"]])


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "profiled" and sys.argv[3] == "--":
        return profiled(sys.argv[2], sys.argv[4:])
    from bench import corpus

    r = measure(corpus.fixture("captured_vllm_cpu_0.32.0_ngram.prom"))
    print(f"{r.collections} collections, {r.scrapes} scrapes, profiled CPU {1000 * r.profiled_total:.0f} ms, "
          f"{1000 * r.profiled_total / max(r.collections, 1):.2f} ms per collection under the profiler")
    for part, share in r.shares():
        print(f"  {part:45s} {100 * share:5.1f} %  {1000 * share * r.profiled_total / max(r.collections, 1):7.3f} ms")
    print(f"  GC passes {r.gc_passes}")
    for name, tt, ct in r.top[:40]:
        print(f"    {1000 * tt:8.1f} {1000 * ct:8.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
