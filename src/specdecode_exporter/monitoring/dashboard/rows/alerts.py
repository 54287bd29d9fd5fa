"""The dashboard's row: What the alerts see."""

from __future__ import annotations

from typing import Any

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring import rules
from specdecode_exporter.monitoring.dashboard.context import Context, Row
from specdecode_exporter.monitoring.dashboard.panels import below_page_band, dashed, line_and_area, queries, ts_panel


def alerts_alpha(ctx: Context) -> Any:
    cfg, sel, legend = ctx.cfg, ctx.rule_matchers, ctx.legend
    short_rule, long_rule = rules.alpha_record(cfg, cfg.short_window), rules.alpha_record(cfg, cfg.long_window)
    base, drop = rules.baseline_record(cfg), cfg.thresholds.drift_drop
    return (ts_panel(
        "α as the alerts see it (recording rules)",
        f"The recording rules the alerts fire on ({short_rule}, {long_rule}; the alert level's filters only: these "
        f"are per model). Red band: the page (critical) threshold {ctx.page:.0%}. Dashed: the "
        f"{cfg.baseline_range} baseline ({base}, ending {cfg.baseline_offset} ago) and the drift threshold "
        f"{drop:.0%} below it (SpecDecodeAcceptanceRateDrift); they need {cfg.baseline_range} of history.",
        queries((f"{short_rule}{{{sel}}}", f"{cfg.short_window} " + legend),
                (f"{long_rule}{{{sel}}}", f"{cfg.long_window} " + legend),
                (f"{base}{{{sel}}}", f"{cfg.baseline_range} baseline " + legend),
                (f"{base}{{{sel}}} - {q.fmt_num(drop)}", f"drift threshold (baseline − {drop:.0%}) " + legend)),
        "percentunit")
        .override_by_query("C", dashed()).override_by_query("D", dashed())
        .min(0).max(1).thresholds(below_page_band(ctx)).thresholds_style(line_and_area()))


def alerts_interval_quantiles(ctx: Context) -> Any:
    cfg = ctx.cfg
    records = [(q.record_name(cfg.alert_level, m.INTERVAL_ACCEPTANCE.name,
                                  f"{m.quantile_name(quantile)}_rate{cfg.long_window}"), quantile)
               for quantile in cfg.quantiles]
    return ts_panel(
        "Per-interval α quantiles (recording rules)",
        f"The quantile recording rules behind SpecDecodeIntervalAcceptanceLow (over {cfg.long_window}).",
        queries(*((f"{record}{{{ctx.rule_matchers}}}", f"{m.quantile_name(quantile).upper()} " + ctx.legend)
                  for record, quantile in records)),
        "percentunit").min(0).max(1)


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("What the alerts see", (alerts_alpha, alerts_interval_quantiles))
