"""The dashboard's row: Per request: which traffic does spec decode hurt? (the request tap)"""

from __future__ import annotations

from typing import Any

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring import rules
from specdecode_exporter.monitoring.dashboard.context import (
    GREEN,
    RATE_INTERVAL,
    RED,
    UNIT_TOKENS_PER_S,
    YELLOW,
    Context,
    Row,
)
from specdecode_exporter.monitoring.dashboard.panels import (
    acceptance_heatmap,
    below_page_band,
    dashed,
    line_and_area,
    override_props,
    queries,
    query,
    stat_panel,
    steps,
    ts_panel,
)


def request_heatmap(ctx: Context) -> Any:
    return acceptance_heatmap(
        "Per-request α over time",
        "One observation per completion request through the request tap: that request's own α from vLLM's "
        "per-request metrics (--per-request-spec-decode-metrics summary). A band of mass below the page threshold "
        "is traffic spec decode slows down, however healthy the aggregate α looks. Empty without the tap "
        "(--tap.listen-address).",
        ctx.pooled.increase_by_le("request", RATE_INTERVAL), "No tapped requests")


def requests_below_page(ctx: Context) -> Any:
    bound, quantile = rules.below_page_bound(ctx.cfg), ctx.cfg.thresholds.request_quantile
    name = m.quantile_name(quantile).upper()
    share = f"{ctx.pooled.share_below('request', bound, '$window')}\nor\n" \
            f"{ctx.pooled.share_below('engine_request', bound, '$window')}"
    low = f"{ctx.pooled.quantile(quantile, 'request', '$window')}\nor\n" \
          f"{ctx.pooled.quantile(quantile, 'engine_request', '$window')}"
    return (stat_panel(
        ctx, f"Requests with α ≤ {bound:g}",
        f"Share of tapped requests over $window whose own α was at most {bound:g} (the page threshold's bucket), "
        f"and the {name} of per-request α. A {name} below the page threshold is the "
        "SpecDecodeRequestAcceptanceLow ticket. Without the tap, from vLLM's own per-request histogram where it "
        "exports one (specdecode_engine_request_acceptance_ratio).",
        share, "percentunit", w=4, h=9)
        .targets([query(share, "share " + ctx.legend, ref="A", instant=True),
                  query(low, f"{name} α " + ctx.legend, ref="B", instant=True)])
        .thresholds(steps((None, GREEN), (0.1, YELLOW), (0.25, RED))).decimals(1).no_value("No tapped requests"))


def _band_alpha(ctx: Context, label: str) -> str:
    return ctx.pooled.ratio("request_accepted", "request_drafted", "$window", by_also=(label,))


def alpha_by_band(ctx: Context) -> Any:
    return (ts_panel(
        "α by temperature band and by workload",
        "Exact α of the tapped requests (their accepted over their drafted tokens) per temperature band and per "
        "workload (the tap's workload header). The band that sits below the page threshold is the one to route "
        "away from spec decode (SpecDecodeBandAcceptanceLow).",
        queries((_band_alpha(ctx, "temperature"), "T {{temperature}} {{model_name}}"),
                (_band_alpha(ctx, "workload"), "{{workload}} {{model_name}}")),
        "percentunit", w=8, h=9)
        .min(0).max(1).thresholds(below_page_band(ctx)).thresholds_style(line_and_area())
        .override_by_query("B", dashed()))


def speed_by_acceptance(ctx: Context) -> Any:
    mean = ctx.pooled.ratio("request_speed_sum", "request_speed_count", "$window", by_also=("acceptance",))
    return ts_panel(
        "Request speed by acceptance band",
        "Mean generation speed (output tokens per second) of the tapped requests in each band of their own α: "
        "are the low-α requests the slow ones? (The distribution: specdecode_request_output_tokens_per_second.)",
        queries((mean, "α {{acceptance}} {{model_name}}")),
        UNIT_TOKENS_PER_S, w=12, h=8).min(0)


def requests_without_metrics(ctx: Context) -> Any:
    return ts_panel(
        "Tapped requests without spec-decode metrics",
        "By reason: not_enabled means vLLM runs without --per-request-spec-decode-metrics; n_gt_1 and "
        "multi_prompt are requests vLLM gives no per-request figures for; the rest are failures.",
        queries((ctx.staged_sum("requests_without_spec", ("reason",)), "{{reason}}")),
        "reqps", w=12, h=8).min(0)


def page_variance(ctx: Context) -> Any:
    """The variance per drafted token the page divides by: measured on the tapped requests, or assumed."""
    gauge = q.selector(m.ACCEPTANCE_VARIANCE.name, ctx.tapped.also('window="$window"'))  # per model: no engine
    bound = q.selector(rules.variance_record(ctx.cfg, "bound"), ctx.rule_matchers)
    requests = q.selector(rules.tapped_requests_record(ctx.cfg), ctx.rule_matchers)
    return (ts_panel(
        "The page's variance per drafted token: measured or assumed",
        "What the page's test divides by. Per sidecar over $window: source=measured, the upper confidence bound of "
        "v measured on the tapped requests (never below α(1 − α)), once the window holds statistics.min_requests "
        "requests; source=assumed, the monitoring config's bound (draft_tokens_per_request, request_acceptance_sd). "
        "Dashed: the rules' bound over the fleet (the hour before the last 10 minutes), which the page uses where it "
        "exists. Right axis: the tapped requests of the last hour it rests on. Measured above assumed for an hour is "
        "SpecDecodeDispersionAboveAssumed.",
        queries((f"max by (model_name, source) ({gauge})", "{{source}} {{model_name}}"),
                (bound, "page's bound {{model_name}}"), (requests, "requests (1h) {{model_name}}")),
        "short", w=24, h=8)
        .min(0).override_by_query("B", dashed())
        .override_by_query("C", override_props(unit="short", custom__axisPlacement="right")))


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Per request: which traffic does spec decode hurt? (the request tap)",
          (request_heatmap, alpha_by_band, requests_below_page, speed_by_acceptance, requests_without_metrics,
           page_variance))
