"""Differential test, end to end: the sidecar's windowed time per output token
(specdecode_time_per_output_token_seconds{statistic="p50"|"p90"|"p99"|"mean", window=...}) equals what
Debian's Prometheus computes with histogram_quantile over the same buckets and the same interval.

Prometheus scrapes the fake vLLM's own vllm:request_time_per_output_token_seconds histogram (and the sidecar's
re-export of it); the sidecar collects the same /metrics. The fake vLLM runs with no traffic except two bursts,
so both see the same counts however their clocks fall:

    idle (all zero) | burst 1: α 0.15, slow tokens | idle, longer than the short window | burst 2: α 0.9 | idle

The short window (10s) holds burst 2 only, the long one (1m) both: a sidecar that took its quantiles from the
totals rather than the window's change fails the short window. Each burst mixes the simulated background traffic
(two workloads) with real API requests of random length, so the buckets fill unevenly, on two engines.

Prometheus' side is histogram_quantile(q, increase(bucket[R])) evaluated at the timestamp of its last sample,
with R reaching back exactly to a sample in the idle stretch before the window's burst (or the first, all-zero
sample). A range that begins and ends on samples makes increase() the plain difference, with no extrapolation
(checked: increase of _count equals last − first). Both sides then interpolate identical integer counts with
the same formula, so the quantiles must agree to the last bit or so: the tolerance, 1e-12 relative, allows only
float rounding. The mean (Δ_sum/Δ_count) is 1e-9: the sidecar adds _sum up collection by collection, Prometheus
subtracts its two ends.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devtools.procs import Process, prometheus_binary
from devtools.stack import Prometheus, scrape_job, start_prometheus, start_sidecar, start_simulator, wait_until
from tests.helpers import require_tool

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MODEL = "diff/model"
ENGINES = ("0", "1")
SHORT, LONG = "10s", "1m"
SHORT_S = 10.0
COLLECT_S = 1.0
BURST_S = 3.0
GAP_S = 9.0  # > SHORT_S − BURST_S − SETTLE_S + 2 collections: burst 1 is out of the short window when read
SETTLE_S = 2.5  # after a burst: the sidecar collected and Prometheus scraped the frozen counts at least twice
DRAFTS_PER_SECOND = 300.0
REQUESTS_PER_BURST = 24
STATISTICS = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
QUANTILE_TOLERANCE = 1e-12
MEAN_TOLERANCE = 1e-9
VLLM = "vllm:request_time_per_output_token_seconds"
REEXPORTED = "specdecode_request_time_per_output_token_seconds"


def scenario() -> dict[str, Any]:
    return {"name": "tpot-differential", "models": [{
        "name": MODEL, "engines": len(ENGINES), "num_speculative_tokens": 3, "drafts_per_second": 0,
        "acceptance_rate": 0.75, "target_step_seconds": 0.03, "per_request_spread": 0.15,
        "workloads": [{"name": "follows", "share": 0.6, "temperature": 0.0},  # the live α (the bursts set it)
                      {"name": "creative", "share": 0.4, "acceptance_rate": 0.3, "temperature": 1.0}]}]}


@dataclass
class Stack:
    simulator: Process
    sidecar: Process
    prometheus: Prometheus

    @property
    def processes(self) -> tuple[Process, ...]:
        return self.simulator, self.sidecar, self.prometheus.process


Figures = dict[tuple[str, str, str], float]  # (engine, window, statistic): value


@dataclass(frozen=True)
class Timeline:
    """Wall-clock instants of the run (time.time()) and what the sidecar said at the end."""

    first_frozen: float  # burst 1 stopped
    second_started: float  # burst 2 began
    read: float  # the sidecar's figures were read
    sidecar: Figures


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = require_tool(prometheus_binary(), "prometheus (Debian package prometheus)")
    tmp: Path = tmp_path_factory.mktemp("tpot-differential")
    (tmp / "scenario.yaml").write_text(yaml.safe_dump(scenario()))
    with contextlib.ExitStack() as started:
        simulator = start_simulator(started, tmp, "simulator", "--scenario", str(tmp / "scenario.yaml"),
                                    "--pace", "false")
        sidecar = start_sidecar(started, tmp, {"targets": [{"name": "vllm", "url": f"{simulator.url}/metrics"}],
                                               "collect": {"interval": f"{COLLECT_S:g}s"},
                                               "windows": f"{SHORT},{LONG}"})
        prom = start_prometheus(started, tmp, prometheus, [scrape_job("vllm", [simulator]),
                                                           scrape_job("specdecode-sidecar", [sidecar])])
        yield Stack(simulator, sidecar, prom)


def burst(stack: Stack, acceptance_rate: float, rng: random.Random) -> None:
    """BURST_S seconds of background traffic at ``acceptance_rate`` plus API requests of random length."""
    with httpx.Client(base_url=stack.simulator.url, timeout=10, trust_env=False) as client:
        client.post("/-/phase", json={"drafts_per_second": DRAFTS_PER_SECOND,
                                      "acceptance_rate": acceptance_rate}).raise_for_status()
        end = time.monotonic() + BURST_S
        for _ in range(REQUESTS_PER_BURST):
            client.post("/v1/completions", json={
                "model": MODEL, "prompt": "p", "max_tokens": rng.randint(2, 80),
                "temperature": rng.choice((0.0, 0.7, 1.0))}).raise_for_status()
            time.sleep(BURST_S / REQUESTS_PER_BURST / 2)
        time.sleep(max(0.0, end - time.monotonic()))
        client.post("/-/phase", json={"drafts_per_second": 0}).raise_for_status()


def sidecar_figures(stack: Stack) -> Figures:
    """{(engine, window, statistic): value} of specdecode_time_per_output_token_seconds."""
    text = httpx.get(stack.sidecar.url + "/metrics", timeout=5, trust_env=False).text
    return {(s.labels["engine"], s.labels["window"], s.labels["statistic"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "specdecode_time_per_output_token_seconds" and s.labels.get("model_name") == MODEL}


@pytest.fixture(scope="module")
def timeline(stack: Stack) -> Timeline:
    def scraped_twice() -> bool:
        return all(len(stack.prometheus.values(f"count_over_time({metric}_count[1m]) >= 2")) == len(ENGINES)
                   for metric in (VLLM, REEXPORTED))

    wait_until(scraped_twice, 60, "two scrapes of the idle histograms", stack.processes)
    rng = random.Random(14)
    burst(stack, 0.15, rng)
    first_frozen = time.time()
    time.sleep(GAP_S)
    second_started = time.time()
    burst(stack, 0.9, rng)
    time.sleep(SETTLE_S)
    read = time.time()
    figures = sidecar_figures(stack)
    # The short window [read − 10s − half a collection, read] must open in the idle stretch between the bursts.
    opens = read - SHORT_S - COLLECT_S / 2
    assert first_frozen + COLLECT_S < opens < second_started, "the machine was too slow for this test's timing"
    time.sleep(COLLECT_S)
    assert sidecar_figures(stack) == figures, "the sidecar's figures moved while the counts were frozen"
    return Timeline(first_frozen, second_started, read, figures)


Vector = tuple[float, ...]


def bucket_samples(stack: Stack, metric: str, engine: str, since: float) -> list[tuple[float, Vector]]:
    """(timestamp, cumulative counts ordered by le) of one engine's histogram, every scrape since ``since``."""
    rng = f"{int(time.time() - since) + 2}s"
    rows = stack.prometheus.query(f'{metric}_bucket{{model_name="{MODEL}", engine="{engine}"}}[{rng}]')
    by_le = sorted(rows, key=lambda r: float(r["metric"]["le"]))
    stamps = [float(t) for t, _ in by_le[-1]["values"]]
    assert all([float(t) for t, _ in r["values"]] == stamps for r in by_le), "buckets scraped at different times"
    vectors = zip(*([float(v) for _, v in r["values"]] for r in by_le), strict=True)
    return list(zip(stamps, vectors, strict=True))


