"""A window's view is worked out at its first read: it must say what the eager computation says, exist exactly
where that had something to say, and work nothing out that nobody reads."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode_exporter.core.contract.verdict import judge
from specdecode_exporter.pipeline import latency
from specdecode_exporter.pipeline.capacity import CapacityStats, against_control, capacity_stats, has_capacity
from specdecode_exporter.pipeline.derive import (
    acceptance_ratio,
    break_even_acceptance,
    counts_stats,
    has_acceptance,
    span_stats,
)
from specdecode_exporter.pipeline.latency import BaselineLatency, Histogram
from specdecode_exporter.pipeline.store import Totals, WindowSpan, optional_minus, positions_minus
from specdecode_exporter.sidecar.config import Config, TargetConfig, Window, parse_windows
from specdecode_exporter.sidecar.series import (
    SeriesAdvice,
    SeriesContext,
    WindowView,
    _cost_advice,
    evidence,
    has_latency,
    latency_stats,
    schedule_of,
    speculation,
    verdict_window,
    window_view,
)

VALUE = st.one_of(st.none(), st.floats(min_value=-10, max_value=1e6), st.sampled_from([math.nan, math.inf, 0.0]))
BOUNDS = ((0.01, 0.1, math.inf), (0.02, 0.2, math.inf))
WINDOW = parse_windows("1m", "windows")[0]
TARGET = TargetConfig(name="t", url="http://127.0.0.1:1/metrics")
CONTROL = CapacityStats(60.0, None, 5000.0, 1.0, 20.0, 0.5, 0.5)
BASELINE = BaselineLatency(0.04, 0.035, 0.08, "the measured baseline")


@st.composite
def histograms(draw: st.DrawFn) -> Histogram | None:
    if draw(st.booleans()):
        return None
    counts = sorted(draw(st.lists(st.floats(min_value=0, max_value=1e4), min_size=3, max_size=3)))
    return Histogram(draw(st.sampled_from(BOUNDS)), tuple(counts), draw(st.floats(min_value=0, max_value=1e3)))


@st.composite
def totals(draw: st.DrawFn) -> Totals:
    k = draw(st.integers(min_value=0, max_value=3))
    positions = tuple(draw(st.lists(st.floats(min_value=0, max_value=1e4), min_size=k, max_size=k)))
    return Totals(draw(VALUE), draw(VALUE), draw(VALUE), draw(VALUE), positions, draw(histograms()),
                  draw(histograms()), draw(VALUE), draw(VALUE), None, draw(VALUE), draw(VALUE), (), draw(VALUE),
                  proposed_draft_tokens=draw(VALUE))


def context(baseline: bool, control: bool) -> SeriesContext:
    return SeriesContext(TARGET, Config(targets=(TARGET,)), 2.5,
                         lambda model, window: BASELINE if baseline else None,
                         lambda model, window: ("control", CONTROL) if control else None)


def eager(window: Window, span: WindowSpan, k: int | None, ctx: SeriesContext) -> tuple[object, ...] | None:
    """What a window said when every part was worked out at the collection (the code before laziness)."""
    start, end = span.start, span.end
    drafted = optional_minus(end.draft_tokens, start.draft_tokens)
    accepted = optional_minus(end.accepted_tokens, start.accepted_tokens)
    stats = None if drafted is None or accepted is None else counts_stats(
        span.seconds, drafted, accepted, optional_minus(end.drafts, start.drafts),
        positions_minus(end.accepted_by_position, start.accepted_by_position), ctx.config.cost, k)
    tpot = latency.Change.between(start.time_per_output_token, end.time_per_output_token)
    ttft = latency.Change.between(start.time_to_first_token, end.time_to_first_token)
    running = optional_minus(end.running_seconds, start.running_seconds)
    lat = None if tpot is None and ttft is None and running is None else latency_stats(span)
    deltas = (optional_minus(end.generated_tokens, start.generated_tokens),
              optional_minus(end.preemptions, start.preemptions),
              optional_minus(end.kv_cache_seconds, start.kv_cache_seconds))
    capacity = None if deltas == (None, None, None) else capacity_stats(span)
    proposed = optional_minus(end.proposed_draft_tokens, start.proposed_draft_tokens)
    lower = (None if stats is not None or proposed is None or accepted is None or not proposed > 0
             else acceptance_ratio(accepted, proposed))  # accepted per proposed token, where α is withheld
    if stats is None and lat is None and capacity is None and lower is None:
        return None
    baseline = ctx.baseline_for(None, window) if lat is not None else None
    observed = latency.observed_speedup(baseline, lat) if baseline is not None and lat is not None else None
    calibrated, recommended = _cost_advice(stats, observed)
    at_load = (break_even_acceptance(ctx.config.cost.per_draft_token_at(lat.running))
               if lat is not None and lat.running is not None and stats is not None else None)
    control = ctx.control_for(None, window) if capacity is not None else None
    versus = (against_control(capacity, control[1], control[0], ctx.app.verdict.capacity.min_waiting_requests)
              if capacity is not None and control is not None else None)
    return (window, stats, lat, observed, calibrated, at_load, recommended, capacity, versus, lower)


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (a NaN count gives NaN rates: equal views, though NaN != NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


@settings(max_examples=400, deadline=None)
@given(totals(), totals(), st.sampled_from([0.0, -1.0, 60.0, math.nan]), st.sampled_from([None, 2, 3]),
       st.booleans(), st.booleans())
def test_a_view_read_later_says_what_the_eager_one_said(start: Totals, end: Totals, seconds: float, k: int | None,
                                                         baseline: bool, control: bool) -> None:
    span, ctx = WindowSpan(seconds, start, end), context(baseline, control)
    assert has_acceptance(span) == (span_stats(span, ctx.config.cost, k) is not None)
    assert has_latency(span) == (latency_stats(span) is not None)
    assert has_capacity(span) == (capacity_stats(span) is not None)
    view, expected = window_view(WINDOW, span, None, k, ctx), eager(WINDOW, span, k, ctx)
    assert (view is None) == (expected is None)
    if view is not None:
        assert view.has_acceptance == (expected is not None and expected[1] is not None)
        assert same(view.parts(), expected)
        again = window_view(WINDOW, span, None, k, ctx)
        assert again is not None and same(view.parts(), again.parts())


def test_a_view_works_out_a_part_at_its_first_read_and_keeps_it() -> None:
    """Nothing looked up for a view that nobody reads (a window the page renders only at the next scrape)."""
    lookups: list[str] = []

    def baseline_for(model: str | None, window: Window) -> BaselineLatency:
        lookups.append("baseline")
        return BASELINE

    def control_for(model: str | None, window: Window) -> tuple[str, CapacityStats]:
        lookups.append("control")
        return "control", CONTROL

    tpot = Histogram(BOUNDS[0], (10.0, 90.0, 100.0), 3.0)
    start = Totals(100.0, 60.0, 40.0, 140.0, (), tpot, None, 0.0, 0.0, None, 1000.0, 0.0)
    end = Totals(300.0, 200.0, 90.0, 390.0, (), tpot._replace(counts=(30.0, 280.0, 300.0), total=9.0), None, 600.0,
                 0.0, None, 3000.0, 1.0)
    ctx = SeriesContext(TARGET, Config(targets=(TARGET,)), 2.5, baseline_for, control_for)
    view = window_view(WINDOW, WindowSpan(60.0, start, end), None, 2, ctx)
    assert isinstance(view, WindowView)
    assert verdict_window((view,), 60.0) is view and lookups == []  # which window: decided without working it out
    observed = view.observed
    assert observed is not None and observed.baseline == BASELINE.source and lookups == ["baseline"]
    assert view.observed is observed and view.calibrated_cost is not None and lookups == ["baseline"]
    versus = view.against_control
    assert versus is not None and versus.control == "control" and lookups == ["baseline", "control"]
    assert view.against_control is versus and lookups == ["baseline", "control"]


def test_a_series_verdict_is_worked_out_when_read_from_the_collections_windows() -> None:
    """The verdict, calibrated break-even, speculation and schedule of a series: nothing looked up for a series
    that nobody reads between two scrapes, and what the eager code gave once read."""
    lookups: list[str] = []

    def baseline_for(model: str | None, window: Window) -> BaselineLatency:
        lookups.append(window.name)
        return BASELINE

    tpot = Histogram(BOUNDS[0], (10.0, 90.0, 100.0), 3.0)
    start = Totals(100.0, 60.0, 40.0, 140.0, (), tpot, None, 0.0, 0.0, None, 1000.0, 0.0)
    end = Totals(300.0, 200.0, 90.0, 390.0, (), tpot._replace(counts=(30.0, 280.0, 300.0), total=9.0), None, 600.0,
                 0.0, None, 3000.0, 1.0)
    config = Config(targets=(TARGET,))
    ctx = SeriesContext(TARGET, config, 2.5, baseline_for, lambda model, window: None)
    computed = []
    for window in parse_windows("1m,5m", "windows"):
        span = WindowSpan(window.seconds, start, end)
        view = window_view(window, span, None, 2, ctx)
        assert view is not None
        computed.append((view, span))
    judged = verdict_window(tuple(view for view, _ in computed), 300.0)
    assert judged is computed[1][0]
    advice = SeriesAdvice(tuple(computed), judged, ctx, has_tokens=True, drafted_ever=True)
    assert lookups == []
    assert advice.judgement == judge(evidence(judged), config.verdict) and lookups == ["5m"]
    assert advice.judgement.basis == "observed"
    calibrated = judged.calibrated_cost
    assert calibrated is not None and advice.calibrated_break_even == break_even_acceptance(calibrated)
    assert advice.speculation == speculation(tuple(view for view, _ in computed), True, config.speculation_stopped)
    assert advice.schedule == schedule_of(tuple(computed), ctx) and lookups == ["5m"]
