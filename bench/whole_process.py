"""Bench 1b: the whole sidecar process against a fetch + parse process, on the same moving ~1 MB exposition.

The baseline is what a user would write without the sidecar: a process that fetches the exposition with httpx
every interval and parses all of it with prometheus_client's `text_string_to_metric_families`. The sidecar is
the real process (`specdecode-exporter run`), collecting the same target at the same interval. The target moves:
each path of the static server serves successive simulator renders in turn, so every fetch has new counters.
Both processes run at the same time in each round (the same machine noise hits both), on paths of their own;
CPU comes from /proc (utime + stime, threads included). Rounds start fresh processes and fresh paths.

    python -m bench.whole_process fetch-parse URL INTERVAL   # the baseline process itself
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

from bench.common import proc_cpu_seconds
from bench.procs import ROOT, _env, sidecar, static_server


@dataclass(frozen=True)
class Round:
    span: float  # seconds measured
    sidecar_cpu: float  # CPU seconds in the span
    baseline_cpu: float
    sidecar_fetches: int  # fetches the server saw in the span
    baseline_fetches: int

    @property
    def ratio(self) -> float:
        """Baseline CPU per fetch / sidecar CPU per collection."""
        return (self.baseline_cpu / max(self.baseline_fetches, 1)) / (self.sidecar_cpu / max(self.sidecar_fetches, 1))


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
        return statistics.median(1000 * r.sidecar_cpu / max(r.sidecar_fetches, 1) for r in self.rounds)

    @property
    def baseline_ms(self) -> float:
        return statistics.median(1000 * r.baseline_cpu / max(r.baseline_fetches, 1) for r in self.rounds)


def fetch_parse_loop(url: str, interval: float) -> None:
    """The baseline process: fetch and parse every ``interval`` on a fixed schedule, forever."""
    from prometheus_client.parser import text_string_to_metric_families

    with httpx.Client(timeout=30, trust_env=False) as client:
        start = time.monotonic()
        n = 0
        while True:
            body = client.get(url).text
            for family in text_string_to_metric_families(body):
                len(family.samples)
            n += 1
            time.sleep(max(0.0, start + n * interval - time.monotonic()))


def _fetches(base: str, path: str, since: float, until: float) -> int:
    times = httpx.get(base + "/-/stats", timeout=30, trust_env=False).json().get(path, [])
    return sum(1 for t in times if since <= t < until)


def measure_round(base: str, name: str, interval: float, span: float, warmup: float) -> Round:
    side_path, base_path = f"/metrics/{name}-sidecar", f"/metrics/{name}-fetch-parse"
    cmd = [sys.executable, "-m", "bench.whole_process", "fetch-parse", base + base_path, str(interval)]
    with sidecar([base + side_path], interval=f"{interval:g}s") as (side, _), \
            subprocess.Popen(cmd, env=_env(), cwd=ROOT) as client:
        try:
            time.sleep(warmup)
            side0, client0, t0 = proc_cpu_seconds(side.pid), proc_cpu_seconds(client.pid), time.monotonic()
            time.sleep(span)
            side1, client1, t1 = proc_cpu_seconds(side.pid), proc_cpu_seconds(client.pid), time.monotonic()
        finally:
            client.terminate()
    return Round(t1 - t0, side1 - side0, client1 - client0, _fetches(base, side_path, t0, t1),
                 _fetches(base, base_path, t0, t1))


def run(bodies: list[bytes], interval: float = 1.0, span: float = 20.0, rounds: int = 3,
        warmup: float = 4.0) -> Result:
    """``bodies``: successive renders, at least (warmup + span) / interval + a few of them."""
    with static_server(*bodies) as base:
        measured = tuple(measure_round(base, f"r{i}", interval, span, warmup) for i in range(rounds))
    return Result(len(bodies[0]) / 1024, interval, measured)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "fetch-parse":
        fetch_parse_loop(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit(__doc__)
