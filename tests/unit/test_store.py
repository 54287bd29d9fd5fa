"""Reset-safe totals, windows, the interval histogram, expiry and the series cap."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest

from specdecode_exporter.core.contract.metrics import ACCEPTANCE_RATIO_BUCKETS
from specdecode_exporter.pipeline.engines.base import SeriesReading
from specdecode_exporter.pipeline.store import SeriesKey, SeriesState, Store, counter_increase


class Delta(NamedTuple):
    seconds: float
    draft_tokens: float
    accepted_tokens: float


def window_delta(state: SeriesState, now: float, seconds: float, slack: float) -> Delta | None:
    """The counts over a window, from the two snapshots that bound it (as derive.span_stats reads them)."""
    span = state.window_span(now, seconds, slack)
    if span is None:
        return None
    return Delta(span.seconds, span.end.draft_tokens - span.start.draft_tokens,
                 span.end.accepted_tokens - span.start.accepted_tokens)


def reading(drafted: float, accepted: float, drafts: float | None = None, created: float | None = None,
            per_pos: tuple[float, ...] = ()) -> SeriesReading:
    return SeriesReading("m", "0", drafted, accepted, drafts=drafts, accepted_by_position=per_pos, created=created)


@pytest.mark.parametrize(
    ("previous", "raw", "restarted", "expected"),
    [(None, 100.0, False, 100.0), (100.0, 150.0, False, 50.0), (150.0, 20.0, False, 20.0), (10.0, 50.0, True, 50.0),
     (50.0, 50.0, False, 0.0)],
)
def test_counter_increase_follows_prometheus_rate_rules(previous: float | None, raw: float, restarted: bool,
                                                        expected: float) -> None:
    assert counter_increase(previous, raw, restarted) == expected


def test_totals_survive_a_restart_seen_as_a_decrease() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    totals = []
    for t, raw in enumerate([100.0, 150.0, 20.0, 50.0]):
        state.update(reading(raw, raw / 2), float(t), 3600)
        totals.append(state.totals.draft_tokens)
    assert totals == [100.0, 150.0, 170.0, 200.0]
    assert state.restarts == 1


def test_a_changed_created_is_a_restart_even_when_counters_grew() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    state.update(reading(100.0, 50.0, created=1.0), 0.0, 3600)
    state.update(reading(300.0, 150.0, created=2.0), 5.0, 3600)
    assert state.totals.draft_tokens == 400.0
    assert state.restarts == 1


def test_positions_are_reset_safe_too() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    state.update(reading(30, 20, drafts=10, per_pos=(9.0, 7.0, 4.0)), 0.0, 3600)
    state.update(reading(6, 3, drafts=2, per_pos=(2.0, 1.0, 0.0)), 5.0, 3600)  # restarted
    assert state.totals.accepted_by_position == (11.0, 8.0, 4.0)
    assert state.totals.drafts == 12.0


def test_window_spans_the_requested_time_with_slack() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    for i in range(30):  # every 5 s, 10 tokens/s drafted, half accepted
        state.update(reading(50.0 * i, 25.0 * i), 5.0 * i, 3600)
    now = 5.0 * 29
    window = window_delta(state, now, 60.0, slack=2.5)
    assert window is not None
    assert window.seconds == 60.0
    assert window.draft_tokens == 600.0
    assert window.accepted_tokens == 300.0


def test_window_needs_two_snapshots() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    assert window_delta(state, 0.0, 60.0, 2.5) is None
    state.update(reading(10.0, 5.0), 0.0, 3600)
    assert window_delta(state, 0.0, 60.0, 2.5) is None
    state.update(reading(20.0, 10.0), 5.0, 3600)
    assert window_delta(state, 5.0, 60.0, 2.5) is not None


def test_window_delta_has_no_negative_values_across_a_restart() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    for t, raw in enumerate([1000.0, 1100.0, 5.0, 105.0]):
        state.update(reading(raw, raw * 0.6), 5.0 * t, 3600)
    window = window_delta(state, 15.0, 60.0, 2.5)
    assert window is not None
    assert window.draft_tokens == 100.0 + 5.0 + 100.0
    assert window.accepted_tokens == pytest.approx(0.6 * 205.0)


def test_ring_keeps_only_what_the_longest_window_needs() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    for i in range(1000):
        state.update(reading(float(i), float(i)), float(i), keep_seconds=100.0)
    assert state.times[0] <= 999.0 - 100.0 < state.times[1]  # one older than the window: it spans in full
    assert state.times[-60:] == [float(t) for t in range(940, 1000)]  # the last 60 intervals: every one
    assert len(state.times) < 100  # older ones thinned
    window = window_delta(state, 999.0, 100.0, 0.5)
    assert window is not None and window.seconds >= 100.0 - 100.0 / 30 - 1.0


def test_thinned_ring_keeps_every_window_within_3_percent_of_its_length() -> None:
    """A 1h ring at 5 s holds ~180 snapshots instead of 720, and every window still starts where it should,
    give or take 1/30 of its length; its counts are exact for the span it covers."""
    state = SeriesState(SeriesKey("t", "m", "0"))
    interval, keep = 5.0, 3600.0 + 10.0
    for i in range(3 * 720):  # three hours: 10 tokens/s drafted, 40 % accepted
        state.update(reading(50.0 * i, 20.0 * i), interval * i, keep)
        now = interval * i
        if i < 800:
            continue
        for seconds in (60.0, 300.0, 900.0, 3600.0):
            window = window_delta(state, now, seconds, interval / 2)
            assert window is not None
            assert seconds - seconds / 30 - interval <= window.seconds <= seconds + interval / 2, (seconds, window)
            assert window.draft_tokens == 10.0 * window.seconds
            assert window.accepted_tokens == 4.0 * window.seconds
            if seconds <= 300.0:
                assert window.seconds == seconds  # the recent past is never thinned
    assert len(state.times) < 200


def test_interval_histogram_observes_each_interval_alpha() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    state.update(reading(100.0, 50.0), 0.0, 3600)  # first sight: baseline, no observation
    state.update(reading(200.0, 120.0), 5.0, 3600)  # α = 0.70
    state.update(reading(300.0, 150.0), 10.0, 3600)  # α = 0.30
    state.update(reading(300.0, 150.0), 15.0, 3600)  # no drafts: no observation
    hist = state.histogram
    assert hist.observations == 2
    assert hist.total == pytest.approx(1.0)
    assert hist.bounds == (*ACCEPTANCE_RATIO_BUCKETS, math.inf)
    counts = dict(zip(hist.bounds, hist.counts, strict=True))
    assert counts[0.25] == 0
    assert counts[0.3] == 1
    assert counts[0.65] == 1
    assert counts[0.7] == 2
    assert counts[1.0] == 2


def test_stale_series_expire() -> None:
    store = Store(keep_seconds=3600, stale_after=60.0)
    store.update("t", [reading(1.0, 1.0)], [], now=0.0)
    store.update("t", [], [], now=30.0)
    assert len(store.for_target("t")) == 1
    store.update("t", [], [], now=61.0)
    assert store.for_target("t") == []


def test_pending_series_stay_alive_without_a_reading() -> None:
    store = Store(keep_seconds=3600, stale_after=60.0)
    store.update("t", [reading(1.0, 1.0)], [], now=0.0)
    store.update("t", [], [("m", "0")], now=50.0)
    store.update("t", [], [], now=100.0)
    assert len(store.for_target("t")) == 1


def test_series_cap_per_target_counts_what_was_dropped() -> None:
    store = Store(keep_seconds=3600, stale_after=600.0, max_series_per_target=2)
    readings = [SeriesReading("m", str(e), 1.0, 1.0) for e in range(5)]
    store.update("t", readings, [], now=0.0)
    assert len(store.for_target("t")) == 2
    assert store.dropped_series["t"] == 3
