"""Bench 3 and 4: the real sidecar process against N static targets — RSS, CPU, collection lag."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from bench.common import proc_cpu_seconds, proc_rss_mb
from bench.procs import ROOT, child_env, fetch_stats, sidecar, static_server


@dataclass
class FootprintResult:
    targets: int
    body_kib: float
    interval: float
    span: float
    cpu_seconds: float
    rss_mb: float
    hwm_mb: float
    collections: int  # total over all targets in the span
    expected: float  # span / interval × targets
    lag_p50: float  # median over targets of how far their fetches wandered from their schedule
    lag_max: float  # the same, worst target
    max_collect_duration: float

    @property
    def cpu_share(self) -> float:
        return self.cpu_seconds / self.span

    @property
    def cpu_per_collection_ms(self) -> float:
        return 1000 * self.cpu_seconds / max(self.collections, 1)

    @property
    def keeps_up(self) -> bool:
        return self.collections >= 0.9 * self.expected and self.lag_p50 < 0.2 * self.interval


def baseline_rss_mb() -> float:
    """RSS of a bare interpreter that imports what the sidecar imports (the part we cannot shrink)."""
    code = ("import specdecode_exporter.sidecar.web, specdecode_exporter.cli, uvicorn, sys;"
            "print(open('/proc/self/status').read().split('VmRSS:')[1].split()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                         check=True, timeout=60).stdout
    return int(out.strip()) / 1024


def measure(body: bytes, targets: int, interval: float, span: float, warmup: float | None = None) -> FootprintResult:
    with static_server(body) as base:
        urls = [f"{base}/metrics/{i}" for i in range(targets)]
        with sidecar(urls, interval=f"{interval:g}s", extra={"concurrency": 16}) as (proc, side):
            time.sleep(warmup if warmup is not None else max(2.0, 1.5 * interval))
            stats0 = fetch_stats(base)
            cpu0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
            time.sleep(span)
            cpu1, t1 = proc_cpu_seconds(proc.pid), time.monotonic()
            stats1 = fetch_stats(base)
            rss, hwm = proc_rss_mb(proc.pid), proc_rss_mb(proc.pid, "VmHWM")
            text = httpx.get(side + "/metrics", timeout=30, trust_env=False).text
    durations = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("specdecode_collect_duration_seconds{")]
    lags, worst, collections = [], 0.0, 0
    for path in (f"/metrics/{i}" for i in range(targets)):
        seen = set(stats0.get(path, []))
        new = [t for t in stats1.get(path, []) if t not in seen]
        collections += len(new)
        if len(new) < 2:
            lags.append(float("inf"))
            continue
        # Each target runs on its own fixed schedule (start + n × interval). How far its fetches wander from
        # that schedule is its lag: it stays within a collection's queueing time while the sidecar keeps up
        # and grows without bound when it falls behind (skipped ticks show in collections/expected).
        offsets = [t - new[0] - round((t - new[0]) / interval) * interval for t in new]
        lag = max(offsets) - min(offsets)
        lags.append(lag)
        worst = max(worst, lag)
    return FootprintResult(
        targets=targets, body_kib=len(body) / 1024, interval=interval, span=t1 - t0, cpu_seconds=cpu1 - cpu0,
        rss_mb=rss, hwm_mb=hwm, collections=collections, expected=(t1 - t0) / interval * targets,
        lag_p50=statistics.median(lags), lag_max=worst, max_collect_duration=max(durations, default=float("nan")),
    )


_RING_FILL = """
import json, sys
from bench import collect
from bench.common import proc_rss_mb
from bench.corpus import simulator_series
from specdecode_exporter.simulator.exposition import render
models, engines, k, collections = (int(a) for a in sys.argv[1:5])
sim = simulator_series(models, engines, k, "v1")
sim.advance(60.0)
clock = collect.FakeClock()
collector = collect.new_collector(clock)
first = None
for i in range(collections):
    sim.advance(collect.INTERVAL)
    collect.scrape_once(collector, clock, render("v1", sim.snapshot()))
    if i == 1:
        first = proc_rss_mb(__import__("os").getpid())
