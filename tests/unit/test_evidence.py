"""core.stats.evidence: the false-alarm arithmetic of every alert on a ratio, checked against simulation."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from specdecode_exporter.core.stats.evidence import (
    HORIZON_S,
    Dispersion,
    critical_z,
    crossing_probability,
    expected_crossings,
)


def test_crossing_probability_limits() -> None:
    normal = NormalDist()
    # Independent evaluations: over now, not over before.
    assert crossing_probability(2.0, 0.0) == pytest.approx((1 - normal.cdf(2.0)) * normal.cdf(2.0))
    # The closer consecutive evaluations, the rarer a new crossing: it falls like √(1 − ρ).
    values = [crossing_probability(3.0, rho) for rho in (0.0, 0.5, 0.9, 0.99, 0.9999)]
    assert values == sorted(values, reverse=True) and values[-1] < 0.03 * values[0]


@pytest.mark.parametrize(("window", "stride"), [(40, 10), (400, 100), (400, 10)])
def test_expected_crossings_match_a_moving_window_of_noise(window: int, stride: int) -> None:
    """Standardised moving sums of white noise, looked at every ``stride`` steps: the new crossings of z counted in
    simulation are what expected_crossings says (the Gaussian the tests assume, exactly)."""
    rng = np.random.default_rng(7)
    steps, z = 4_000_000, 2.5
    cumulative = np.concatenate([[0.0], np.cumsum(rng.standard_normal(steps))])
    statistic = (cumulative[window:] - cumulative[:-window]) / np.sqrt(window)
    over = statistic[::stride] > z
    counted = int(np.sum(over[1:] & ~over[:-1]))
    predicted = expected_crossings(z, window, stride, horizon_s=over.size * stride)
    assert counted == pytest.approx(predicted, rel=0.1), (counted, predicted)


def test_critical_z_inverts_the_budget() -> None:
    for alarms, window, every in ((1.0, 120.0, 15.0), (0.2, 7200.0, 15.0), (3.0, 600.0, 60.0)):
        z = critical_z(alarms, window, every)
        assert expected_crossings(z, window, every) == pytest.approx(alarms, rel=1e-3)
    # More evaluations per window (or a smaller budget) ask for more; a longer window's evaluations overlap more.
    assert critical_z(1.0, 120.0, 15.0) > critical_z(1.0, 120.0, 60.0)
    assert critical_z(0.1, 120.0, 15.0) > critical_z(1.0, 120.0, 15.0)
    assert critical_z(1.0, 7200.0, 15.0) < critical_z(1.0, 120.0, 15.0)
    with pytest.raises(ValueError):
        critical_z(0.0, 120.0, 15.0)
    assert HORIZON_S == 30 * 86400


def test_variance_per_token_bounds_overdispersed_requests() -> None:
    """v = k̄(¼ − s²) + m·s² is at least the variance of α̂ per drafted token for requests of m tokens in drafts of
    k̄ whose acceptance probability has sd s, whatever happens within a draft: checked for all-or-nothing drafts (the
    worst case, where it is exact at α = ½) and independent tokens."""
    rng = np.random.default_rng(3)
    m, k, s, alpha = 30, 3, 0.2, 0.5
    scale = alpha * (1 - alpha) / s**2 - 1
    p = rng.beta(alpha * scale, (1 - alpha) * scale, 200_000)
    all_or_nothing = (rng.random((p.size, m // k)) < p[:, None]).sum(axis=1) * k
    independent = (rng.random((p.size, m)) < p[:, None]).sum(axis=1)
    bound = Dispersion(m, s).variance_per_token(k)
    assert bound == pytest.approx(k * (0.25 - s**2) + m * s**2)
    assert np.var(all_or_nothing) / m == pytest.approx(bound, rel=0.02)
    assert np.var(independent) / m < bound
