"""The page's variance per drafted token in PromQL: the rules' side of core.stats.dispersion.

Given PromQL for a window's sums (each aggregated to the same labels, e.g. ``sum by (namespace, model_name)``): the
requests N, ΣD, ΣA, ΣD², ΣA², ΣAD, these build

* ``estimate``: v̂ = (ΣA² − 2α̂ΣAD + α̂²ΣD²)/ΣD · N/(N − 1), α̂ = ΣA/ΣD;
* ``upper_bound``: v̂ / c, c = (1 − 2/(9k) − z√(2/(9k)))³, k = 2(N − 1)/(κ − 1), only where N ≥ min_requests, ΣD > 0
  and c's base is positive; never below α̂(1 − α̂). ``bound_of`` is the same from series of v̂, c and α̂ (the rules
  record them first, so that the bound reads them by name);
* ``page_variance``: the upper bound where it exists, else the configured variance (``configured``, a vector with
  the same labels: `or` fills in the label sets the measurement does not cover).

The same numbers as core.stats.dispersion.page_variance (tests/rules/test_variance_promtool.py evaluates both).
"""

from __future__ import annotations

from typing import NamedTuple

from specdecode_exporter.core.stats.dispersion import RESIDUAL_KURTOSIS, UPPER_BOUND_Z
from specdecode_exporter.monitoring.promql import fmt_num


class WindowSums(NamedTuple):
    """PromQL for one window's sums, all with the same labels."""

    requests: str  # N
    draft_tokens: str  # Σ D
    accepted_tokens: str  # Σ A
    draft_squared: str  # Σ D²
    accepted_squared: str  # Σ A²
    product: str  # Σ A·D


def _p(expr: str) -> str:
    return f"({expr})"


def alpha(sums: WindowSums) -> str:
    """α̂ = ΣA / ΣD, absent where nothing was drafted."""
    return f"{_p(sums.accepted_tokens)}\n/\n({sums.draft_tokens} > 0)"


def estimate(sums: WindowSums) -> str:
    """v̂: absent where nothing was drafted or fewer than two requests."""
    a = _p(alpha(sums))
    residuals = (f"{_p(sums.accepted_squared)}\n- 2 * {a} * {_p(sums.product)}\n"
                 f"+ {a} ^ 2 * {_p(sums.draft_squared)}")
    n = _p(sums.requests)
    return (f"clamp_min(\n{residuals}\n, 0)\n/\n({sums.draft_tokens} > 0)\n* {n}\n/\n({sums.requests} - 1 > 0)")


def bound_divisor(requests: str, z: float = UPPER_BOUND_Z, kurtosis: float = RESIDUAL_KURTOSIS) -> str:
    """c of the upper bound, for N requests; absent where its base is not positive (too few requests)."""
    k = f"(2 * ({requests} - 1) / {fmt_num(kurtosis - 1)})"
    base = f"(\n  1\n  - 2 / (9 * {k})\n  - {fmt_num(z)} * sqrt(2 / (9 * {k}))\n)"
    return f"({base} > 0) ^ 3"


def backed_divisor(requests: str, min_requests: float, z: float = UPPER_BOUND_Z,
                   kurtosis: float = RESIDUAL_KURTOSIS) -> str:
    """c where min_requests requests back the bound; absent elsewhere."""
    if min_requests < 2:
        raise ValueError("a variance needs min_requests of at least 2")
    return f"{bound_divisor(_p(requests), z, kurtosis)}\nand\n{requests} >= {fmt_num(min_requests)}"


def bound_of(estimated: str, divisor: str, alpha_hat: str) -> str:
    """The upper bound v̂ / c of the estimate ``estimated`` (v̂), floored at α̂(1 − α̂) (``alpha_hat``); absent where
    the divisor is (backed_divisor)."""
    bound = f"{_p(estimated)}\n/ {_p(divisor)}" if "\n" not in divisor else f"{_p(estimated)}\n/ (\n{divisor}\n)"
    a = _p(alpha_hat)
    floor = f"{a} * (1 - {a})"
    # max(bound, floor) where the bound exists: the bound where it is the larger, else the floor (and only there).
    return f"(\n{bound}\n>= {floor}\n)\nor\n(\n{floor}\nand\n{bound}\n)"


def upper_bound(sums: WindowSums, min_requests: float, z: float = UPPER_BOUND_Z,
                kurtosis: float = RESIDUAL_KURTOSIS) -> str:
    """v̂'s upper bound, floored at α̂(1 − α̂); absent without min_requests requests (or a drafted token)."""
    return bound_of(estimate(sums), backed_divisor(sums.requests, min_requests, z, kurtosis), alpha(sums))


def page_variance(sums: WindowSums, min_requests: float, configured: str, z: float = UPPER_BOUND_Z,
                  kurtosis: float = RESIDUAL_KURTOSIS) -> str:
    """The variance the page divides by: the measured upper bound, else ``configured`` (same labels)."""
    return f"(\n{upper_bound(sums, min_requests, z, kurtosis)}\n)\nor\n(\n{configured}\n)"
