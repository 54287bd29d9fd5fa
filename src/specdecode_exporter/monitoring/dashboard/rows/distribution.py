"""The dashboard's row: How is α distributed? The per-interval histogram the tickets read."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models import common as cm

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring.dashboard.context import GREEN, RATE_INTERVAL, RED, YELLOW, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import (
    acceptance_heatmap,
    below_page_band,
    line_and_area,
    queries,
    stat_panel,
    steps,
    ts_panel,
)


def interval_heatmap(ctx: Context) -> Any:
    return acceptance_heatmap(
        "Per-interval α distribution",
        "One observation per sidecar collection interval that had drafts: that interval's α (histogram "
        f"{m.INTERVAL_ACCEPTANCE.name}, buckets of 5 points). Mass below the page threshold means spec decode "
        "is net-negative that share of the time, even if the mean looks fine.",
        ctx.pooled.increase_by_le("interval", RATE_INTERVAL), "No traffic")


def interval_quantiles(ctx: Context) -> Any:
    return (ts_panel(
        "Per-interval α: P10 / P50 / P90",
        "Quantiles of the per-interval α histogram over $window (interpolated within 5-point buckets). "
        f"P10 below {ctx.page:.0%} means at least a tenth of the intervals were net-negative "
        "(the SpecDecodeIntervalAcceptanceLow alert).",
        queries(*((ctx.pooled.quantile(quantile, "interval", "$window"),
                   f"P{round(quantile * 100)} " + ctx.legend) for quantile in (0.1, 0.5, 0.9))),
        "percentunit", w=8, h=9)
        .min(0).max(1).thresholds(below_page_band(ctx)).thresholds_style(line_and_area()))


def intervals_below_page(ctx: Context) -> Any:
    return (stat_panel(
        ctx, f"Intervals with α < {ctx.page:.0%}",
        f"Share of collection intervals over $window whose α was below {ctx.page:.0%} (the histogram's "
        f'le="{ctx.page:g}" bucket over its count).',
        ctx.pooled.share_below("interval", ctx.page, "$window"), "percentunit", w=4, h=9)
        .thresholds(steps((None, GREEN), (0.1, YELLOW), (0.25, RED))).graph_mode(cm.BigValueGraphMode.AREA)
        .decimals(1))


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("How is α distributed?", (interval_heatmap, interval_quantiles, intervals_below_page))
