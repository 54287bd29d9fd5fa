"""Bench 2: /metrics and the tap under production conditions.

A live ~1 MB target (4 models × 20 engines, k=8: successive simulator renders 5 s apart, so every counter moves
at every fetch), collected every 5 s; a scraper asking for /metrics as Prometheus does (OpenMetrics, gzip) every
5 s; and the request tap (a process of its own beside the sidecar's, tap/process.py) under streaming load at the
same time.

- ``page_costs``: in-process, interleaved rounds: one collection (fetch excluded), then one scrape as Prometheus
  asks for it (OpenMetrics, gzip): the page rendered by prometheus_client's encoders in a worker thread and
  gzipped; meanwhile, the longest the event loop went without running another task.
- ``tap_under_scrapes``: real processes: the tap's time to first byte on the sidecar's tap while the sidecar
  collects and is scraped (busy) against the same with both stopped (SIGSTOP of the busy sidecar; a second,
  quiet sidecar that collected once at start carries the load), and against the fake vLLM called directly;
  rounds interleaved.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import tap as tap_bench
from bench.collect import INTERVAL, Pipeline, body_sequence
from bench.common import p99, percentile, proc_rss_mb, tree_cpu_seconds
from bench.procs import EXPORTER_BIN, Scraper, child_env, static_server
from devtools.procs import child_pids, free_port, running
from specdecode_exporter.sidecar.heap import collect_after_scrape, tune_gc
from specdecode_exporter.sidecar.metrics_page import MetricsPage

LIVE_TARGET = (4, 20, 8)  # models, engines, k: a ~1 MB exposition
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                     "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;"
                     "escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")  # Prometheus 3's
WARM_COLLECTIONS = 3  # the busy sidecar's, before the tap rounds start


@dataclass
class PageCosts:
    page_kib: float  # the sidecar's /metrics, identity
    gzip_kib: float
    collect: float  # CPU seconds, medians over the rounds
    scrape: float  # one scrape (OpenMetrics, gzip): the page rendered and gzipped in a worker thread
    scrape_wall: float  # its wall time, seconds
    loop_gap: float  # the longest the event loop went without running another task during a scrape (all rounds)
    gc_pass: float  # the cyclic GC's pass the sidecar makes after each scrape (sidecar/heap.py)


class _Views:
    """What MetricsPage reads of an Exporter: the latest views, here the bench pipeline's."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def views(self) -> list[Any]:
        view = self.pipeline.collector.view
        return [view] if view is not None else []


@contextlib.contextmanager
def sidecar_gc() -> Iterator[None]:
    """The sidecar's GC schedule (sidecar/heap.py) for a while: the collector's passes come after each scrape, as
    in the sidecar, not inside whatever allocated last."""
    threshold = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def page_costs(rounds: int) -> PageCosts:
    with sidecar_gc():
        return _page_costs(rounds)


def _page_costs(rounds: int) -> PageCosts:
    pipeline = Pipeline(body_sequence(*LIVE_TARGET, rounds + 6), warm=4)
    page = MetricsPage(_Views(pipeline).views)
    collect, scrape, wall, passes, longest = [], [], [], [], 0.0
    body = plain = b""

    async def scrape_once() -> tuple[float, float, float, bytes, bytes]:
        gaps: list[float] = []
        stop = asyncio.Event()

        async def watch_loop() -> None:  # how long the loop went without running this task
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        watcher = asyncio.ensure_future(watch_loop())
        t0, w0 = time.process_time(), time.perf_counter()  # process-wide: the render thread's CPU included
        packed, _ = await page.render(PROMETHEUS_ACCEPT, "gzip")
        t1, w1 = time.process_time(), time.perf_counter()
        stop.set()
        await watcher
        uncompressed, _ = await page.render(PROMETHEUS_ACCEPT, "identity")
        return t1 - t0, w1 - w0, max(gaps, default=0.0), packed, uncompressed

    pipeline()
    asyncio.run(scrape_once())  # the first scrape starts the render threads: not a round
    for _ in range(rounds):
        t0 = time.process_time()
        pipeline()
        collect.append(time.process_time() - t0)
        cpu, seconds, gap, body, plain = asyncio.run(scrape_once())
        t0 = time.process_time()
        collect_after_scrape()
        passes.append(time.process_time() - t0)
        scrape.append(cpu)
        wall.append(seconds)
        longest = max(longest, gap)
    return PageCosts(len(plain) / 1024, len(body) / 1024, statistics.median(collect), statistics.median(scrape),
                     statistics.median(wall), longest, statistics.median(passes))


@dataclass
class TapUnderScrapes:
    rounds: int
    seconds: float
    ttfb_p99: dict[str, float]  # direct, quiet, busy: medians over the rounds
    ttfb_p50: dict[str, float]
    requests: dict[str, int]
    stalls: dict[str, int]  # gaps over 50 ms inside a stream, summed
    scrapes: list[float]  # wall seconds per scrape of the busy sidecar
    scrape_kib: float  # as sent (gzip)
    failures: int  # scrapes that failed or took over 10 s
    collections: int  # of the busy sidecar during its rounds
    steady_scrapes: list[float]  # wall seconds per scrape, every SCRAPE_PHASE_INTERVAL s with the tap loaded, after
    # the rounds (the busy rounds' few scrapes each follow the busy sidecar's SIGSTOP pause)
    unloaded_scrapes: list[float]  # the same scrapes with no requests through the tap: the load generator, the fake
    # vLLM and the tap process then leave the two cores to the sidecar and the scraper
    busy_cpu: float  # the busy sidecar's CPU seconds per second during its rounds (its tap process included)
    rss_mb: tuple[float, float]  # the busy sidecar's and its tap process' RSS at the end

    def added_p99(self, variant: str) -> float:
        return self.ttfb_p99[variant] - self.ttfb_p99["direct"]

    @property
    def scrape_p99(self) -> float:
        return p99(self.scrapes)

    @property
    def steady_scrape_p99(self) -> float:
        return p99(self.steady_scrapes)

    @property
    def unloaded_scrape_p99(self) -> float:
        return p99(self.unloaded_scrapes)


