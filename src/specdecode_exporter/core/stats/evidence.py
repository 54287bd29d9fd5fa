"""What a window of counters proves: the statistics behind every alert on a ratio (docs/paging.md).

An alert on a ratio is a one-sided test. Over a window it sees D drafted tokens of which A were accepted, and asks
whether the data rule out the ratio being at its null (the threshold, or for the page the threshold plus a margin):

    z = (null − A/D) · √(D / v)  >  z*

**What one token is worth (v).** Tokens are not independent draws: the k̄ tokens of one draft are verified together
(a rejection ends the accepted prefix) and the m tokens of one request share its prompt, temperature and task, so the
requests' acceptance rates scatter around the model's α (sd s). The variance of α̂ per drafted token is at most

    v = k̄ · (¼ − s²)  +  m · s²

(within a request: each draft's accepted count lies in [0, k̄], so its variance is at most k̄²·p(1 − p), and
E[p(1 − p)] ≤ ¼ − s²; between requests: m² s² per request of m tokens). k̄ = draft tokens / drafts comes from the
counters; m and s from the monitoring config. Binomial counting (v = α(1 − α)) would take a window of 30-token
requests for 5 to 7 times the evidence it holds, and page on noise.

**How far over is proof (z*).** The test runs at every rule evaluation, on a moving window, for ever; what a
budget of false alarms bounds is the number of times it *newly* crosses z* while the null holds. For a moving window
of length W evaluated every e, consecutive z's are Gaussian with correlation ρ = 1 − e/W, and the expected number of
new crossings in a horizon L is exactly (L / e) · P(z_t > z*, z_{t−e} ≤ z*). ``critical_z`` solves that for z*; a
budget shared by several windows is split between them (a union bound, so the total stays within it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

HORIZON_S = 30 * 86400.0  # budgets are per 30 days
_NORMAL = NormalDist()


@dataclass(frozen=True, slots=True)
class Dispersion:
    """How overdispersed acceptance is: the config's drafted tokens per request (m) and the sd of requests'
    acceptance around the model's α (s)."""

    tokens_per_request: float
    request_sd: float

    @property
    def per_draft_token(self) -> float:
        """v's coefficient of k̄ (tokens per draft): the within-request part, ¼ − s²."""
        return 0.25 - self.request_sd**2

    @property
    def per_request(self) -> float:
        """v's constant part: m · s², the spread between requests."""
        return self.tokens_per_request * self.request_sd**2

    def variance_per_token(self, tokens_per_draft: float) -> float:
        """v: the variance of α̂ times the drafted tokens it is measured over."""
        return tokens_per_draft * self.per_draft_token + self.per_request


def crossing_probability(z: float, rho: float) -> float:
    """P(X > z, Y ≤ z) for standard normal X, Y with correlation ``rho``: a test that was not over z one
    evaluation ago and is now."""
    if rho <= 0:
        return (1 - _NORMAL.cdf(z)) * _NORMAL.cdf(z)
    rho = min(rho, 1 - 1e-12)
    spread = math.sqrt(1 - rho * rho)

    def f(x: float) -> float:
        return _NORMAL.pdf(x) * _NORMAL.cdf((z - rho * x) / spread)

    # ∫_z^∞ φ(x) Φ((z − ρx)/√(1 − ρ²)) dx by Simpson's rule: the Φ factor falls from ½ to 0 within a few
    # √(1 − ρ²)/ρ of z, so that stretch gets a grid of its own; φ is negligible beyond z + 12.
    edge = min(z + 12.0, z + 12.0 * spread / rho)
    return _simpson(f, z, edge) + (_simpson(f, edge, z + 12.0) if edge < z + 12.0 else 0.0)


def _simpson(f: Callable[[float], float], low: float, high: float, steps: int = 200) -> float:
    h = (high - low) / steps
    inner = sum((4 if i % 2 else 2) * f(low + i * h) for i in range(1, steps))
    return h / 3 * (f(low) + f(high) + inner)


def expected_crossings(z: float, window_s: float, evaluation_s: float, horizon_s: float = HORIZON_S) -> float:
    """New crossings of z per horizon by a moving-window test evaluated every ``evaluation_s``, under the null."""
    return horizon_s / evaluation_s * crossing_probability(z, 1 - evaluation_s / window_s)


def critical_z(alarms: float, window_s: float, evaluation_s: float, horizon_s: float = HORIZON_S) -> float:
    """The z* at which a moving-window test evaluated every ``evaluation_s`` newly crosses ``alarms`` times per
    horizon on average while its null holds."""
    if alarms <= 0:
        raise ValueError("alarms must be above 0")
    low, high = 0.0, 12.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_crossings(mid, window_s, evaluation_s, horizon_s) > alarms:
            low = mid
        else:
            high = mid
    return high
