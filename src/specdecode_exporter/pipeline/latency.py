"""Pure functions for latency: cumulative histograms made reset-safe, a window's change of one, its mean and
quantiles (the same interpolation as Prometheus' histogram_quantile), and what a baseline makes of them: the
observed speedup and the cost that calibrates the break-even model to it.

Every function returns None when its inputs cannot support an answer (no requests in the window, no baseline).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from array import array
from collections.abc import Iterable, Sequence
from statistics import NormalDist
from typing import NamedTuple

TPOT_QUANTILES = (0.5, 0.9, 0.99)
TTFT_QUANTILES = (0.5, 0.99)
_ONES = itertools.repeat(1)  # endless: map() stops at the counts' end


class Histogram(NamedTuple):
    """A cumulative histogram as exposed: upper bounds (+Inf last), cumulative counts per bound, and the sum."""

    bounds: tuple[float, ...]
    counts: Sequence[float]
    total: float

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> Histogram:
        """No observations yet over ``bounds`` (+Inf added)."""
        return cls((*bounds, math.inf), (0,) * (len(bounds) + 1), 0.0)

    def observed(self, value: float) -> Histogram:
        """This histogram with one more observation (a new one: a scrape may hold this one)."""
        first = bisect.bisect_left(self.bounds, value)
        return Histogram(self.bounds, (*self.counts[:first], *map(operator.add, self.counts[first:], _ONES)),
                         self.total + value)

    @property
    def observations(self) -> float:
        return self.counts[-1] if self.counts else 0.0


def monotonic(counts: Iterable[float]) -> list[float]:
    """Cumulative counts made non-decreasing (float error or a torn scrape can break it; Prometheus mends it
    the same way before interpolating)."""
    values = list(counts)
    # Nearly always they are already: sorted() on a sorted list is n − 1 float comparisons in C, where the running
    # max calls max() per bucket. The sum is finite only without NaN or ±Inf (which the running max treats apart).
    if values and values[0] >= 0.0 and values == sorted(values) and math.isfinite(sum(values)):
        zeros = bisect.bisect_right(values, 0.0)  # sorted from ≥ 0: the leading zeros, found in C
        if zeros:
            values[:zeros] = [0.0] * zeros  # -0.0 as the running max from 0.0 gives it
        return values
    out = list(itertools.accumulate(values, max, initial=0.0))  # a running max from 0, at C speed
    del out[0]
    return out


def accumulate(totals: Histogram | None, previous: Histogram | None, current: Histogram,
               restarted: bool) -> Histogram:
    """Reset-safe totals after one more reading (Prometheus' rate() rules per bucket and for the sum). New
    bucket bounds are a new histogram: its totals start again from the reading."""
    if totals is None or previous is None or totals.bounds != current.bounds or previous.bounds != current.bounds:
        return Histogram(current.bounds, array("d", current.counts), current.total)
    restarted = restarted or current.observations < previous.observations
    # map(operator…) rather than generators: this runs per histogram per collection (the bounds are equal, so
    # the counts are as long); (t + c) - p keeps the float order a generator had.
    if restarted:
        counts = array("d", map(operator.add, totals.counts, current.counts))
        return Histogram(current.bounds, counts, totals.total + current.total)
    counts = array("d", map(operator.sub, map(operator.add, totals.counts, current.counts), previous.counts))
    return Histogram(current.bounds, counts, totals.total + max(0.0, current.total - previous.total))


def same_histogram(start: Histogram, end: Histogram) -> bool:
    """Whether two readings are of one histogram, so that a window's change of it is defined."""
    return (start.bounds is end.bounds or start.bounds == end.bounds) and len(start.counts) == len(end.counts)


def defined(start: Histogram | None, end: Histogram | None) -> bool:
    """Whether a window's change from ``start`` to ``end`` is defined (Change.between is not None)."""
    return start is not None and end is not None and same_histogram(start, end)


def change(start: Histogram | None, end: Histogram | None) -> Histogram | None:
    """What a window added to the histogram, or None when the ends are not the same histogram."""
    window = Change.between(start, end)
    return window.histogram if window is not None else None


def _difference(start: Histogram, end: Histogram) -> Histogram:
    # Clamping each difference at 0 and then taking the running max is the running max from 0 of the differences.
    counts = monotonic(map(operator.sub, end.counts, start.counts))
    added = end.total - start.total
    return Histogram(end.bounds, counts, added if added > 0.0 else 0.0)  # max(0.0, added), without the call


class Change:
    """What a window added to a histogram (change()), worked out when first read. Every collection views each
    series over each window, but only a render, the status API, the history's first window or a baseline reads
    the buckets, and scrapes are rarer than collections: a 1 MB target has 640 of these per collection."""

    __slots__ = ("_end", "_histogram", "_start")

    def __init__(self, start: Histogram, end: Histogram, histogram: Histogram | None = None) -> None:
        """``start`` and ``end`` are readings of the same histogram (same_histogram); ``histogram``, their
        difference where it is known already."""
        self._start, self._end, self._histogram = start, end, histogram

    @classmethod
    def between(cls, start: Histogram | None, end: Histogram | None) -> Change | None:
        """The change from ``start`` to ``end``; None when they are not the same histogram."""
        if start is None or end is None or not same_histogram(start, end):
            return None
        return cls(start, end)

    @classmethod
    def known(cls, histogram: Histogram) -> Change:
        """A change already worked out (from no observations to ``histogram``)."""
        return cls(Histogram(histogram.bounds, (0.0,) * len(histogram.counts), 0.0), histogram, histogram)

    @property
    def histogram(self) -> Histogram:
        # Pure and idempotent: two readers that race both get the same histogram.
        histogram = self._histogram
        if histogram is None:
            histogram = self._histogram = _difference(self._start, self._end)
        return histogram

    def __eq__(self, other: object) -> bool:
        """Equal changes are equal histograms, however they were worked out."""
        return isinstance(other, Change) and self.histogram == other.histogram

    __hash__ = None  # type: ignore[assignment]  # as a Histogram's counts, unhashable

    def __repr__(self) -> str:
        return f"Change({self.histogram!r})"


def pooled(histograms: Sequence[Histogram]) -> Histogram | None:
    """Several series' window changes as one (engines of a model): bucket by bucket, when they share bounds."""
    if not histograms or any(h.bounds != histograms[0].bounds for h in histograms):
        return None
    counts = [sum(column) for column in zip(*(h.counts for h in histograms), strict=True)]
    return Histogram(histograms[0].bounds, counts, sum(h.total for h in histograms))


def mean(histogram: Histogram | None) -> float | None:
    """Exact mean from _sum / _count."""
    if histogram is None or histogram.observations <= 0:
        return None
    return histogram.total / histogram.observations


def quantile(q: float, histogram: Histogram | None) -> float | None:
    """The q-quantile by linear interpolation within its bucket, as Prometheus' histogram_quantile computes it
    (the lowest bucket starts at 0; a rank in the +Inf bucket gives the highest finite bound)."""
    if histogram is None or histogram.observations <= 0 or len(histogram.bounds) < 2:
        return None
    counts, bounds = histogram.counts, histogram.bounds
    rank = q * counts[-1]
    index = next(i for i, count in enumerate(counts) if count >= rank or i == len(counts) - 1)
    if index == len(bounds) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if index == 0 else bounds[index - 1]
    below = 0.0 if index == 0 else counts[index - 1]
    in_bucket = counts[index] - below
    if in_bucket <= 0:
        return bounds[index]
    # Parenthesised as Prometheus' bucketQuantile computes it, so both round alike (bit-identical results).
    return start + (bounds[index] - start) * ((rank - below) / in_bucket)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


class LatencyStats(NamedTuple):
    """One series' latency over one window."""

    tpot_change: Change | None  # the window's change of vLLM's per-request TPOT histogram
    ttft_change: Change | None
    running: float | None  # mean requests running over the window
    waiting: float | None

    @property
    def time_per_output_token(self) -> Histogram | None:
        return self.tpot_change.histogram if self.tpot_change is not None else None

    @property
    def time_to_first_token(self) -> Histogram | None:
        return self.ttft_change.histogram if self.ttft_change is not None else None

    @property
    def tpot_mean(self) -> float | None:
        return mean(self.time_per_output_token)

    def tpot(self, q: float) -> float | None:
        return quantile(q, self.time_per_output_token)

    def ttft(self, q: float) -> float | None:
        return quantile(q, self.time_to_first_token)

    @property
    def requests(self) -> float:
        return self.time_per_output_token.observations if self.time_per_output_token else 0.0


class BaselineLatency(NamedTuple):
    """What spec decode is compared with: TPOT without it (mean; quantiles where known)."""

    mean: float | None
    p50: float | None
    p99: float | None
    source: str  # in words: 'the control target "vllm-nospec"', "the measured baseline"


class ObservedSpeedup(NamedTuple):
    mean: float | None  # baseline TPOT / current TPOT, exact means
    p50: float | None
    p99: float | None
    baseline: str


def observed_speedup(baseline: BaselineLatency, current: LatencyStats) -> ObservedSpeedup | None:
    """Baseline TPOT / current TPOT: above 1 spec decode makes tokens come faster. None without requests."""
    speedup = ratio(baseline.mean, current.tpot_mean)
    if speedup is None:
        return None
    return ObservedSpeedup(speedup, ratio(baseline.p50, current.tpot(0.5)), ratio(baseline.p99, current.tpot(0.99)),
                           baseline.source)


def calibrated_cost(observed: float | None, mean_length: float | None, draft_length: float | None) -> float | None:
    """The cost per drafted token c for which the model S = L / (1 + k̄·c) gives the observed speedup:
    c = (L / S − 1) / k̄. Below 0 (faster than the model can be) is reported as 0."""
    if observed is None or mean_length is None or not draft_length or observed <= 0:
        return None
    return max(0.0, (mean_length / observed - 1.0) / draft_length)



class MeanSums(NamedTuple):
    """Running count, sum and sum of squares of one measure (a latency) over requests."""

    n: int = 0
    total: float = 0.0
    squares: float = 0.0

    def added(self, value: float) -> MeanSums:
        return MeanSums(self.n + 1, self.total + value, self.squares + value * value)

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None

    @property
    def variance(self) -> float | None:
        """The sample variance (n − 1); None below two values."""
        if self.n < 2:
            return None
        return max(0.0, (self.squares - self.total * self.total / self.n) / (self.n - 1))


class MeasuredSpeedup(NamedTuple):
    """mean latency without speculative decoding / mean latency with it, and a two-sided confidence interval."""

    speedup: float
    lower: float
    upper: float


def measured_speedup(without: MeanSums, with_spec: MeanSums, level: float = 0.05) -> MeasuredSpeedup | None:
    """The ratio of two independent means (two arms of a randomized split), with its interval at ``level`` from
    the delta method on the log ratio: Var(log mean) ≈ s² / (n · mean²) per arm. None unless both arms have two
    values and positive means."""
    variances = without.variance, with_spec.variance
    slow, fast = without.mean, with_spec.mean
    if variances[0] is None or variances[1] is None or not slow or not fast or slow <= 0 or fast <= 0:
        return None
    spread = math.sqrt(variances[0] / (without.n * slow * slow) + variances[1] / (with_spec.n * fast * fast))
    z = NormalDist().inv_cdf(1.0 - level / 2)
    speedup = slow / fast
    return MeasuredSpeedup(speedup, speedup * math.exp(-z * spread), speedup * math.exp(z * spread))
