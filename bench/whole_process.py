"""Bench 1b: the whole sidecar process against a fetch + parse process, on the same moving ~1 MB exposition.

The baseline is what a user would write without the sidecar: a process that fetches the exposition with httpx
every interval and parses all of it with prometheus_client's `text_string_to_metric_families`. The sidecar is
the real process (`specdecode-exporter run`), collecting the same target at the same interval and scraped as the
shipped PodMonitor scrapes it (every 15 s, OpenMetrics, gzip), so its CPU includes the page it renders for each
scrape. The floor is a process that only fetches, on a raw socket (the request written, the head and the body
read by Content-Length, nothing parsed, one keep-alive connection): no process that reads the exposition over
HTTP can cost much less, so baseline / floor is the most any sidecar could reach. The target
moves: each path of the static server serves successive simulator renders in turn, so every fetch has new
counters. The three processes run at the same time in each round (the same machine noise hits all), on paths of
their own; CPU comes from /proc (utime + stime, threads included). Rounds start fresh processes and fresh paths.

    python -m bench.whole_process fetch-parse URL INTERVAL   # the baseline process itself
    python -m bench.whole_process fetch-only URL INTERVAL    # the floor (a raw socket)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from bench.common import proc_cpu_seconds
from bench.procs import ROOT, Scraper, child_env, sidecar, static_server

SCRAPE_INTERVAL = 15.0  # deploy/base/podmonitor.yaml's


@dataclass(frozen=True)
class Round:
    span: float  # seconds measured
    sidecar_cpu: float  # CPU seconds in the span
    baseline_cpu: float
    sidecar_fetches: int  # fetches the server saw in the span
    baseline_fetches: int
    floor_cpu: float
    floor_fetches: int
    scrapes: int  # of the sidecar, in the span

    @property
    def sidecar_per_fetch(self) -> float:
        """CPU seconds per collection."""
        return self.sidecar_cpu / max(self.sidecar_fetches, 1)

    @property
    def baseline_per_fetch(self) -> float:
        return self.baseline_cpu / max(self.baseline_fetches, 1)

    @property
    def floor_per_fetch(self) -> float:
        return self.floor_cpu / max(self.floor_fetches, 1)

    @property
    def ratio(self) -> float:
        """Baseline CPU per fetch / sidecar CPU per collection."""
        return self.baseline_per_fetch / self.sidecar_per_fetch

    @property
    def ceiling(self) -> float:
        """Baseline CPU per fetch / the floor's: the best ratio any process that fetches the body could reach."""
        return self.baseline_per_fetch / self.floor_per_fetch


@dataclass(frozen=True)
class Result:
    kib: float
    interval: float
    rounds: tuple[Round, ...]

    @property
    def ratio(self) -> float:
        return statistics.median(r.ratio for r in self.rounds)

    @property
    def sidecar_ms(self) -> float:
        """Median sidecar CPU per collection, ms."""
        return statistics.median(1000 * r.sidecar_per_fetch for r in self.rounds)

    @property
    def baseline_ms(self) -> float:
        return statistics.median(1000 * r.baseline_per_fetch for r in self.rounds)

    @property
    def floor_ms(self) -> float:
        return statistics.median(1000 * r.floor_per_fetch for r in self.rounds)

    @property
    def ceiling(self) -> float:
        return statistics.median(r.ceiling for r in self.rounds)


def parse_all(body: str) -> None:
    """The baseline's work on each body: all of it parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(body):
        len(family.samples)


def fetch_loop(url: str, interval: float, parse: bool) -> None:
    """The baseline (``parse``) or the floor process: fetch every ``interval`` on a fixed schedule, forever."""
    if not parse:
        raw_fetch_loop(url, interval)
        return
    with httpx.Client(timeout=30, trust_env=False) as client:
        start = time.monotonic()
        n = 0
        while True:
            parse_all(client.get(url).text)
            n += 1
            time.sleep(max(0.0, start + n * interval - time.monotonic()))


def raw_fetch_loop(url: str, interval: float) -> None:
    """The floor: GET on one keep-alive socket, the body read by its Content-Length, nothing parsed."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    request = f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        reader = sock.makefile("rb")
        start = time.monotonic()
        n = 0
        while True:
            sock.sendall(request)
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)
            n += 1
            time.sleep(max(0.0, start + n * interval - time.monotonic()))


def fetches_between(base: str, path: str, since: float, until: float) -> int:
    times = httpx.get(base + "/-/stats", timeout=30, trust_env=False).json().get(path, [])
    return sum(1 for t in times if since <= t < until)


def measure_round(base: str, name: str, interval: float, span: float, warmup: float,
                  scrape_interval: float = SCRAPE_INTERVAL) -> Round:
    side_path, base_path, floor_path = (f"/metrics/{name}-{who}" for who in ("sidecar", "fetch-parse", "fetch-only"))
    baseline = [sys.executable, "-m", "bench.whole_process", "fetch-parse", base + base_path, str(interval)]
    floor = [sys.executable, "-m", "bench.whole_process", "fetch-only", base + floor_path, str(interval)]
    with sidecar([base + side_path], interval=f"{interval:g}s") as (side, url), \
            subprocess.Popen(baseline, env=child_env(), cwd=ROOT) as client, \
            subprocess.Popen(floor, env=child_env(), cwd=ROOT) as fetcher, \
            Scraper(url + "/metrics", scrape_interval) as scraper:
        try:
            scraper.running.set()
            time.sleep(warmup)
            scraped = len(scraper.latencies)
            pids = (side.pid, client.pid, fetcher.pid)
            cpu0, t0 = [proc_cpu_seconds(pid) for pid in pids], time.monotonic()
            time.sleep(span)
            cpu1, t1 = [proc_cpu_seconds(pid) for pid in pids], time.monotonic()
            scraped = len(scraper.latencies) - scraped
        finally:
            client.terminate()
            fetcher.terminate()
    used = [after - before for before, after in zip(cpu0, cpu1, strict=True)]
    fetched = [fetches_between(base, path, t0, t1) for path in (side_path, base_path, floor_path)]
    return Round(t1 - t0, used[0], used[1], fetched[0], fetched[1], used[2], fetched[2], scraped)


def warmup_for(scrape_interval: float = SCRAPE_INTERVAL) -> float:
    """Two scrapes before the measured span: from then on the sidecar renders its page ahead of each scrape, as in
    a pod that has run a while (before its second scrape it cannot know when the next comes)."""
    return 2 * scrape_interval + 1.0


def run(bodies: list[bytes], interval: float = 1.0, span: float = 2 * SCRAPE_INTERVAL, rounds: int = 3,
        warmup: float = warmup_for(), scrape_interval: float = SCRAPE_INTERVAL) -> Result:
    """``bodies``: successive renders, at least (warmup + span) / interval + a few of them. ``span``: a multiple of
    the scrape interval, so each round holds as many scrapes (and renders) as a pod's steady state does."""
    with static_server(*bodies) as base:
        measured = tuple(measure_round(base, f"r{i}", interval, span, warmup, scrape_interval) for i in range(rounds))
    return Result(len(bodies[0]) / 1024, interval, measured)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("fetch-parse", "fetch-only"):
        fetch_loop(sys.argv[2], float(sys.argv[3]), parse=sys.argv[1] == "fetch-parse")
    else:
        sys.exit(__doc__)
