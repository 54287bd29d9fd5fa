"""bench/paging_variance.py measures the right thing: the tap's simulated sums have the traffic's moments, the
measured page differs from the generated one only in its variance, and the series it reads is core.stats.dispersion's
bound over the window's requests. Correctness only; the figures are the bench's."""

from __future__ import annotations

import numpy as np
import pytest

from bench import paging, paging_variance
from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.stats import dispersion
from specdecode_exporter.core.stats.dispersion import Moments
from specdecode_exporter.monitoring import rules


def test_the_tap_s_sums_have_the_traffic_s_moments() -> None:
    """Σ A and Σ A² per bin, small bins drawn exactly and large ones in the bivariate normal limit: per request
    their means are E[A] and E[A²] of the request's distribution."""
    traffic = paging.Traffic(request_sd=0.3, tap=True)
    pmf = paging.request_pmf(paging.NEAR, traffic)
    values = np.arange(pmf.size, dtype=np.float64)
    rng = np.random.default_rng(5)
    for per_bin in (3, 400):
        requests = np.full(2000, per_bin, dtype=np.int64)
        total, squared = paging.accepted_sums_in_bins(requests, paging.NEAR, traffic, rng)
        assert total.sum() / requests.sum() == pytest.approx(float(pmf @ values), rel=0.01)
        assert squared.sum() / requests.sum() == pytest.approx(float(pmf @ values**2), rel=0.01)
    # v of those requests: Var(A) / D, what the table states as the true v
    v = paging_variance.true_variance(paging.NEAR, traffic)
    assert v == pytest.approx(float(pmf @ values**2 - (pmf @ values) ** 2) / 30)


def test_the_measured_page_changes_only_the_variance() -> None:
    cfg = monitoring_config.shipped()
    fixed, measured = paging.generated_page(cfg), paging_variance.measured_page(cfg)
    assert measured.expr.count(paging_variance.VARIANCE_SERIES) == len(cfg.statistics.page_windows)
    assert (measured.holds, measured.hold_s, measured.step_s) == (fixed.holds, fixed.hold_s, fixed.step_s)
    # The generated page reads the rules' own measured bound where it has one; the bench's page reads its series there.
    assert paging_variance.VARIANCE_SERIES not in fixed.expr and measured.expr != fixed.expr


def test_the_series_is_core_dispersion_s_bound_over_the_window() -> None:
    """Two pods' counters, one restarting: the window's sums count across the restart, and the series holds the
    bound only where min_requests requests back it."""
    times = np.arange(0.0, 7200.0, 15.0)
    rng = np.random.default_rng(9)
    pods = []
    for pod in range(2):
        requests = rng.poisson(1.0, times.size).astype(np.float64)
        accepted = rng.binomial((requests * 30).astype(np.int64), 0.55).astype(np.float64)
        totals = {m.REQUESTS.exposed_name: requests, m.REQUEST_DRAFT_TOKENS.exposed_name: requests * 30,
                  m.REQUEST_ACCEPTED_TOKENS.exposed_name: accepted,
                  m.REQUEST_DRAFT_TOKENS_SQUARED.exposed_name: requests * 900,
                  m.REQUEST_ACCEPTED_TOKENS_SQUARED.exposed_name: accepted**2,
                  m.REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT.exposed_name: accepted * 30}
        values = {name: np.cumsum(v) for name, v in totals.items()}
        if pod == 1:  # a restart at 1 h: counts from 0 again
            cut = times.size // 2
            values = {name: np.concatenate([v[:cut], v[cut:] - v[cut - 1]]) for name, v in values.items()}
        pods.append((paging.PodSeries(pod, times + 2.0 + 7 * pod, values), totals))
    at, found = paging_variance.variance_series([p for p, _ in pods], 7200.0 / paging.DAY, 15.0, 3600.0, 20)
    assert at.size > 0 and at.min() >= 15.0
    i = int(np.flatnonzero(at == 5400.0)[0])
    sums = Moments(*(sum(float(t[name][(times + 2.0 + 7 * p > 1800.0) & (times + 2.0 + 7 * p <= 5400.0)].sum())
                         for p, (_, t) in enumerate(pods))
                     for name in (spec.exposed_name for spec in paging_variance.SUMS)))
    assert found[i] > 0.25
    assert found[i] == pytest.approx(dispersion.page_variance(sums, 20, 0.0).value)


def test_the_fixed_page_reads_no_measured_variance_and_the_generated_page_reads_it_recorded() -> None:
    """The bench's fixed page is the page without per-request data; the generated page reads the rules' measured
    bound as a recorded series (paging.record_passes writes it after the stage and the tap's sums), never inlined."""
    cfg = monitoring_config.shipped()
    bound = rules.variance_record(cfg, "bound")
    assert bound not in paging_variance.fixed_page(cfg).expr
    assert paging.generated_page(cfg).expr.count(bound) == len(cfg.statistics.page_windows)
    assert bound in paging.recorded_names(cfg) and bound not in paging.inlined_records(cfg)
    page = paging.generated_page(cfg)
    passes = dict(paging.passes_read(cfg, "\n".join(page.expressions)))
    [bound_group] = passes["bound"]
    assert [r["record"] for r in bound_group["rules"]] == [bound]
    # The bound reads the variance's estimate, α and divisor as recorded 10 minutes back (an offset on an inlined
    # expression would not parse); they read the tap's six sums over the hour, recorded before them, and those read
    # the stage's records.
    steps = {r["record"] for g in passes["variance"] for r in g["rules"]}
    assert steps == {rules.variance_record(cfg, "estimate", rules.VARIANCE_WINDOW),
                     rules.tapped_alpha_record(cfg, rules.VARIANCE_WINDOW),
                     rules.bound_divisor_record(cfg, rules.VARIANCE_WINDOW)}
    assert all(f"{name} offset {rules.VARIANCE_OFFSET}" in bound_group["rules"][0]["expr"] for name in steps)
    sums = {r["record"] for g in passes["sums"] for r in g["rules"]}
    assert sums == {rules.tapped_sum_record(cfg, key, rules.VARIANCE_WINDOW) for key in rules.TAPPED_SUMS}
    assert all(any(name in r["expr"] for name in sums) for g in passes["variance"] for r in g["rules"])
    staged = {r["record"] for g in passes["stage"] for r in g["rules"]}
    assert all(any(name in r["expr"] for name in staged) for g in passes["sums"] for r in g["rules"])
