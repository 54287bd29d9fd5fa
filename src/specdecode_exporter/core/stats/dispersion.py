"""The page's variance per drafted token, measured on the user's traffic (docs/paging.md).

The page's test (core.stats.evidence) needs v: the variance of α̂ times the drafted tokens it is measured over. The
configured v (``Dispersion``) is a bound from assumptions (m drafted tokens per request, sd s of requests' α). Where
per-request results arrive (the request tap), v is measured instead, from five sums over any window's requests:

    v̂ = (ΣA² − 2α̂·ΣAD + α̂²·ΣD²) / ΣD · N / (N − 1),   α̂ = ΣA / ΣD

(D drafted and A accepted tokens of one request, N requests): the requests' squared residuals A − α̂D per drafted
token, so Var(ΣA − αΣD) ≈ v·ΣD, the exact quantity the page's z divides by. N / (N − 1) undoes the residuals'
shrinkage by the fitted α̂ (exact for equal D).

**The bound the page may use.** v̂ is an estimate from N requests; the page needs an upper bound, so a short run of
calm requests does not make it page on noise. A squared residual's spread is not Gaussian: treating v̂ as a scaled
χ² with k = 2(N − 1)/(κ − 1) degrees of freedom (κ the residuals' kurtosis; κ = 3 is Gaussian), the one-sided upper
bound at z is v̂ / c with c = (1 − 2/(9k) − z·√(2/(9k)))³ (Wilson–Hilferty's χ² quantile, which PromQL can write).
``RESIDUAL_KURTOSIS`` is 6: prefix-accepted drafts and requests whose α scatters with sd up to 0.3 have κ ≈ 2.3–3.5
(tests/unit/test_dispersion.py simulates them and checks the bound's coverage). The bound is never below the binomial
floor α̂(1 − α̂) (independent tokens: no traffic scatters less), and without min_requests requests the configured v
stands.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Literal, NamedTuple

from specdecode_exporter.core.stats.evidence import Dispersion

UPPER_BOUND_Z = 1.645  # one-sided 95 %
RESIDUAL_KURTOSIS = 6.0

Source = Literal["measured", "assumed"]


@dataclass(frozen=True, slots=True)
class Moments:
    """Sums over requests: the counters the tap exports, and (for the assumed v's k̄) verification steps."""

    requests: float = 0.0
    draft_tokens: float = 0.0  # Σ D
    accepted_tokens: float = 0.0  # Σ A
    draft_squared: float = 0.0  # Σ D²
    accepted_squared: float = 0.0  # Σ A²
    product: float = 0.0  # Σ A·D
    steps: float = 0.0  # Σ verification steps, of the requests that report them (vLLM; llama.cpp does not)
    stepped_draft_tokens: float = 0.0  # Σ D of those requests: k̄ = stepped_draft_tokens / steps

    def observed(self, drafted: float, accepted: float, steps: float | None) -> Moments:
        """These sums with one more request."""
        stepped = steps if steps is not None and steps > 0 else 0.0
        return Moments(self.requests + 1, self.draft_tokens + drafted, self.accepted_tokens + accepted,
                       self.draft_squared + drafted * drafted, self.accepted_squared + accepted * accepted,
                       self.product + accepted * drafted, self.steps + stepped,
                       self.stepped_draft_tokens + (drafted if stepped else 0.0))

    def __add__(self, other: Moments) -> Moments:
        return Moments(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Moments)))

    def since(self, earlier: Moments) -> Moments:
        """The requests between ``earlier`` and these sums; these whole if any sum went down (the counts restarted)."""
        diff = [getattr(self, f.name) - getattr(earlier, f.name) for f in fields(Moments)]
        return self if any(d < 0 for d in diff) else Moments(*diff)

    @property
    def tokens_per_draft(self) -> float | None:
        """k̄ where the requests reported their verification steps."""
        return self.stepped_draft_tokens / self.steps if self.steps > 0 else None


def variance_per_draft_token(moments: Moments) -> float | None:
    """v̂ (the module's formula); None without two requests and a drafted token."""
    n, drafted = moments.requests, moments.draft_tokens
    if n < 2 or drafted <= 0:
        return None
    alpha = moments.accepted_tokens / drafted
    residuals = moments.accepted_squared - 2 * alpha * moments.product + alpha * alpha * moments.draft_squared
    return max(0.0, residuals) / drafted * n / (n - 1)


