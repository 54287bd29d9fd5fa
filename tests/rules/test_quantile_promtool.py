"""Differential test: the sidecar's histogram quantile (pipeline/latency.py) against Prometheus' own
histogram_quantile, evaluated by promtool, over many random bucket shapes.

Every case is one classic histogram (one series per `le`) at two instants, a window's start and end. promtool
evaluates, per case and quantile,

    histogram_quantile(q, h_bucket{case="i"})                 the end's cumulative counts as they are
    histogram_quantile(q, increase(h_bucket{case="i"}[1m]))   the window's change, as the sidecar's windows see it

and the expected values are what `latency.quantile` gives for the same counts (through `latency.monotonic` and
`latency.change`, the way the sidecar gets there). The range covers exactly the two samples, so increase() is
the plain difference (no extrapolation) and both sides interpolate identical numbers: on x86-64 the results must
be bit-identical. promtool compares expected and actual values with ==, so any difference fails the case; a
platform whose Go build fuses multiply-adds (arm64) may differ in the last place, so there up to 2 ulps pass.

A case where the Python function has no answer (no observations, no finite bucket) must be NaN in Prometheus;
the test checks that with `x == x`, which drops NaN samples.

The shapes are drawn to reach every branch: sparse and dense buckets, integer and fractional (rate-like)
counts, ranks exactly on a bucket's cumulative count, ranks in the +Inf bucket, a first bound of 0 or below,
buckets whose counts go down (torn scrapes, mended the same way by both), windows that changed only some buckets.
"""

from __future__ import annotations

import math
import platform
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.procs import promtool_binary
from specdecode_exporter.pipeline import latency
from specdecode_exporter.pipeline.latency import Histogram
from tests.helpers import require_tool

SEED = 20250114
CASES = 400
QUANTILES = (0.01, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
VLLM_TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0)
BIT_EXACT = platform.machine().lower() in {"x86_64", "amd64"}
MAX_ULPS = 0 if BIT_EXACT else 2


@dataclass(frozen=True)
class Case:
    index: int
    bounds: tuple[float, ...]  # +Inf last
    start: tuple[float, ...]  # cumulative counts per bound at the window's start
    end: tuple[float, ...]  # ... and at its end (each at least its start: no counter reset)
    q: float


# ------------------------------------------------------------------------------------------ the shapes


def random_bounds(rng: random.Random) -> tuple[float, ...]:
    kind = rng.random()
    if kind < 0.4:  # vLLM's own TPOT buckets, or a run of them
        lo = rng.randrange(len(VLLM_TPOT_BOUNDS))
        finite = VLLM_TPOT_BOUNDS[lo: lo + rng.randint(1, len(VLLM_TPOT_BOUNDS))]
    else:
        n = rng.choice((1, 2, 3, 5, 8, 12, 20))
        finite = tuple(sorted({float(f"{rng.uniform(0.001, 50):.4g}") for _ in range(n)}))
        if kind > 0.9:  # a first bucket at or below 0 (Prometheus returns that bound for ranks in it)
            finite = (rng.choice((0.0, -1.0, -0.5)), *finite)
    if rng.random() < 0.03:
        finite = ()  # only +Inf: no answer from either
    return (*finite, math.inf)


def random_increments(rng: random.Random, n: int) -> list[float]:
    """Observations per bucket (not cumulative): sparse or dense, integer or fractional (a rate's values)."""
    density = rng.choice((0.1, 0.3, 0.7, 1.0))
    scale = rng.choice((1, 3, 10, 1000))
    fractional = rng.random() < 0.3
    out = []
    for _ in range(n):
        if rng.random() > density:
            out.append(0.0)
        elif fractional:
            out.append(round(rng.uniform(0, scale), rng.choice((1, 3, 6))))
        else:
            out.append(float(rng.randint(0, scale)))
    return out


def cumulative(increments: list[float]) -> list[float]:
    total, out = 0.0, []
    for x in increments:
        total += x
        out.append(total)
    return out


def tear(rng: random.Random, counts: list[float]) -> list[float]:
    """A few cumulative counts lowered (a torn scrape): not monotonic any more."""
    out = list(counts)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(out))
        out[i] = float(math.floor(out[i] * rng.uniform(0, 0.9)))
    return out


def on_a_boundary(rng: random.Random, n: int) -> tuple[list[float], float]:
    """Integer increments where q × total lands exactly on one bucket's cumulative count."""
    q = rng.choice((0.25, 0.5, 0.75, 0.9, 0.99))
    total = {0.25: 40, 0.5: 50, 0.75: 200, 0.9: 100, 0.99: 300}[q] * rng.randint(1, 4)
    cut = rng.randrange(n)
    below = round(q * total)
    increments = [0.0] * n
    increments[cut] = float(below)
    increments[rng.randrange(cut + 1, n) if cut + 1 < n else n - 1] += float(total - below)
    return increments, q


