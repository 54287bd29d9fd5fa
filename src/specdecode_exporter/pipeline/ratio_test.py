"""One-sided tests of a ratio of sums against a threshold, counting requests, not tokens, as the independent units.

α over n requests is the ratio estimator α̂ = Σ accepted_i / Σ drafted_i. The tokens of one request are not
independent draws: a request's drafts all follow its own prompt and sampling, so acceptance varies far more between
requests than binomial sampling of tokens allows (overdispersion). A binomial standard error over tokens would be
several times too small and would route (or page) on noise. The variance here comes from the spread of the
requests themselves: the linearisation (cluster-robust) variance of a ratio estimator,

    Var(α̂) ≈ n / (n − 1) · Σ (accepted_i − α̂ · drafted_i)² / (Σ drafted_i)²,

which grows with the between-request spread whatever causes it. The two tests compare a one-sided confidence bound
with the threshold, t(p, n − 1) being Student's quantile for n − 1 degrees of freedom (blocks are small: the normal
quantile would test at about 1.5 % where 1 % is meant):

    below: α̂ + t(p, n − 1) · SE < threshold      rejects "α ≥ threshold" at level p
    above: α̂ − t(p, n − 1) · SE > threshold      rejects "α ≤ threshold" at level p

For a class whose true α is exactly the threshold each test says yes with probability about p; further from the
threshold, much less (docs/routing.md has the rates measured by simulation with overdispersed requests).

`decide` is the routing decision built on them (a hysteresis by construction: a class is routed only when its α is
shown below the threshold and brought back only when shown above it; in between it stays as it is).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import NamedTuple

ROUTE_LEVEL = 0.01  # the chance that one block of requests of a class exactly at break-even is routed
RETURN_LEVEL = 0.01  # the chance that one canary block of a class exactly at break-even brings it back


class RatioSums(NamedTuple):
    """Running sums over requests of a denominator x (drafted tokens) and a numerator y (accepted tokens)."""

    n: int = 0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    yy: float = 0.0
    xy: float = 0.0

    def added(self, x: float, y: float) -> RatioSums:
        return RatioSums(self.n + 1, self.x + x, self.y + y, self.xx + x * x, self.yy + y * y, self.xy + x * y)


class RatioEstimate(NamedTuple):
    ratio: float
    standard_error: float
    n: int

    def upper(self, level: float) -> float:
        """The one-sided upper confidence bound at ``level``."""
        return self.ratio + t_score(level, self.n - 1) * self.standard_error

    def lower(self, level: float) -> float:
        return self.ratio - t_score(level, self.n - 1) * self.standard_error


def z_score(level: float) -> float:
    """z with P(Z > z) = level."""
    return NormalDist().inv_cdf(1.0 - level)


def t_score(level: float, degrees: int) -> float:
    """Student's t with P(T > t) = level for ``degrees`` of freedom, by the Cornish-Fisher expansion of the normal
    quantile (within 0.1 % of the exact quantile from 10 degrees of freedom at the levels used here)."""
    z = z_score(level)
    v = float(max(1, degrees))
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3))


def estimate(sums: RatioSums) -> RatioEstimate | None:
    """Σy/Σx and its request-level standard error; None with fewer than 2 requests or nothing in Σx."""
    if sums.n < 2 or sums.x <= 0:
        return None
    ratio = sums.y / sums.x
    residual = max(0.0, sums.yy - 2.0 * ratio * sums.xy + ratio * ratio * sums.xx)
    variance = sums.n / (sums.n - 1) * residual / (sums.x * sums.x)
    return RatioEstimate(ratio, math.sqrt(variance), sums.n)


def below(found: RatioEstimate, threshold: float, level: float = ROUTE_LEVEL) -> bool:
    """The evidence says the ratio is below ``threshold`` (its upper bound is)."""
    return found.upper(level) < threshold


def above(found: RatioEstimate, threshold: float, level: float = RETURN_LEVEL) -> bool:
    """The evidence says the ratio is above ``threshold`` (its lower bound is)."""
    return found.lower(level) > threshold


def decide(routed: bool, sums: RatioSums, threshold: float | None, min_requests: int) -> bool:
    """Whether a class is routed after a block of evidence: ``sums`` over at least ``min_requests`` requests
    served with speculative decoding (all of the class's while unrouted, the canary's while routed). Without a
    threshold, or without enough evidence, the class stays as it is."""
    found = estimate(sums) if sums.n >= max(2, min_requests) else None
    if threshold is None or found is None:
        return routed
    if routed:
        return not above(found, threshold)
    return below(found, threshold)
