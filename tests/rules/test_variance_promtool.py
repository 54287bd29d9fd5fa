"""The page's variance in PromQL (monitoring/variance.py) against core.stats.dispersion, evaluated by promtool.

A small synthetic rule file: six input series per case hold a window's sums (N, ΣD, ΣA, ΣD², ΣA², ΣAD) and the
configured variance; the builder's expressions read them, and promtool checks, per case, that the page's variance
equals what ``core.stats.dispersion.page_variance`` gives for the same sums (to 1e-9 relative: the two evaluate the same
formula in a different order), and that the measured upper bound exists exactly where Python calls it measured.

Cases: traffic that scatters (bound above the binomial floor), identical requests (v̂ = 0: the floor α̂(1 − α̂)),
exactly min_requests requests (the bound at its widest), too few requests and nothing drafted (the configured
variance), a large window (the bound close to v̂).
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import yaml

from devtools.procs import promtool_binary
from specdecode_exporter.core.stats import dispersion
from specdecode_exporter.core.stats.dispersion import Moments
from specdecode_exporter.monitoring import variance
from tests.helpers import require_tool

MIN_REQUESTS = 20
CONFIGURED = 1.83
SERIES = ("n", "d", "a", "d2", "a2", "ad")


def requests(n: int, seed: int, spread: float) -> Moments:
    rng = random.Random(seed)
    sums = Moments()
    for _ in range(n):
        drafted = 3.0 * rng.randint(4, 16)
        p = min(1.0, max(0.0, rng.gauss(0.55, spread)))
        sums = sums.observed(drafted, float(sum(rng.random() < p for _ in range(int(drafted)))), None)
    return sums


CASES: dict[str, Moments] = {
    "scatter": requests(300, 1, 0.3),
    "identical": Moments(100, 3000, 1500, 100 * 900, 100 * 225, 100 * 450),
    "at_min_requests": requests(MIN_REQUESTS, 2, 0.2),
    "too_few": requests(MIN_REQUESTS - 1, 3, 0.2),
    "nothing_drafted": Moments(30, 0, 0, 0, 0, 0),
    "large": requests(5000, 4, 0.1),
}


def values(sums: Moments) -> tuple[float, ...]:
    return (sums.requests, sums.draft_tokens, sums.accepted_tokens, sums.draft_squared, sums.accepted_squared,
            sums.product)


def test_the_promql_builder_gives_core_dispersion_s_numbers(tmp_path: Path) -> None:
    promtool = require_tool(promtool_binary(), "promtool")
    sums = variance.WindowSums(*SERIES)
    expected = {case: dispersion.page_variance(moments, MIN_REQUESTS, CONFIGURED) for case, moments in CASES.items()}
    assert {v.source for v in expected.values()} == {"measured", "assumed"}
    assert expected["identical"].value == 0.25 and expected["identical"].source == "measured"
    page = variance.page_variance(sums, MIN_REQUESTS, "configured")
    bound = variance.upper_bound(sums, MIN_REQUESTS)
    series = [{"series": f'{name}{{case="{case}"}}', "values": f"{value!r}+0x5"}
              for case, moments in CASES.items() for name, value in zip(SERIES, values(moments), strict=True)]
    series += [{"series": f'configured{{case="{case}"}}', "values": f"{CONFIGURED!r}+0x5"} for case in CASES]
    series += [{"series": f'expected{{case="{case}"}}', "values": f"{v.value!r}+0x5"} for case, v in expected.items()]
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": f"abs(({page}) - expected) <= bool 1e-9 * expected", "eval_time": "2m",
             "exp_samples": [{"labels": f'{{case="{case}"}}', "value": 1} for case in CASES]},
            {"expr": f"({bound}) * 0 + 1", "eval_time": "2m",
             "exp_samples": [{"labels": f'{{case="{case}"}}', "value": 1} for case, v in expected.items()
                             if v.source == "measured"]},
        ]}]}
    path = tmp_path / "variance.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_too_few_requests_for_any_variance_is_refused() -> None:
    try:
        variance.upper_bound(variance.WindowSums(*SERIES), 1)
    except ValueError as exc:
        assert "min_requests" in str(exc)
    else:
        raise AssertionError("min_requests 1 accepted")