def window_ends(samples: list[tuple[float, Vector]], timeline: Timeline, window: str) -> tuple[float, float]:
    """(first, last) sample timestamps that bound ``window``'s counts: the last sample, and the last sample of
    the idle stretch before burst 2 (short window) or the first, all-zero sample (long window)."""
    (_, v_before_last), (t_last, v_last) = samples[-2], samples[-1]
    assert v_before_last == v_last, "the counts were not frozen when read"
    if window == LONG:
        t_first, v_first = samples[0]
        assert not any(v_first), f"the first sample is not idle: {v_first}"
        return t_first, t_last
    idle = [(t, v) for t, v in samples if timeline.first_frozen + 2 * COLLECT_S < t < timeline.second_started]
    assert len(idle) >= 3 and idle[0][1] == idle[-1][1], "no frozen stretch between the bursts"
    return idle[-1][0], t_last


def prometheus_figures(stack: Stack, metric: str, engine: str, first: float, last: float) -> dict[str, float]:
    """histogram_quantile over increase() from sample ``first`` to sample ``last``, evaluated at ``last``."""
    rng = f"{round((last - first) * 1000)}ms"
    selector = f'{{model_name="{MODEL}", engine="{engine}"}}'

    def one(expr: str) -> float:
        (result,) = stack.prometheus.query(expr, at=last)
        return float(result["value"][1])

    # The range begins and ends on samples: increase() is the plain difference, no extrapolation.
    plain = one(f"{metric}_count{selector} - {metric}_count{selector} offset {rng}")
    assert one(f"increase({metric}_count{selector}[{rng}])") == plain > 0
    figures = {name: one(f"histogram_quantile({q}, increase({metric}_bucket{selector}[{rng}]))")
               for name, q in STATISTICS.items()}
    figures["mean"] = one(f"increase({metric}_sum{selector}[{rng}]) / increase({metric}_count{selector}[{rng}])")
    return figures