@contextlib.contextmanager
def _sidecar_with_tap(target: str, interval: str, upstream: str) -> Iterator[tuple[subprocess.Popen[bytes], str,
                                                                                     int]]:
    tap_port = free_port()
    config = {"collect": {"interval": interval}, "windows": ["1m", "5m", "15m", "1h"],
              "targets": [{"name": "vllm", "url": target, "timeout": "3s"}],
              "tap": {"listen_address": f"127.0.0.1:{tap_port}", "upstream": upstream}}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(json.dumps(config))
        with running("sidecar", lambda port: [
            str(EXPORTER_BIN), "run", "--config.file", str(path), "--web.listen-address", f"127.0.0.1:{port}",
            "--log.level", "error",
        ], Path(tmp), "/healthz", timeout=30, env=child_env()) as proc:
            tap_bench.wait_port(tap_port)
            yield proc.popen, proc.url, tap_port


def _load(port: int, streams: int, seconds: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        load = tap_bench.spawn("--role", "load", "--port", str(port), "--streams", str(streams), "--seconds",
                                str(seconds), "--out", out.name)
        load.wait(seconds + 60)
        stats: dict[str, Any] = json.loads(Path(out.name).read_text())
    return stats


SCRAPE_PHASE_INTERVAL = 1.0  # a scrape a second: every collection (5 s) has scrapes before, during and after it


def _steady_scrapes(url: str, tap_port: int, streams: int, seconds: float) -> Scraper:
    """Scrapes every SCRAPE_PHASE_INTERVAL s for ``seconds`` while the sidecar collects and, with ``streams``, the
    tap relays that many streams."""
    with Scraper(url, SCRAPE_PHASE_INTERVAL) as scraper:
        scraper.running.set()
        if streams:
            _load(tap_port, streams, seconds)
        else:
            time.sleep(seconds)
    return scraper


def tap_under_scrapes(rounds: int, seconds: float, streams: int = 64, scrape_seconds: float = 60.0
                      ) -> TapUnderScrapes:
    bodies = body_sequence(*LIVE_TARGET, int((rounds * 3 * (seconds + 4) + 1.5 * scrape_seconds) / INTERVAL)
                           + WARM_COLLECTIONS + 12)
    upstream_port = free_port()
    upstream = tap_bench.spawn("--role", "upstream", "--port", str(upstream_port))
    per: dict[str, list[dict[str, Any]]] = {"direct": [], "quiet": [], "busy": []}
    busy_cpu = busy_span = 0.0
    try:
        tap_bench.wait_port(upstream_port)
        up = f"http://127.0.0.1:{upstream_port}"
        with static_server(*bodies) as base, \
                _sidecar_with_tap(base + "/metrics", "5s", up) as (busy, busy_url, busy_tap), \
                _sidecar_with_tap(base + "/metrics", "1h", up) as (_, _, quiet_tap), \
                Scraper(busy_url + "/metrics", INTERVAL) as scraper:
            # Three collections before the rounds: every window then has two snapshots, and the page its full size.
            time.sleep(WARM_COLLECTIONS * INTERVAL)
            before = len(httpx.get(base + "/-/stats", timeout=10, trust_env=False).json().get("/metrics", []))
            for _ in range(rounds):
                for variant, port in (("direct", upstream_port), ("quiet", quiet_tap), ("busy", busy_tap)):
                    if variant != "busy":
                        busy.send_signal(signal.SIGSTOP)  # neither collecting nor scraped
                    else:
                        scraper.running.set()
                    cpu0, t0 = tree_cpu_seconds(busy.pid), time.monotonic()
                    per[variant].append(_load(port, streams, seconds))
                    if variant == "busy":
                        busy_cpu += tree_cpu_seconds(busy.pid) - cpu0
                        busy_span += time.monotonic() - t0
                        scraper.running.clear()
                    else:
                        busy.send_signal(signal.SIGCONT)
            after = len(httpx.get(base + "/-/stats", timeout=10, trust_env=False).json().get("/metrics", []))
            steady = _steady_scrapes(busy_url + "/metrics", busy_tap, streams, scrape_seconds)
            unloaded = _steady_scrapes(busy_url + "/metrics", busy_tap, 0, scrape_seconds / 2)
            rss = (proc_rss_mb(busy.pid), sum(proc_rss_mb(child) for child in child_pids(busy.pid)))
    finally:
        tap_bench.stop(upstream)

    def median(variant: str, q: float) -> float:
        return statistics.median(percentile(stats["ttfb"], q) for stats in per[variant])

    return TapUnderScrapes(
        rounds, seconds, {v: median(v, 0.99) for v in per}, {v: median(v, 0.5) for v in per},
        {v: sum(s["requests"] for s in per[v]) for v in per}, {v: sum(s["stalls"] for s in per[v]) for v in per},
        scraper.latencies, scraper.kib, scraper.failures + steady.failures + unloaded.failures, after - before,
        steady.latencies, unloaded.latencies, busy_cpu / busy_span if busy_span else float("nan"), rss)


def main() -> None:
    costs = page_costs(5)
    print(costs)
    result = tap_under_scrapes(int(sys.argv[1]) if len(sys.argv) > 1 else 2, 10.0)
    print(result, {v: result.added_p99(v) for v in ("quiet", "busy")}, result.scrape_p99)


if __name__ == "__main__":
    main()
