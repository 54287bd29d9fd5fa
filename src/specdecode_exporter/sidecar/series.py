"""From one series' state to its view: per window, acceptance, latency and capacity; against a baseline, the
observed speedup and the cost that calibrates the model to it; against a control target, what spec decode costs in
memory and throughput; the break-even under load; whether speculation stopped; the batch-size schedule; and the
verdict."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from specdecode_exporter.core.metrics import MetricSpec
from specdecode_exporter.core.monitoring_config import SpeculationStopped
from specdecode_exporter.core.validation import parse_duration
from specdecode_exporter.core.verdict import Evidence, Judgement, judge
from specdecode_exporter.pipeline import latency
from specdecode_exporter.pipeline.capacity import AgainstControl, CapacityStats, against_control, capacity_stats
from specdecode_exporter.pipeline.derive import (
    CostModel,
    WindowStats,
    break_even_acceptance,
    recommended_num_speculative_tokens,
    span_stats,
    speedup_by_length,
)
from specdecode_exporter.pipeline.latency import BaselineLatency, Histogram, LatencyStats, ObservedSpeedup
from specdecode_exporter.pipeline.schedule import BatchSchedule, Calibration, LazySchedule
from specdecode_exporter.pipeline.store import SeriesKey, SeriesState, Totals, WindowSpan, optional_minus
from specdecode_exporter.sidecar.config import Config, TargetConfig, Window

# A baseline for a model over a window (the collector knows the control target or the configured figures).
BaselineFor = Callable[[str | None, Window], BaselineLatency | None]
# A control target's capacity for a model over a window, pooled over its engines, and its name in words.
ControlFor = Callable[[str | None, Window], tuple[str, CapacityStats] | None]


class WindowView(NamedTuple):  # built per series × window per collection: a NamedTuple is cheap
    window: Window
    acceptance: WindowStats | None  # None without drafts in the window, or without token counters
    latency: LatencyStats | None  # None without latency families
    observed: ObservedSpeedup | None = None  # against the baseline, when there is one and requests
    calibrated_cost: float | None = None  # c = c_draft + c_verify that makes the model match the observed speedup
    break_even_at_load: float | None = None  # the configured model's break-even at the window's mean running batch
    recommended_k: int | None = None  # under the cost in force: calibrated when there is one, else configured
    capacity: CapacityStats | None = None  # generation, preemptions, KV cache (None where the source counts none)
    against_control: AgainstControl | None = None  # where a control target is configured and has data


class Speculation(NamedTuple):
    """Whether a series still speculates, in words (status page, `check`, /api/v1/status)."""

    state: str  # "speculating", "stopped" (it drafted before, generates now without), "too little traffic"
    window: str
    share: float | None  # the speculative token share over the window
    reason: str


class SeriesView(NamedTuple):
    key: SeriesKey
    totals: Totals
    histogram: Histogram  # per-interval α (specdecode_interval_acceptance_ratio)
    windows: tuple[WindowView, ...]
    num_speculative_tokens: int | None
    reported: tuple[tuple[MetricSpec, float], ...]  # the engine's own figures, passed through
    restarts: int
    verdict_window: str | None  # the window the judgement is for
    judgement: Judgement
    method: str | None = None  # from config, else as the source states it (TensorRT-LLM)
    configured_break_even: float | None = None  # the configured cost per drafted token (None without tokens)
    calibrated_break_even: float | None = None  # from the cost that matches the observed speedup, where there is one
    spec_decode: bool = True  # False for a control target's series
    speculation: Speculation | None = None  # None where the source counts no generated tokens
    lazy_schedule: LazySchedule | None = None  # batch-size advice over schedule_window, worked out when read
    schedule_window: str | None = None
    kv_cache_usage: float | None = None  # at the last reading

    def window(self, name: str | None) -> WindowView | None:
        return next((w for w in self.windows if w.window.name == name), None)

    @property
    def schedule(self) -> BatchSchedule | None:
        return self.lazy_schedule.get() if self.lazy_schedule is not None else None

    @property
    def break_even(self) -> float | None:
        """The break-even α in force: calibrated where a baseline gives one, else configured."""
        return self.calibrated_break_even if self.calibrated_break_even is not None else self.configured_break_even

    @property
    def cost_basis(self) -> str:
        return "calibrated" if self.calibrated_break_even is not None else "configured"


@dataclass(frozen=True)
class SeriesContext:
    """What every series of one target is viewed with."""

    config: TargetConfig
    app: Config
    slack: float  # a snapshot this much before a window's start may open it
    baseline_for: BaselineFor
    control_for: ControlFor = lambda model, window: None


def latency_stats(span: WindowSpan) -> LatencyStats | None:
    start, end = span.start, span.end
    tpot = latency.Change.between(start.time_per_output_token, end.time_per_output_token)
    ttft = latency.Change.between(start.time_to_first_token, end.time_to_first_token)
    running = optional_minus(end.running_seconds, start.running_seconds)
    waiting = optional_minus(end.waiting_seconds, start.waiting_seconds)
    if tpot is None and ttft is None and running is None:
        return None
    seconds = span.seconds
    return LatencyStats(tpot, ttft, running / seconds if running is not None and seconds > 0 else None,
                        waiting / seconds if waiting is not None and seconds > 0 else None)


def _cost_advice(stats: WindowStats | None, observed: ObservedSpeedup | None
                 ) -> tuple[float | None, int | None]:
    """The calibrated cost and the k it recommends, where a baseline makes calibration possible."""
    if stats is None or observed is None:
        return None, None if stats is None else stats.recommended_num_speculative_tokens
    cost = latency.calibrated_cost(observed.mean, stats.mean_acceptance_length, stats.mean_draft_length)
    if cost is None:
        return None, stats.recommended_num_speculative_tokens
    speedups = speedup_by_length(stats.position_acceptance_ratios, CostModel(c_draft=0.0, c_verify=cost))
    return cost, recommended_num_speculative_tokens(speedups) if speedups else None


def window_view(window: Window, span: WindowSpan, model: str | None, k: int | None,
                ctx: SeriesContext) -> WindowView | None:
    cost = ctx.config.cost
    stats = span_stats(span, cost, k)
    lat = latency_stats(span)
    capacity = capacity_stats(span)
    if stats is None and lat is None and capacity is None:
        return None
    spec = ctx.config.spec_decode
    baseline = ctx.baseline_for(model, window) if lat is not None and spec else None
    observed = latency.observed_speedup(baseline, lat) if baseline is not None and lat is not None else None
    calibrated, recommended = _cost_advice(stats, observed)
    at_load = (break_even_acceptance(cost.per_draft_token_at(lat.running))
               if lat is not None and lat.running is not None else None)
    control = ctx.control_for(model, window) if capacity is not None and spec else None
    versus = (against_control(capacity, control[1], control[0], ctx.app.verdict.capacity.min_waiting_requests)
              if capacity is not None and control is not None else None)
    return WindowView(window, stats, lat, observed, calibrated, at_load if stats is not None else None, recommended,
                      capacity, versus)


@functools.cache
def _seconds(duration: str) -> float:
    return parse_duration(duration, "windows.verdict")


def verdict_window(windows: tuple[WindowView, ...], wanted_seconds: float) -> WindowView | None:
    """The window a verdict is given for: the first with acceptance data that is at least as long as the
    configured one (monitoring config windows.verdict), else the longest with acceptance data."""
    with_data = [w for w in windows if w.acceptance is not None]
    return next((w for w in with_data if w.window.seconds >= wanted_seconds), with_data[-1] if with_data else None)


def evidence(view: WindowView | None) -> Evidence:
    if view is None or view.acceptance is None:
        return Evidence(None, None)
    stats, observed, versus = view.acceptance, view.observed, view.against_control
    costs = ((versus.preemptions_per_request_increase, versus.throughput_ratio) if versus is not None
             else (None, None))
    if observed is None or observed.mean is None:
        return Evidence(stats.acceptance_ratio, stats.expected_speedup, None, None, None, None, *costs)
    return Evidence(stats.acceptance_ratio, stats.expected_speedup, observed.mean, observed.p50, observed.p99,
                    observed.baseline, *costs)


def speculation(windows: tuple[WindowView, ...], drafted_ever: bool, settings: SpeculationStopped
                ) -> Speculation | None:
    """Over the shortest window that counted generated tokens: speculating, stopped (a series that drafted tokens
    generates with a speculative token share below share_below), or too little traffic to tell."""
    view = next((w for w in windows if w.capacity is not None and w.capacity.generated_tokens is not None), None)
    if view is None or view.capacity is None or not drafted_ever:
        return None
    capacity = view.capacity
    rate = capacity.generated_tokens_per_second or 0.0
    share = capacity.speculative_token_share
    if share is None and capacity.draft_tokens == 0:
        share = 0.0  # a source without an emitted-token count that drafted nothing while it generated
    name = view.window.name
    if rate < settings.min_generated_tokens_per_second:
        return Speculation("too little traffic", name, share, f"{rate:.1f} generated tokens/s over {name}: too "
                           "little to tell whether it speculates")
    if share is None:  # no emitted tokens to weigh the drafts with
        return None if capacity.draft_tokens is None else Speculation(
            "speculating", name, None, f"drafting over {name} ({rate:.0f} generated tokens/s)")
    if share >= settings.share_below:
        return Speculation("speculating", name, share, f"speculative steps produced {share:.0%} of {rate:.0f} "
                           f"generated tokens/s over {name}")
    return Speculation("stopped", name, share, f"stopped speculating: {rate:.0f} generated tokens/s over {name}, "
                       f"{share:.0%} of them from speculative steps, though it drafted before"
                       f"{_stop_cause(capacity)}")


def _stop_cause(capacity: CapacityStats) -> str:
    steps = capacity.scheduled_steps
    if steps and sum(steps) > 0:
        return (f"; the batch-size schedule chose k = 0 for {steps[0] / sum(steps):.0%} of the scheduler steps "
                "(vLLM's num_speculative_tokens_per_batch_size: on purpose, at this batch size)")
    return ("; causes: an acceptance gate (TensorRT-LLM's acceptance_length_threshold switches speculation off "
            "for good), a batch-size schedule at k = 0, or a drafter that finds nothing (ngram)")


def schedule_of(views: tuple[tuple[WindowView, WindowSpan], ...], ctx: SeriesContext
                ) -> tuple[LazySchedule | None, str | None]:
    """The batch-size schedule over the longest window with a per-position curve and running-batch data."""
    for view, span in reversed(views):
        stats, lat = view.acceptance, view.latency
        if stats is None or not stats.position_acceptance_ratios or lat is None or lat.running is None:
            continue
        calibration = (Calibration(view.calibrated_cost, lat.running) if view.calibrated_cost is not None
                       else None)
        return LazySchedule(span.start.batch_bins, span.end.batch_bins, stats.position_acceptance_ratios,
                            ctx.config.cost, calibration), view.window.name
    return None, None


def series_view(state: SeriesState, now: float, fresh: bool, ctx: SeriesContext) -> SeriesView:
    reading, config = state.last_reading, ctx.config
    k = config.num_speculative_tokens or (reading.num_speculative_tokens if reading else None)
    computed: list[tuple[WindowView, WindowSpan]] = []
    if fresh:
        for window in ctx.app.windows:
            span = state.window_span(now, window.seconds, ctx.slack)
            view = window_view(window, span, state.key.model_name, k, ctx) if span else None
            if view is not None and span is not None:
                computed.append((view, span))
    windows = tuple(view for view, _ in computed)
    judged = verdict_window(windows, _seconds(ctx.app.verdict_window))
    calibrated = judged.calibrated_cost if judged is not None else None
    has_tokens = state.totals.draft_tokens is not None
    schedule, schedule_window = schedule_of(tuple(computed), ctx) if config.spec_decode else (None, None)
    return SeriesView(
        state.key, state.totals, state.histogram, windows, k, reading.reported if reading else (), state.restarts,
        judged.window.name if judged else None, judge(evidence(judged), ctx.app.verdict),
        config.method or (reading.method if reading else None),
        config.cost.break_even_acceptance_ratio if has_tokens else None,
        break_even_acceptance(calibrated) if has_tokens and calibrated is not None else None,
        config.spec_decode,
        speculation(windows, bool(state.totals.draft_tokens), ctx.app.speculation_stopped)
        if config.spec_decode else None,
        schedule, schedule_window,
        reading.latency.kv_cache_usage if reading is not None and reading.latency is not None else None,
    )
