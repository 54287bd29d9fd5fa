"""The dashboard's row: Is it paying off, measured? Latency against a baseline over $window."""

from __future__ import annotations

from typing import Any

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring.dashboard.context import RED, UNIT_SPEEDUP, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import (
    dashed,
    line_and_area,
    override_props,
    queries,
    steps,
    ts_panel,
)


def tpot_spec_vs_control(ctx: Context) -> Any:
    return (ts_panel(
        "Time per output token: with spec decode and without",
        "Mean and P99 time per output token over $window, pooled per model from the sidecars' re-export of vLLM's "
        "per-request histogram: spec_decode=true are the spec-decode pods, false the control pods (the same model "
        "with spec decode off). Spec decode should lower TPOT; it does not help time to first token.",
        queries((ctx.tpot_mean("true"), "mean with " + ctx.legend),
                (ctx.tpot_mean("false"), "mean without " + ctx.legend),
                (ctx.tpot_quantile(0.99, "true"), "P99 with " + ctx.legend),
                (ctx.tpot_quantile(0.99, "false"), "P99 without " + ctx.legend)),
        "s", w=8)
        .min(0).override_by_query("C", dashed()).override_by_query("D", dashed()))


def observed_vs_modelled(ctx: Context) -> Any:
    hurting = ctx.cfg.verdict.hurting_below
    return (ts_panel(
        "Observed vs modelled speedup",
        "Observed: baseline TPOT / current TPOT (mean, P50, P99), against the control pods where there are any, "
        "else each pod's own baseline (the best pod). Modelled: the cost model from α. P99 below 1× while P50 is "
        "above is a tail regression. If the two disagree, trust the observed one and read the calibrated cost. "
        "Before shipping a change, measure it with `specdecode-exporter probe --baseline-url`.",
        queries((ctx.observed("mean"), "observed mean " + ctx.legend),
                (ctx.observed("p50"), "observed P50 " + ctx.legend),
                (ctx.observed("p99"), "observed P99 " + ctx.legend), (ctx.speedup(), "modelled " + ctx.legend)),
        UNIT_SPEEDUP, w=8)
        .thresholds(steps((None, RED), (hurting, "transparent"))).thresholds_style(line_and_area())
        .override_by_query("D", dashed()))


def load_and_break_even(ctx: Context) -> Any:
    by = ctx.scope.by_clause
    return (ts_panel(
        "α against break-even at load and calibrated",
        "Pooled α, with the break-even α at the current batch (the cost model's c_verify grown toward "
        "c_verify_max as the batch nears saturating_batch: a model) and the cost calibrated to the observed "
        "speedup (measured; where a baseline exists). Running requests on the right axis.",
        queries((ctx.alpha(), "α " + ctx.legend),
                (f"max by ({by}) ({ctx.windowed(m.BREAK_EVEN_AT_LOAD.name)})", "break-even at load " + ctx.legend),
                (f"max by ({by}) ({ctx.windowed(m.CALIBRATED_COST.name)})", "calibrated " + ctx.legend),
                (f"sum by ({by}) ({ctx.windowed(m.REQUESTS_RUNNING.name)})", "running " + ctx.legend)),
        "percentunit", w=8)
        .min(0).override_by_query("B", dashed()).override_by_query("C", dashed())
        .override_by_query("D", override_props(unit="short", custom__axisPlacement="right", max=None)))


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Is it paying off, measured? (latency against a baseline, window $window)",
          (tpot_spec_vs_control, observed_vs_modelled, load_and_break_even))
