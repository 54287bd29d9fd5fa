"""Counts by batch size: each collection interval's drafts, drafted tokens and per-position acceptance go to the
batch-size range (metrics.BATCH_SIZE_RANGES) of the interval's mean running batch, with the time spent there. A
window's change of these cumulative bins says how acceptance and time split over batch sizes; the schedule advice
(pipeline.schedule) reads it."""

from __future__ import annotations

import bisect
import operator
from typing import NamedTuple

from specdecode_exporter.core.contract.metrics import BATCH_SIZE_RANGES

_HIGHS = tuple(high for _, high in BATCH_SIZE_RANGES)


class BatchBin(NamedTuple):
    """Cumulative counts of the intervals whose mean running batch fell in one range."""

    seconds: float = 0.0
    running_seconds: float = 0.0  # ∫ running dt over those intervals: their mean batch is this / seconds
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_by_position: tuple[float, ...] = ()

    @property
    def mean_batch(self) -> float | None:
        return self.running_seconds / self.seconds if self.seconds > 0 else None


NO_BINS: tuple[BatchBin, ...] = tuple(BatchBin() for _ in BATCH_SIZE_RANGES)


def range_index(batch: float) -> int:
    """The range of a mean running batch: below 1 counts as 1 (an engine that drafted ran at least one request),
    above the last range's top as the last range."""
    return min(bisect.bisect_left(_HIGHS, max(1.0, batch)), len(_HIGHS) - 1)


def _add_positions(total: tuple[float, ...], more: tuple[float, ...]) -> tuple[float, ...]:
    if len(total) == len(more):
        return tuple(map(operator.add, total, more))
    # k changed: this bin's curve starts again (the window difference of a bin with another k is dropped)
    return more


class Interval(NamedTuple):
    """One collection interval: how long, its mean running batch, and what it added to the counters."""

    seconds: float
    running: float
    drafts: float
    draft_tokens: float
    accepted_by_position: tuple[float, ...]


def binned(bins: tuple[BatchBin, ...], interval: Interval) -> tuple[BatchBin, ...]:
    """The bins with one more interval in its range (a new tuple: views may hold the old one)."""
    if interval.seconds <= 0:
        return bins
    index = range_index(interval.running)
    old = bins[index]
    new = BatchBin(old.seconds + interval.seconds, old.running_seconds + interval.running * interval.seconds,
                   old.drafts + interval.drafts, old.draft_tokens + interval.draft_tokens,
                   _add_positions(old.accepted_by_position, interval.accepted_by_position))
    return (*bins[:index], new, *bins[index + 1:])


def bins_minus(later: tuple[BatchBin, ...], earlier: tuple[BatchBin, ...]) -> tuple[BatchBin, ...]:
    """What a window added to each bin."""
    out = []
    for end, start in zip(later, earlier, strict=True):
        positions = (tuple(map(operator.sub, end.accepted_by_position, start.accepted_by_position))
                     if len(end.accepted_by_position) == len(start.accepted_by_position) else ())
        out.append(BatchBin(end.seconds - start.seconds, end.running_seconds - start.running_seconds,
                            end.drafts - start.drafts, end.draft_tokens - start.draft_tokens, positions))
    return tuple(out)
