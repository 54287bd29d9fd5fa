"""The dashboard's row: Acceptance over time."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.models import common as cm

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring.dashboard.context import RED, UNIT_SPEEDUP, UNIT_TOKENS_PER_STEP, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import (
    alpha_steps,
    below_page_band,
    dashed,
    line_and_area,
    override_props,
    queries,
    steps,
    ts_panel,
)


def alpha_over_time(ctx: Context) -> Any:
    return (ts_panel(
        "α over time vs break-even",
        "Pooled α per model over a sliding $window (from counters), with the sidecar's break-even α dashed. "
        f"The red band is below the page threshold ({ctx.page:.0%}).",
        queries((ctx.alpha(), "α " + ctx.legend), (q.break_even_in_force(ctx.scope), "break-even " + ctx.legend)),
        "percentunit")
        .min(0).max(1).thresholds(below_page_band(ctx)).thresholds_style(line_and_area())
        .override_by_query("B", dashed()))


def speedup_over_time(ctx: Context) -> Any:
    return (ts_panel(
        "Expected speedup over time",
        f"Modelled speedup per model; the line at {ctx.cfg.verdict.hurting_below:g}× is break-even, below it "
        "spec decode hurts.", queries((ctx.speedup(), ctx.legend)), UNIT_SPEEDUP)
        .thresholds(steps((None, RED), (ctx.cfg.verdict.hurting_below, "transparent")))
        .thresholds_style(line_and_area()).axis_soft_min(0.5).axis_soft_max(2))


def alpha_by_pod(ctx: Context) -> Any:
    return (ts_panel(
        "α by pod and engine (sidecar gauge)",
        f'{m.ACCEPTANCE_RATIO.name}{{window="$window"}} as each sidecar computes it — one line per target and '
        "data-parallel engine, to find the one bad pod. Not averaged: pooled values are in the panel on the left.",
        queries((ctx.windowed(m.ACCEPTANCE_RATIO.name), "{{model_name}} {{pod}}{{instance}} engine {{engine}}")),
        "percentunit")
        .min(0).max(1).thresholds(steps(*alpha_steps(ctx)))
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED)))


def mean_length_over_time(ctx: Context) -> Any:
    return ts_panel(
        "Mean acceptance length and token acceptance probability",
        "Mean acceptance length (tokens per target forward pass, left axis) and Leviathan's per-token "
        "acceptance probability (right axis; a different quantity from α, from the sidecar's per-position fit).",
        queries((ctx.mean_length(), "mean length " + ctx.legend),
                (ctx.windowed(m.TOKEN_ACCEPTANCE_PROBABILITY.name),
                 "per-token p {{model_name}} {{pod}}{{instance}} engine {{engine}}")),
        UNIT_TOKENS_PER_STEP,
    ).override_by_query("B", override_props(unit="percentunit", min=0, max=1, custom__axisPlacement="right"))


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Acceptance over time", (alpha_over_time, speedup_over_time, alpha_by_pod, mean_length_over_time))
