"""From one series' state to its view: per window, acceptance and latency; against a baseline, the observed
speedup and the cost that calibrates the model to it; the break-even under load; and the verdict."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from specdecode_exporter.core.metrics import MetricSpec
from specdecode_exporter.core.validation import parse_duration
from specdecode_exporter.core.verdict import Evidence, Judgement, judge
from specdecode_exporter.pipeline import latency
from specdecode_exporter.pipeline.derive import (
    CostModel,
    WindowStats,
    break_even_acceptance,
    recommended_num_speculative_tokens,
    span_stats,
    speedup_by_length,
)
from specdecode_exporter.pipeline.latency import BaselineLatency, Histogram, LatencyStats, ObservedSpeedup
from specdecode_exporter.pipeline.store import SeriesKey, SeriesState, Totals, WindowSpan, optional_minus
from specdecode_exporter.sidecar.config import Config, TargetConfig, Window

# A baseline for a model over a window (the collector knows the control target or the configured figures).
BaselineFor = Callable[[str | None, Window], BaselineLatency | None]


class WindowView(NamedTuple):  # built per series × window per collection: a NamedTuple is cheap
    window: Window
    acceptance: WindowStats | None  # None without drafts in the window, or without token counters
    latency: LatencyStats | None  # None without latency families
    observed: ObservedSpeedup | None = None  # against the baseline, when there is one and requests
    calibrated_cost: float | None = None  # c = c_draft + c_verify that makes the model match the observed speedup
    break_even_at_load: float | None = None  # the configured model's break-even at the window's mean running batch
    recommended_k: int | None = None  # under the cost in force: calibrated when there is one, else configured


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

    def window(self, name: str | None) -> WindowView | None:
        return next((w for w in self.windows if w.window.name == name), None)

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


def latency_stats(span: WindowSpan) -> LatencyStats | None:
    start, end = span.start, span.end
    tpot = latency.change(start.time_per_output_token, end.time_per_output_token)
    ttft = latency.change(start.time_to_first_token, end.time_to_first_token)
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
    if stats is None and lat is None:
        return None
    baseline = ctx.baseline_for(model, window) if lat is not None and ctx.config.spec_decode else None
    observed = latency.observed_speedup(baseline, lat) if baseline is not None and lat is not None else None
    calibrated, recommended = _cost_advice(stats, observed)
    at_load = (break_even_acceptance(cost.per_draft_token_at(lat.running))
               if lat is not None and lat.running is not None else None)
    return WindowView(window, stats, lat, observed, calibrated, at_load if stats is not None else None, recommended)


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
    stats, observed = view.acceptance, view.observed
    if observed is None or observed.mean is None:
        return Evidence(stats.acceptance_ratio, stats.expected_speedup)
    return Evidence(stats.acceptance_ratio, stats.expected_speedup, observed.mean, observed.p50, observed.p99,
                    observed.baseline)


def series_view(state: SeriesState, now: float, fresh: bool, ctx: SeriesContext) -> SeriesView:
    reading, config = state.last_reading, ctx.config
    k = config.num_speculative_tokens or (reading.num_speculative_tokens if reading else None)
    computed: list[WindowView] = []
    if fresh:
        for window in ctx.app.windows:
            span = state.window_span(now, window.seconds, ctx.slack)
            view = window_view(window, span, state.key.model_name, k, ctx) if span else None
            if view is not None:
                computed.append(view)
    windows = tuple(computed)
    judged = verdict_window(windows, _seconds(ctx.app.verdict_window))
    calibrated = judged.calibrated_cost if judged is not None else None
    has_tokens = state.totals.draft_tokens is not None
    return SeriesView(
        state.key, state.totals, state.histogram, windows, k, reading.reported if reading else (), state.restarts,
        judged.window.name if judged else None, judge(evidence(judged), ctx.app.verdict),
        config.method or (reading.method if reading else None),
        config.cost.break_even_acceptance_ratio if has_tokens else None,
        break_even_acceptance(calibrated) if has_tokens and calibrated is not None else None,
        config.spec_decode,
    )
