"""Per-series state: reset-safe totals, a ring of snapshots for the windows, the interval histogram.

Counters follow Prometheus' rate() rules: a counter that goes down, or a changed ``_created``, is a
restart and the increase is the new raw value. Totals start at the source's own count the first time a
series is seen, so until the first restart they equal vLLM's counters.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from specdecode_exporter.core.contract.metrics import ACCEPTANCE_RATIO_BUCKETS
from specdecode_exporter.pipeline import latency
from specdecode_exporter.pipeline.batches import NO_BINS, BatchBin, Interval, binned
from specdecode_exporter.pipeline.engines.base import LatencyReading, SeriesReading
from specdecode_exporter.pipeline.latency import Histogram


class SeriesKey(NamedTuple):
    target: str
    model_name: str | None
    engine: str | None


class Totals(NamedTuple):
    """Cumulative counts; ``None`` where the source does not export the quantity."""

    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    drafts: float | None = None
    emitted_tokens: float | None = None
    accepted_by_position: tuple[float, ...] = ()
    time_per_output_token: Histogram | None = None  # reset-safe, like the counters
    time_to_first_token: Histogram | None = None
    running_seconds: float | None = None  # ∫ requests running dt: a window's mean batch is its change / seconds
    waiting_seconds: float | None = None
    request_acceptance: Histogram | None = None  # the engine's own per-request α histogram, reset-safe
    generated_tokens: float | None = None
    preemptions: float | None = None
    scheduled_steps: tuple[float, ...] = ()  # by the k a batch-size schedule chose (index = k)
    kv_cache_seconds: float | None = None  # ∫ KV-cache usage dt
    drafted_by_position: tuple[float, ...] = ()  # drafts that reached each position, where the engine counts them
    proposed_draft_tokens: float | None = None  # SeriesReading.proposed_draft_tokens, reset-safe
    batch_bins: tuple[BatchBin, ...] = NO_BINS  # drafts, acceptance and time by batch-size range


def optional_minus(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def positions_minus(later: tuple[float, ...], earlier: tuple[float, ...]) -> tuple[float, ...]:
    if len(later) != len(earlier):
        return ()  # k changed inside the window: the per-position curve is not comparable
    return tuple(map(operator.sub, later, earlier))


def counter_increase(previous_raw: float | None, raw: float, restarted: bool) -> float:
    """Increase of a raw counter since the last reading, Prometheus-style."""
    if previous_raw is None or restarted or raw < previous_raw:
        return raw
    return raw - previous_raw


def _accumulate(total: float | None, previous_raw: float | None, raw: float | None, restarted: bool) -> float | None:
    if raw is None:
        return total
    return (total or 0.0) + counter_increase(previous_raw, raw, restarted)


def _decreased(earlier: float | None, later: float | None) -> bool:
    return earlier is not None and later is not None and later < earlier


def is_restart(previous: SeriesReading, current: SeriesReading) -> bool:
    if previous.created is not None and current.created is not None and current.created != previous.created:
        return True
    return (
        _decreased(previous.draft_tokens, current.draft_tokens)
        or _decreased(previous.accepted_tokens, current.accepted_tokens)
        or _decreased(previous.drafts, current.drafts)
        or _decreased(previous.emitted_tokens, current.emitted_tokens)
        or _decreased(previous.generated_tokens, current.generated_tokens)
        or _decreased(previous.preemptions, current.preemptions)
        or _decreased(previous.proposed_draft_tokens, current.proposed_draft_tokens)
        or any(map(operator.lt, current.accepted_by_position, previous.accepted_by_position))
        or any(map(operator.lt, current.scheduled_steps, previous.scheduled_steps))
        or any(map(operator.lt, current.drafted_by_position, previous.drafted_by_position))
        or (previous.latency is not None and current.latency is not None
            and _decreased(previous.latency.observations, current.latency.observations))
    )


def _positions_increase(totals: tuple[float, ...], previous: tuple[float, ...], current: tuple[float, ...],
                        restarted: bool) -> tuple[float, ...]:
    if not current:
        return totals
    if not restarted and len(totals) == len(previous) == len(current):  # the usual case, in C
        return tuple(map(operator.add, totals, map(operator.sub, current, previous)))
    positions = list(totals)
    for i, raw in enumerate(current):
        prev_raw = previous[i] if i < len(previous) else None
        increase = counter_increase(prev_raw, raw, restarted)
        if i < len(positions):
            positions[i] += increase
        else:
            positions.append(increase)
    return tuple(positions)


_LatencyTotals = tuple[Histogram | None, Histogram | None, float | None, float | None, Histogram | None]


def _latency_totals(totals: Totals, previous: LatencyReading | None, current: LatencyReading | None,
                    restarted: bool, seconds: float) -> _LatencyTotals:
    """The latency part of the totals after one more reading, ``seconds`` after the previous one."""
    if current is None:
        return (totals.time_per_output_token, totals.time_to_first_token, totals.running_seconds,
                totals.waiting_seconds, totals.request_acceptance)

    def histogram(total: Histogram | None, before: Histogram | None, now: Histogram | None) -> Histogram | None:
        return total if now is None else latency.accumulate(total, before, now, restarted)

    before = previous or LatencyReading()
    return (histogram(totals.time_per_output_token, before.time_per_output_token, current.time_per_output_token),
            histogram(totals.time_to_first_token, before.time_to_first_token, current.time_to_first_token),
            time_integral(totals.running_seconds, before.running, current.running, seconds),
            time_integral(totals.waiting_seconds, before.waiting, current.waiting, seconds),
            histogram(totals.request_acceptance, before.request_acceptance, current.request_acceptance))


def time_integral(total: float | None, before: float | None, now: float | None, seconds: float) -> float | None:
    """∫ gauge dt after ``seconds`` more, the gauge taken at its reading before them (now's without one)."""
    if now is None:
        return total
    return (total or 0.0) + (before if before is not None else now) * seconds


def add_reading(totals: Totals, previous: SeriesReading | None, current: SeriesReading, restarted: bool,
                seconds: float = 0.0) -> Totals:
    """New reset-safe totals after one more raw reading, ``seconds`` after the previous one."""
    before = previous.latency if previous is not None and previous.latency is not None else LatencyReading()
    now = current.latency or LatencyReading()
    return Totals(
        _accumulate(totals.draft_tokens, previous.draft_tokens if previous else None, current.draft_tokens,
                    restarted),
        _accumulate(totals.accepted_tokens, previous.accepted_tokens if previous else None, current.accepted_tokens,
                    restarted),
        _accumulate(totals.drafts, previous.drafts if previous else None, current.drafts, restarted),
        _accumulate(totals.emitted_tokens, previous.emitted_tokens if previous else None, current.emitted_tokens,
                    restarted),
        _positions_increase(totals.accepted_by_position, previous.accepted_by_position if previous else (),
                            current.accepted_by_position, restarted),
        *_latency_totals(totals, previous.latency if previous else None, current.latency, restarted, seconds),
        generated_tokens=_accumulate(totals.generated_tokens, previous.generated_tokens if previous else None,
                                     current.generated_tokens, restarted),
        preemptions=_accumulate(totals.preemptions, previous.preemptions if previous else None, current.preemptions,
                                restarted),
        scheduled_steps=_positions_increase(totals.scheduled_steps, previous.scheduled_steps if previous else (),
                                            current.scheduled_steps, restarted),
        kv_cache_seconds=time_integral(totals.kv_cache_seconds, before.kv_cache_usage, now.kv_cache_usage, seconds),
        drafted_by_position=_positions_increase(totals.drafted_by_position,
                                                previous.drafted_by_position if previous else (),
                                                current.drafted_by_position, restarted),
        # Gone (None) as soon as a reading has none: a window that spans a reading without it has no lower bound,
        # rather than one whose proposed count stood still while the accepted went on (α declared back, say).
        proposed_draft_tokens=None if current.proposed_draft_tokens is None else _accumulate(
            totals.proposed_draft_tokens, previous.proposed_draft_tokens if previous else None,
            current.proposed_draft_tokens, restarted),
        batch_bins=totals.batch_bins,
    )


def with_interval(before: Totals, after: Totals, seconds: float, running: float | None) -> Totals:
    """``after`` with the interval since ``before`` added to the bin of its mean running batch (none without
    a running batch, or without drafts and generation in it)."""
    if running is None or seconds <= 0:
        return after
    drafts = optional_minus(after.drafts, before.drafts) or 0.0
    if drafts <= 0 and not optional_minus(after.generated_tokens, before.generated_tokens):
        return after  # idle: no time at any batch size
    positions = positions_minus(after.accepted_by_position, before.accepted_by_position)
    interval = Interval(seconds, running, drafts, optional_minus(after.draft_tokens, before.draft_tokens) or 0.0,
                        positions)
    # batch_bins is the last field: building the tuple is several times cheaper than NamedTuple._replace.
    return Totals(*after[:-1], binned(after.batch_bins, interval))


# The per-interval α histogram before any interval with drafts; it grows for the life of the sidecar. Immutable,
# so a view can hold the series' current one without copying it.
NO_OBSERVATIONS = Histogram.empty(ACCEPTANCE_RATIO_BUCKETS)
RING_RESOLUTION = 60  # an old snapshot is kept when it is ≥ 1/60 of its age after the one kept before it
THIN_EVERY = 12  # snapshots appended between two thinnings (once a minute at 5 s)


class WindowSpan(NamedTuple):
    seconds: float
    start: Totals
    end: Totals


# Collections in a row that count generated tokens and no drafted one before a standstill of the drafted-token
# counter counts as one (sidecar/series.py says speculation stopped from it, and started again after it).
STANDSTILL_COLLECTIONS = 2


class Drafting(NamedTuple):
    """What the drafted-token counter did at the latest collections: when it last moved, and how many collections
    since then counted generated tokens without a drafted one. Speculation stopped, and started again, is said from
    this (sidecar/series.py), not from a window emptying."""

    last_at: float | None = None  # the latest collection that counted drafted tokens (None: none since the start)
    at_last: Totals | None = None  # the totals then
    idle: int = 0  # collections since then that counted generated tokens and no drafted one
    idle_generated: float = 0.0  # the tokens they generated
    idle_running: float | None = None  # the fewest requests running at those collections
    drafting_running: float | None = None  # the most requests running at a drafting collection since it resumed
    resumed_at: float | None = None  # the first drafting collection after the latest standstill, and ...
    stopped_at: float | None = None  # ... the latest drafting collection before that standstill


NOTHING_DRAFTED_YET = Drafting()


def drafted_increase(before: Totals, after: Totals) -> float | None:
    """Drafted tokens (else drafts, where the source counts only those) between two totals."""
    tokens = optional_minus(after.draft_tokens, before.draft_tokens)
    return tokens if tokens is not None else optional_minus(after.drafts, before.drafts)


def _most(a: float | None, b: float | None, pick: Callable[[float, float], float]) -> float | None:
    return b if a is None else a if b is None else pick(a, b)


def drafting_after(drafting: Drafting, before: Totals, after: Totals, now: float, running: float | None) -> Drafting:
    """``drafting`` after one more collection (``before`` and ``after`` its totals), ``running`` requests then."""
    drafted = drafted_increase(before, after)
    if drafted is not None and drafted > 0:
        if drafting.idle >= STANDSTILL_COLLECTIONS:  # drafting again after a standstill
            return Drafting(now, after, drafting_running=running, resumed_at=now, stopped_at=drafting.last_at)
        return drafting._replace(last_at=now, at_last=after, idle=0, idle_generated=0.0, idle_running=None,
                                 drafting_running=_most(drafting.drafting_running, running, max))
    generated = optional_minus(after.generated_tokens, before.generated_tokens)
    if not generated or generated <= 0:
        return drafting  # nothing generated: nothing said about drafting
    return drafting._replace(idle=drafting.idle + 1, idle_generated=drafting.idle_generated + generated,
                             idle_running=_most(drafting.idle_running, running, min))


@dataclass
class SeriesState:
    key: SeriesKey
    last_reading: SeriesReading | None = None
    totals: Totals = field(default_factory=Totals)
    times: list[float] = field(default_factory=list)
    snapshots: list[Totals] = field(default_factory=list)
    histogram: Histogram = NO_OBSERVATIONS  # per-interval α
    last_seen: float = 0.0
    restarts: int = 0
    appended_since_thinning: int = 0
    drafting: Drafting = NOTHING_DRAFTED_YET

    def update(self, reading: SeriesReading, now: float, keep_seconds: float) -> None:
        previous = self.last_reading
        restarted = previous is not None and is_restart(previous, reading)
        if restarted:
            self.restarts += 1
        before = self.totals
        seconds = now - self.times[-1] if self.times else 0.0
        added = add_reading(before, previous, reading, restarted, seconds)
        running = previous.latency.running if previous is not None and previous.latency is not None else None
        self.totals = with_interval(before, added, seconds, running)
        if previous is not None:
            self.drafting = drafting_after(self.drafting, before, self.totals, now,
                                           reading.latency.running if reading.latency is not None else None)
        self.last_reading = reading
        self.last_seen = now
        drafted = optional_minus(self.totals.draft_tokens, before.draft_tokens)
        accepted = optional_minus(self.totals.accepted_tokens, before.accepted_tokens)
        if previous is not None and drafted is not None and accepted is not None and drafted > 0:
            self.histogram = self.histogram.observed(min(1.0, max(0.0, accepted / drafted)))
        self._append(now, keep_seconds)

    def touch(self, now: float) -> None:
        """The series is still exported but gave no trustworthy reading this time."""
        self.last_seen = now

    def _append(self, now: float, keep_seconds: float) -> None:
        self.times.append(now)
        self.snapshots.append(self.totals)
        # Keep one snapshot older than the longest window so that window can span its full length.
        cut = bisect.bisect_left(self.times, now - keep_seconds) - 1
        if cut > 0:
            del self.times[:cut]
            del self.snapshots[:cut]
        self.appended_since_thinning += 1
        if self.appended_since_thinning >= THIN_EVERY:
            self.appended_since_thinning = 0
            self._thin(now)

    def _thin(self, now: float) -> None:
        """Keep old snapshots only as densely as a window starting there needs them.

        A snapshot of age a is kept when it is at least a/RING_RESOLUTION seconds after the one kept before it,
        so a window of any length W starts within about W/30 (3.3 %) of where it should; everything younger than
        60 collection intervals stays. A 1h ring at 5 s holds ~175 snapshots instead of 720: with 80 series
        that is ~25 MB less. Counts stay exact: a window's values are for the span it really covers.
        """
        times, snapshots = self.times, self.snapshots
        kept_times, kept_snapshots = [times[0]], [snapshots[0]]  # the one that lets the longest window span fully
        previous = times[0]
        last = len(times) - 1
        for i in range(1, last):
            t = times[i]
            if t - previous >= (now - t) / RING_RESOLUTION:
                kept_times.append(t)
                kept_snapshots.append(snapshots[i])
                previous = t
        kept_times.append(times[last])
        kept_snapshots.append(snapshots[last])
        self.times, self.snapshots = kept_times, kept_snapshots

    def window_span(self, now: float, seconds: float, slack: float) -> WindowSpan | None:
        """The snapshots that open and close the window ending at the latest snapshot; None with fewer than 2.

        ``slack`` lets a snapshot taken a little before the window's start count as its start, so a 1m
        window at a 5 s interval spans 60 s rather than 55 s. Finding the start is a bisection of the ring;
        the window's counts are the difference of two cumulative snapshots, so nothing is summed per scrape.
        """
        times = self.times
        start = bisect.bisect_left(times, now - seconds - slack)
        last = len(times) - 1
        if start >= last:
            return None
        return WindowSpan(times[last] - times[start], self.snapshots[start], self.snapshots[last])


@dataclass
class Store:
    """All series, indexed by target. Only the collection loop of each target writes that target's part."""

    keep_seconds: float
    stale_after: float
    max_series_per_target: int = 1000
    by_target: dict[str, dict[SeriesKey, SeriesState]] = field(default_factory=dict)
    dropped_series: dict[str, int] = field(default_factory=dict)

    def set_limits(self, keep_seconds: float, stale_after: float, max_series_per_target: int) -> None:
        """New limits (a reload): they apply from the next update; nothing kept is dropped now."""
        self.keep_seconds = keep_seconds
        self.stale_after = stale_after
        self.max_series_per_target = max_series_per_target

    @property
    def series(self) -> dict[SeriesKey, SeriesState]:
        """Every series of every target (a new dict; for inspection and tests)."""
        return {key: state for states in self.by_target.values() for key, state in states.items()}

    def update(self, target: str, readings: list[SeriesReading], pending: list[tuple[str | None, str | None]],
               now: float) -> list[SeriesState]:
        states = self.by_target.setdefault(target, {})
        for reading in readings:
            state = self._state(states, SeriesKey(target, reading.model_name, reading.engine), now)
            if state is not None:
                state.update(reading, now, self.keep_seconds)
        for model_name, engine in pending:
            state = states.get(SeriesKey(target, model_name, engine))
            if state is not None:
                state.touch(now)
        self.expire(target, now)
        return self.for_target(target)

    def _state(self, states: dict[SeriesKey, SeriesState], key: SeriesKey, now: float) -> SeriesState | None:
        state = states.get(key)
        if state is None:
            if len(states) >= self.max_series_per_target:
                self.dropped_series[key.target] = self.dropped_series.get(key.target, 0) + 1
                return None
            state = states[key] = SeriesState(key, last_seen=now)
        return state

    def expire(self, target: str, now: float) -> None:
        states = self.by_target.get(target, {})
        for key in [k for k, s in states.items() if now - s.last_seen > self.stale_after]:
            del states[key]

    def for_target(self, target: str) -> list[SeriesState]:
        return list(self.by_target.get(target, {}).values())

    def drop_target(self, target: str) -> None:
        self.by_target.pop(target, None)
        self.dropped_series.pop(target, None)