states = collector.store.for_target("vllm")
print(json.dumps({"series": len(states), "snapshots": max(len(s.times) for s in states),
                  "first_mb": first, "end_mb": proc_rss_mb(__import__("os").getpid())}))
"""


@dataclass
class RingFill:
    series: int
    snapshots: int  # per series, once the longest window has filled
    growth_mb: float  # RSS after the fill − RSS after the second collection


def ring_fill(models: int, engines: int, k: int, collections: int = 780) -> RingFill:
    """The memory the series' state takes once the 1h window has filled (65 min of collections at 5 s on a fake
    clock, in a child process so the figure is the state's alone)."""
    out = subprocess.run([sys.executable, "-c", _RING_FILL, str(models), str(engines), str(k), str(collections)],
                         capture_output=True, text=True, env=child_env(), cwd=ROOT, check=True, timeout=600).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return RingFill(data["series"], data["snapshots"], data["end_mb"] - data["first_mb"])


_SIDECAR_HOUR = """
import asyncio, json, os, sys
from bench import collect
from bench.common import FakeClock, proc_rss_mb
from specdecode_exporter.sidecar.collection import Exporter
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.sidecar.heap import collect_after_scrape, tune_gc
from specdecode_exporter.sidecar.metrics_page import MetricsPage
from specdecode_exporter.sidecar.web import build_app
body, collections = open(sys.argv[1], "rb").read(), int(sys.argv[2])
clock = FakeClock()
config = Config(targets=(TargetConfig(name="vllm", url="http://127.0.0.1:1/metrics"),),
                windows=parse_windows("1m,5m,15m,1h", "windows"), collect=CollectSection(interval=collect.INTERVAL))
exporter = Exporter(config, clock=clock)
build_app(exporter, run_collection=False)
page = MetricsPage(exporter.views)
tune_gc()
collector = exporter.collectors["vllm"]
async def scrape():
    return (await page.render("application/openmetrics-text;version=1.0.0", "gzip"))[0]
start = proc_rss_mb(os.getpid())
for i in range(collections):
    collect.scrape_once(collector, clock, collect.scaled_body(body, 1.0 + 0.01 * (i + 1)))
    body = asyncio.run(scrape())
    collect_after_scrape()  # as the sidecar does once a scrape is answered
states = exporter.store.for_target("vllm")
print(json.dumps({"series": len(states), "snapshots": max(len(s.times) for s in states), "start_mb": start,
                  "end_mb": proc_rss_mb(os.getpid()), "hwm_mb": proc_rss_mb(os.getpid(), "VmHWM"),
                  "page_kib": len(body) / 1024}))
"""


@dataclass
class HourFilled:
    series: int
    snapshots: int  # per series, once the longest window has filled
    start_mb: float  # RSS with everything imported and built, before the first collection
    rss_mb: float  # after the 1h window filled, page rendered each collection
    hwm_mb: float
    page_kib: float  # the last scrape's body, gzipped


def sidecar_after_hour(body: bytes, collections: int = 780) -> HourFilled:
    """The sidecar's own parts (Exporter, its store and views, the app, the /metrics page rendered after every
    collection and scraped gzipped) through 65 min of 5 s collections of a moving ``body`` on a fake clock, in a
    child process: its RSS once the 1h window has filled. The uvicorn server and its sockets are not running."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".prom") as f:
        f.write(body)
        f.flush()
        out = subprocess.run([sys.executable, "-c", _SIDECAR_HOUR, f.name, str(collections)], capture_output=True,
                             text=True, env=child_env(), cwd=ROOT, check=True, timeout=1200).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return HourFilled(data["series"], data["snapshots"], data["start_mb"], data["end_mb"], data["hwm_mb"],
                      data["page_kib"])