def make_case(rng: random.Random, index: int) -> Case:
    bounds = random_bounds(rng)
    n = len(bounds)
    q = rng.choice((*QUANTILES, round(rng.uniform(0.001, 0.999), 3)))
    start = cumulative(random_increments(rng, n)) if rng.random() < 0.7 else [0.0] * n
    if rng.random() < 0.15:
        delta, q = on_a_boundary(rng, n)
    else:
        delta = random_increments(rng, n)
        if not any(delta):
            delta[rng.randrange(n)] = float(rng.randint(1, 50))
        if rng.random() < 0.15:
            delta = [0.0] * (n - 1) + [delta[-1] or 1.0]  # everything above the highest finite bound
        if rng.random() < 0.05:
            delta = [0.0] * n  # an idle window
    window_change = cumulative(delta)
    if rng.random() < 0.15:  # the change is not monotonic across buckets: both must mend it alike
        window_change = [max(0.0, x) for x in tear(rng, window_change)]
    end = [s + d for s, d in zip(start, window_change, strict=True)]
    if rng.random() < 0.1:
        end = tear(rng, end)
        end = [max(e, s) for e, s in zip(end, start, strict=True)]  # still no counter reset
    return Case(index, bounds, tuple(start), tuple(end), q)


def cases() -> list[Case]:
    rng = random.Random(SEED)
    return [make_case(rng, i) for i in range(CASES)]


# ----------------------------------------------------------------------------------- the Python side


def python_instant(case: Case) -> float | None:
    return latency.quantile(case.q, Histogram(case.bounds, latency.monotonic(case.end), 0.0))


def python_window(case: Case) -> float | None:
    return latency.quantile(case.q, latency.change(Histogram(case.bounds, case.start, 0.0),
                                                   Histogram(case.bounds, case.end, 0.0)))


# ---------------------------------------------------------------------------------- the promtool file


def le_label(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(bound)


def input_series(case: Case) -> list[dict[str, str]]:
    return [{"series": f'h_bucket{{case="{case.index}", le="{le_label(b)}"}}', "values": f"{s!r} {e!r}"}
            for b, s, e in zip(case.bounds, case.start, case.end, strict=True)]


def expr_test(case: Case, expr: str, expected: float | None) -> dict[str, Any]:
    if expected is None:  # Prometheus' answer must be NaN: `x == x` keeps no NaN sample
        return {"expr": f"{expr} == {expr}", "eval_time": "1m", "exp_samples": []}
    return {"expr": expr, "eval_time": "1m",
            "exp_samples": [{"labels": f'{{case="{case.index}"}}', "value": expected}]}


def promtool_file(all_cases: list[Case]) -> dict[str, Any]:
    tests = []
    for case in all_cases:
        selector = f'h_bucket{{case="{case.index}"}}'
        tests.append(expr_test(case, f"histogram_quantile({case.q!r}, {selector})", python_instant(case)))
        tests.append(expr_test(case, f"histogram_quantile({case.q!r}, increase({selector}[1m]))",
                               python_window(case)))
    series = [s for case in all_cases for s in input_series(case)]
    return {"evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}


# A failed expression in promtool's output: the case's expected and actual sample.
FAILURE = re.compile(r'exp: \{case="(\d+)"\} (\S+)\s+got: \{case="\1"\} (\S+)')


def ulps_apart(a: float, b: float) -> float:
    return abs(a - b) / math.ulp(max(abs(a), abs(b)))


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool(promtool_binary(), "promtool (Debian package prometheus)")


def test_the_cases_reach_every_branch() -> None:
    """Guards the generator: a change to it must not quietly stop exercising a branch."""
    all_cases = cases()
    answers = [(c, python_window(c)) for c in all_cases]
    assert sum(v is None for _, v in answers) >= 5, "no case without an answer"
    assert sum(v is not None and v == c.bounds[-2] for c, v in answers) >= 20, "no rank in the +Inf bucket"
    assert sum(c.bounds[0] <= 0 for c in all_cases) >= 5, "no first bound at or below 0"
    assert sum(v is not None and v not in c.bounds for c, v in answers) >= 150, "too few interpolated ranks"
    assert sum(latency.monotonic(c.end) != list(c.end) for c in all_cases) >= 20, "too few torn histograms"
    on_bound = [c for c, v in answers if v is not None and v in c.bounds[:-1] and v != c.bounds[-2]]
    assert len(on_bound) >= 10, "too few ranks exactly on a bucket's cumulative count"


def test_python_quantile_equals_prometheus_histogram_quantile(promtool: str, tmp_path: Path) -> None:
    all_cases = cases()
    test_file = tmp_path / "quantiles.test.yaml"
    test_file.write_text(yaml.safe_dump(promtool_file(all_cases), sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True,
                          timeout=120, check=False)
    output = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return
    failures = FAILURE.findall(output)
    assert failures, f"promtool failed without a value mismatch:\n{output[-3000:]}"
    expressions = output.count("expr:")
    assert len(failures) == expressions, f"a case failed other than by its value:\n{output[-3000:]}"
    far = [(i, exp, got) for i, exp, got in failures if ulps_apart(float(exp), float(got)) > MAX_ULPS]
    assert not far, (f"{len(far)} of {2 * len(all_cases)} quantiles differ from Prometheus by more than "
                     f"{MAX_ULPS} ulp(s) (case, python, prometheus): {far[:10]}")