def compare(stack: Stack, timeline: Timeline, metric: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    """{(engine, window, statistic): (sidecar, prometheus)} for Prometheus reading ``metric``."""
    sidecar = timeline.sidecar
    pairs = {}
    for engine in ENGINES:
        samples = bucket_samples(stack, metric, engine, timeline.read - 120)
        for window in (SHORT, LONG):
            first, last = window_ends(samples, timeline, window)
            for statistic, value in prometheus_figures(stack, metric, engine, first, last).items():
                pairs[(engine, window, statistic)] = (sidecar[(engine, window, statistic)], value)
    return pairs


def assert_equal(pairs: dict[tuple[str, str, str], tuple[float, float]]) -> None:
    off = {key: (ours, theirs) for key, (ours, theirs) in pairs.items()
           if not math.isclose(ours, theirs, rel_tol=MEAN_TOLERANCE if key[2] == "mean" else QUANTILE_TOLERANCE)}
    assert not off, f"sidecar vs Prometheus (engine, window, statistic): {off}"


def test_windowed_tpot_equals_prometheus_histogram_quantile(stack: Stack, timeline: Timeline,
                                                            record: list[dict[str, Any]]) -> None:
    pairs = compare(stack, timeline, VLLM)
    assert len(pairs) == len(ENGINES) * 2 * (len(STATISTICS) + 1)
    assert_equal(pairs)
    # Not a trivial agreement: the windows differ (burst 1 is only in the long one) ...
    for engine in ENGINES:
        assert pairs[(engine, SHORT, "p50")][0] < pairs[(engine, LONG, "p50")][0], "burst 1's slow tokens missing"
    # ... and most quantiles fall inside a bucket rather than on a bound.
    bounds = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0}
    inside = [key for key, (ours, _) in pairs.items() if key[2] != "mean" and ours not in bounds]
    assert len(inside) >= len(ENGINES) * 2 * len(STATISTICS) // 2, pairs
    worst = max(abs(a - b) / b for key, (a, b) in pairs.items() if key[2] != "mean")
    print("\n" + "\n".join(f"  {key}: sidecar {a!r}  Prometheus {b!r}" for key, (a, b) in sorted(pairs.items())))
    print(f"\nTPOT differential: {len(pairs)} figures equal, largest relative difference of a quantile {worst:.1e}")
    record.append({"line": f"TPOT quantiles: sidecar == Prometheus histogram_quantile for {len(pairs)} figures "
                           f"(2 engines × {SHORT}, {LONG} × p50/p90/p99/mean); largest relative difference of a "
                           f"quantile {worst:.1e}", "scenario": "tpot-differential", "worst_relative": worst})


def test_reexported_histogram_gives_the_same_quantiles(stack: Stack, timeline: Timeline) -> None:
    """The sidecar's re-export (specdecode_request_time_per_output_token_seconds, what the recording rules read)
    carries the same buckets: Prometheus' quantiles over it equal the sidecar's figures too."""
    assert_equal(compare(stack, timeline, REEXPORTED))