def bound_divisor(requests: float, z: float = UPPER_BOUND_Z, kurtosis: float = RESIDUAL_KURTOSIS) -> float | None:
    """c of the module's upper bound v̂ / c for v̂ from ``requests`` requests; None where too few give no bound."""
    if requests < 2:
        return None
    k = 2 * (requests - 1) / (kurtosis - 1)
    base = 1 - 2 / (9 * k) - z * math.sqrt(2 / (9 * k))
    return base**3 if base > 0 else None


def binomial_floor(alpha: float) -> float:
    """α(1 − α): the variance per token of independent tokens, below which no traffic's v lies."""
    return alpha * (1 - alpha)


@dataclass(frozen=True, slots=True)
class Variance:
    """The variance per drafted token the page uses: measured (the upper bound, floored) or assumed (configured)."""

    value: float
    source: Source
    requests: float  # the requests the measurement saw (0 where none did)
    estimate: float | None = None  # v̂ itself, where measured


def page_variance(moments: Moments, min_requests: float, assumed: float) -> Variance:
    """The measured v's upper bound (never below α̂(1 − α̂)) when min_requests requests back it, else ``assumed``
    (the configured bound, Dispersion.variance_per_token)."""
    estimate = variance_per_draft_token(moments)
    divisor = bound_divisor(moments.requests)
    if estimate is None or divisor is None or moments.requests < min_requests:
        return Variance(assumed, "assumed", moments.requests)
    alpha = min(1.0, moments.accepted_tokens / moments.draft_tokens)
    return Variance(max(estimate / divisor, binomial_floor(alpha)), "measured", moments.requests, estimate)


Sums = Mapping[str, Moments]  # by model


@dataclass(frozen=True, slots=True)
class MomentsHistory:
    """The tap's sums as they were at past instants (the sidecar samples them): windows are differences of two. It
    starts with a sample of nothing at the start, so a window longer than the sidecar has run holds every request
    it saw. Samples older than ``keep_s`` go, except the newest of them (the base of the longest window)."""

    keep_s: float
    points: tuple[tuple[float, Sums], ...] = ()

    def recorded(self, now: float, sums: Sums) -> MomentsHistory:
        points = (*self.points, (now, dict(sums)))
        old = [i for i, (t, _) in enumerate(points) if t <= now - self.keep_s]
        return MomentsHistory(self.keep_s, points[old[-1]:] if old else points)

    def window(self, now: float, seconds: float) -> Sums:
        """Each model's requests over the last ``seconds``: the latest sums less those of the newest sample at or
        before the window's start (the oldest, where none is that old)."""
        if not self.points:
            return {}
        latest = self.points[-1][1]
        base = next((sums for t, sums in reversed(self.points) if t <= now - seconds), self.points[0][1])
        return {model: sums.since(base.get(model, Moments())) for model, sums in latest.items()}


class WindowVariance(NamedTuple):
    model: str
    window: str
    variance: Variance


def window_variances(history: MomentsHistory, now: float, windows: Sequence[tuple[str, float]],
                     min_requests: float, assumed: Callable[[Moments], float]) -> list[WindowVariance]:
    """The page's v per model and window (``assumed``: the configured bound for some sums, from their k̄: the
    window's, else, where its requests reported no steps, all the model's requests since the start)."""
    out = []
    latest = history.points[-1][1] if history.points else {}
    for name, seconds in windows:
        for model, sums in sorted(history.window(now, seconds).items()):
            configured = assumed(sums if sums.steps > 0 else latest[model])
            out.append(WindowVariance(model, name, page_variance(sums, min_requests, configured)))
    return out


def assumed_variance(configured: Dispersion, sums: Moments) -> float:
    """The configured bound v = k̄(¼ − s²) + m·s² for these requests: k̄ from their verification steps, else m (the
    bound for a request whose tokens all fall together, as the page's rules take it without a drafts counter)."""
    return configured.variance_per_token(sums.tokens_per_draft or configured.tokens_per_request)
