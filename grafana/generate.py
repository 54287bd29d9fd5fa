#!/usr/bin/env python3
"""Generate the specdecode Grafana dashboard from code.

    .venv/bin/python grafana/generate.py           # writes grafana/dashboards/specdecode.json
    .venv/bin/python grafana/generate.py --check   # exits 1 if the committed JSON is stale

Built with Grafana's own Python SDK (``grafana-foundation-sdk``, the build for Grafana 11.6), so every
panel, option and field config is a typed model that Grafana's schema generated. The JSON is committed;
tests/grafana/ checks that it matches this script, round-trips through the SDK, has a sane layout and that
every query returns data from a real Prometheus that scraped the sidecar and the simulator.

Conventions (DESIGN.md §4): ratios are aggregated from counters — numerator and denominator summed
separately, then divided, guarded with ``/ (… > 0)`` so an idle model shows "No traffic", never NaN.
The model-level aggregation (``by (namespace, model_name)``) is the one the recording rules and the page
use (alerts/config.yaml ``levels.model``), so at window=5m the headline α equals
``model:specdecode_acceptance_ratio:rate5m``. The "What the alerts see" row shows the recording rules
themselves.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import barchart, bargauge, heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

# ---------------------------------------------------------------------------------------------------------
# Configuration: the one block to edit.
# ---------------------------------------------------------------------------------------------------------
DASHBOARD_UID = "specdecode-overview"
TITLE = "Speculative decoding — is it paying off?"
TAGS = ["specdecode", "vllm", "llm-serving"]
REFRESH = "30s"
TIME_FROM = "now-3h"
DATASOURCE_VAR = "datasource"  # the datasource template variable every panel and query uses
WINDOWS = ["1m", "5m", "15m", "1h"]  # the sidecar's default --windows; also used as PromQL ranges
DEFAULT_WINDOW = "5m"  # the page's window (alerts/config.yaml windows.short)
RECORDED_SHORT, RECORDED_LONG = "5m", "1h"  # alerts/config.yaml windows.short / windows.long
DRIFT_DROP = 0.05  # alerts/config.yaml SpecDecodeAcceptanceRateDrift.drop
BASELINE_RULE = "model:specdecode_acceptance_ratio:baseline1d"
PAGE_THRESHOLD = 0.5  # α below this pages (alerts/config.yaml SpecDecodeAcceptanceRateLow.threshold)
ALPHA_GOOD = 0.6  # α at or above this is green; between PAGE_THRESHOLD and here is yellow
SPEEDUP_GOOD = 1.1  # expected speedup at or above this is "paying off"; 1.0 … this is "marginal"
ALERT_PREFIX = "SpecDecode"  # alert names in alerts/specdecode.rules.yaml
RUNBOOK_URL = "https://github.com/specdecode-exporter/specdecode-exporter/blob/main/alerts/runbook.md"
UNIT_TOKENS_PER_S = "si:tok/s"  # Grafana custom unit: SI-scaled "tok/s"
UNIT_SPEEDUP = "suffix:×"
UNIT_TOKENS_PER_STEP = "suffix: tok/step"

OUT = Path(__file__).resolve().parent / "dashboards" / "specdecode.json"

# Label selectors. The sidecar's series carry namespace/job/pod/instance (from Prometheus) plus model_name,
# engine and target. vLLM's own series come from a different scrape job and port, so only namespace, pod
# (sidecar and vLLM share the pod), model_name and engine apply to them. Health series may lack model_name
# (a target that never answered), so they filter on the scrape identity only.
SEL = (
    'namespace=~"$namespace", job=~"$job", pod=~"$pod", instance=~"$instance", '
    'model_name=~"$model_name", engine=~"$engine"'
)
VLLM_SEL = 'namespace=~"$namespace", pod=~"$pod", model_name=~"$model_name", engine=~"$engine"'
HEALTH_SEL = 'namespace=~"$namespace", job=~"$job", pod=~"$pod", instance=~"$instance"'
MODEL_RULE_SEL = 'namespace=~"$namespace", model_name=~"$model_name"'
MODEL = "namespace, model_name"  # the recording rules' model level
MODEL_LEGEND = "{{model_name}} {{namespace}}"

DS = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")

RED, YELLOW, GREEN, BLUE = "red", "yellow", "green", "blue"

# ---------------------------------------------------------------------------------------------------------
# PromQL helpers
# ---------------------------------------------------------------------------------------------------------


def rate(metric: str, rng: str = "$window", sel: str = SEL) -> str:
    return f"rate({metric}{{{sel}}}[{rng}])"


def sum_by(by: str, expr: str) -> str:
    return f"sum by ({by}) ({expr})"


def guarded_ratio(num: str, den: str) -> str:
    """num / den with an empty result (→ "No traffic") instead of NaN/Inf when den is 0."""
    return f"{num}\n/\n({den} > 0)"


def model_rate(metric: str, rng: str = "$window") -> str:
    return sum_by(MODEL, rate(metric, rng))


def alpha_expr(rng: str = "$window") -> str:
    return guarded_ratio(
        model_rate("specdecode_accepted_tokens_total", rng), model_rate("specdecode_draft_tokens_total", rng)
    )


def mean_length_expr() -> str:
    return "1 + " + guarded_ratio(model_rate("specdecode_accepted_tokens_total"), model_rate("specdecode_drafts_total"))


def break_even_expr() -> str:
    return f"max by ({MODEL}) (specdecode_break_even_acceptance_ratio{{{SEL}}})"


def speedup_expr() -> str:
    """DESIGN §5 from counters: S = (1 + A/D) / (1 + T/D · break-even), pooled over the model's pods."""
    drafts = f"({model_rate('specdecode_drafts_total')} > 0)"
    return (
        f"(1 + {model_rate('specdecode_accepted_tokens_total')} / {drafts})\n/\n"
        f"(1 + {model_rate('specdecode_draft_tokens_total')} / {drafts}\n   * {break_even_expr()})"
    )


def histogram_quantile_expr(q: float, metric: str, sel: str, by: str, rng: str) -> str:
    """histogram_quantile, guarded: no result (not NaN) when the histogram saw no observations."""
    buckets = sum_by(f"{by}, le", rate(f"{metric}_bucket", rng, sel))
    count = sum_by(by, rate(f"{metric}_count", rng, sel))
    return f"histogram_quantile({q}, {buckets})\nand on ({by})\n({count} > 0)"


# ---------------------------------------------------------------------------------------------------------
# Builder helpers
# ---------------------------------------------------------------------------------------------------------


def query(
    expr: str,
    legend: str = "__auto",
    *,
    ref: str = "A",
    instant: bool = False,
    fmt: pm.PromQueryFormat | None = None,
) -> pb.Dataquery:
    q = pb.Dataquery().expr(expr).ref_id(ref).datasource(DS).legend_format(legend)
    q = q.instant() if instant else q.range()
    if fmt is not None:
        q = q.format(fmt)
    return q


def queries(*items: tuple[str, str]) -> list[pb.Dataquery]:
    """Range queries (expr, legend) with refIds A, B, C, …"""
    return [query(expr, legend, ref=chr(ord("A") + i)) for i, (expr, legend) in enumerate(items)]


def steps(*pairs: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([dm.Threshold(value=v, color=c) for v, c in pairs])
    )


ALPHA_STEPS = ((None, RED), (PAGE_THRESHOLD, YELLOW), (ALPHA_GOOD, GREEN))
SPEEDUP_STEPS = ((None, RED), (1.0, YELLOW), (SPEEDUP_GOOD, GREEN))


def no_traffic_mappings() -> list[dm.ValueMapping]:
    return [
        dm.SpecialValueMap(
            options=dm.DashboardSpecialValueMapOptions(
                match=dm.SpecialValueMatch.NULL_AND_NAN,
                result=dm.ValueMappingResult(text="No traffic", color="text", index=0),
            )
        )
    ]


def up_mappings() -> list[dm.ValueMapping]:
    return [
        dm.ValueMap(
            options={
                "0": dm.ValueMappingResult(text="DOWN", color=RED, index=0),
                "1": dm.ValueMappingResult(text="UP", color=GREEN, index=1),
            }
        )
    ]


def legend_table(*calcs: str) -> cb.VizLegendOptions:
    return (
        cb.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.TABLE)
        .placement(cm.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(list(calcs))
    )


def tooltip_all() -> cb.VizTooltipOptions:
    return cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)


def override_props(**props: Any) -> list[dm.DynamicConfigValue]:
    return [dm.DynamicConfigValue(id_val=k.replace("__", "."), value=v) for k, v in props.items()]


def dashed_line() -> dict[str, Any]:
    return {"fill": "dash", "dash": [10, 10]}


def stat_panel(
    title: str, description: str, expr: str, unit: str, *, w: int = 4, h: int = 5, legend: str = MODEL_LEGEND
) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(w)
        .height(h)
        .with_target(query(expr, legend, instant=True))
        .unit(unit)
        .no_value("No traffic")
        .mappings(no_traffic_mappings())
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields(""))
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.NONE)
        .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
        .justify_mode(cm.BigValueJustifyMode.AUTO)
        .orientation(cm.VizOrientation.AUTO)
    )


def ts_panel(
    title: str, description: str, targets: Sequence[pb.Dataquery], unit: str, *, w: int = 12, h: int = 8
) -> timeseries.Panel:
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(w)
        .height(h)
        .targets(list(targets))
        .unit(unit)
        .no_value("No traffic")
        .line_width(2)
        .fill_opacity(10)
        .show_points(cm.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(legend_table("lastNotNull", "min", "mean"))
        .tooltip(tooltip_all())
    )


# ---------------------------------------------------------------------------------------------------------
# Rows. One function per row; each returns its panels in reading order (the SDK lays them out left to
# right, wrapping at 24 columns).
# ---------------------------------------------------------------------------------------------------------


def row_verdict() -> list[Any]:
    """Is spec decode paying off right now?"""
    alpha = (
        stat_panel(
            "Acceptance rate α",
            "α = accepted draft tokens / drafted tokens over $window, pooled over the "
            "selected pods and engines "
            "(sums of counter rates, then divided). Red below the page threshold "
            f"({PAGE_THRESHOLD:.0%}), green from {ALPHA_GOOD:.0%}.",
            alpha_expr(),
            "percentunit",
        )
        .thresholds(steps(*ALPHA_STEPS))
        .min(0)
        .max(1)
        .decimals(1)
    )
    length = (
        stat_panel(
            "Mean acceptance length",
            "Tokens produced per target forward pass: 1 + accepted / drafts (vLLM's definition; includes the "
            "bonus token). 1.0 means every draft was rejected.",
            mean_length_expr(),
            UNIT_TOKENS_PER_STEP,
        )
        .thresholds(steps((None, BLUE)))
        .color_mode(cm.BigValueColorMode.VALUE)
        .decimals(2)
    )
    speedup = (
        stat_panel(
            "Expected speedup",
            "Modelled speedup over plain decoding (DESIGN §5): (1 + accepted/drafts) / (1 + "
            "draft_tokens/drafts · "
            "break-even α), pooled over the selected pods. Below 1× spec decode costs more than it saves. "
            "A model of the cost, not a measurement: compare with the latency row.",
            speedup_expr(),
            UNIT_SPEEDUP,
        )
        .thresholds(steps(*SPEEDUP_STEPS))
        .decimals(2)
    )
    break_even = (
        stat_panel(
            "Break-even α",
            "α below which spec decode costs more than it saves, from the sidecar's cost model "
            "(c_draft + c_verify, see the sidecar config). Highest value over the selected pods.",
            break_even_expr(),
            "percentunit",
        )
        .thresholds(steps((None, BLUE)))
        .color_mode(cm.BigValueColorMode.VALUE)
        .decimals(1)
    )
    verdict = (
        stat_panel(
            "Verdict",
            f"From the expected speedup: below 1× 'Hurting', 1–{SPEEDUP_GOOD}× 'Marginal', "
            f"from {SPEEDUP_GOOD}× "
            "'Paying off'. 'No traffic' when the model drafted nothing over $window.",
            speedup_expr(),
            "none",
        )
        .mappings(
            [
                *no_traffic_mappings(),
                dm.RangeMap(
                    options=dm.DashboardRangeMapOptions(
                        from_val=0, to=1.0, result=dm.ValueMappingResult(text="Hurting", color=RED, index=1)
                    )
                ),
                dm.RangeMap(
                    options=dm.DashboardRangeMapOptions(
                        from_val=1.0,
                        to=SPEEDUP_GOOD,
                        result=dm.ValueMappingResult(text="Marginal", color=YELLOW, index=2),
                    )
                ),
                dm.RangeMap(
                    options=dm.DashboardRangeMapOptions(
                        from_val=SPEEDUP_GOOD,
                        to=1e9,
                        result=dm.ValueMappingResult(text="Paying off", color=GREEN, index=3),
                    )
                ),
            ]
        )
        .thresholds(steps(*SPEEDUP_STEPS))
    )
    k_advice = (
        stat_panel(
            "k: configured → recommended",
            "Configured k = number of draft positions the sidecar sees (DESIGN §3). Recommended k' = the "
            "sidecar's argmax of expected speedup over k' ≤ k over $window (highest over the selected pods).",
            "",
            "none",
        )
        .targets(
            [
                query(
                    f"count by ({MODEL}) (count by ({MODEL}, position) "
                    f"(specdecode_accepted_tokens_by_position_total{{{SEL}}}))",
                    "configured {{model_name}}",
                    ref="A",
                    instant=True,
                ),
                query(
                    f'max by ({MODEL}) (specdecode_recommended_num_speculative_tokens{{{SEL}, window="$window"}})',
                    "recommended {{model_name}}",
                    ref="B",
                    instant=True,
                ),
            ]
        )
        .thresholds(steps((None, BLUE)))
        .color_mode(cm.BigValueColorMode.VALUE)
        .decimals(0)
    )
    return [
        db.Row("Is speculative decoding paying off? (window $window)"),
        alpha,
        length,
        speedup,
        break_even,
        verdict,
        k_advice,
    ]


def row_trends() -> list[Any]:
    alpha_ts = (
        ts_panel(
            "α over time vs break-even",
            "Pooled α per model over a sliding $window (from counters), with the sidecar's "
            "break-even α dashed. "
            f"The red band is below the page threshold ({PAGE_THRESHOLD:.0%}).",
            queries((alpha_expr(), "α " + MODEL_LEGEND), (break_even_expr(), "break-even " + MODEL_LEGEND)),
            "percentunit",
        )
        .min(0)
        .max(1)
        .thresholds(steps((None, RED), (PAGE_THRESHOLD, "transparent")))
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE_AND_AREA))
        .override_by_query("B", override_props(custom__lineStyle=dashed_line(), custom__fillOpacity=0))
    )
    speedup_ts = (
        ts_panel(
            "Expected speedup over time",
            "Modelled speedup (DESIGN §5) per model; the line at 1× is break-even, below it spec decode hurts.",
            queries((speedup_expr(), MODEL_LEGEND)),
            UNIT_SPEEDUP,
        )
        .thresholds(steps((None, RED), (1.0, "transparent")))
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE_AND_AREA))
        .axis_soft_min(0.5)
        .axis_soft_max(2)
    )
    per_pod = (
        ts_panel(
            "α by pod and engine (sidecar gauge)",
            'specdecode_acceptance_ratio{window="$window"} as each sidecar computes it — one '
            "line per target and "
            "data-parallel engine, to find the one bad pod. Not averaged: pooled values are "
            "in the panel on the left.",
            queries(
                (
                    f'specdecode_acceptance_ratio{{{SEL}, window="$window"}}',
                    "{{model_name}} {{pod}}{{instance}} engine {{engine}}",
                )
            ),
            "percentunit",
        )
        .min(0)
        .max(1)
        .thresholds(steps(*ALPHA_STEPS))
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    )
    length_ts = ts_panel(
        "Mean acceptance length and token acceptance probability",
        "Mean acceptance length (tokens per target forward pass, left axis) and Leviathan's per-token "
        "acceptance probability (right axis; a different quantity from α, from the "
        "sidecar's per-position fit).",
        queries(
            (mean_length_expr(), "mean length " + MODEL_LEGEND),
            (
                f'specdecode_token_acceptance_probability{{{SEL}, window="$window"}}',
                "per-token p {{model_name}} {{pod}}{{instance}} engine {{engine}}",
            ),
        ),
        UNIT_TOKENS_PER_STEP,
    ).override_by_query("B", override_props(unit="percentunit", min=0, max=1, custom__axisPlacement="right"))
    return [db.Row("Acceptance over time"), alpha_ts, speedup_ts, per_pod, length_ts]


def row_distribution() -> list[Any]:
    metric = "specdecode_interval_acceptance_ratio"
    hm_panel = (
        heatmap.Panel()
        .title("Per-interval α distribution")
        .description(
            "One observation per sidecar collection interval that had drafts: that interval's α "
            "(histogram specdecode_interval_acceptance_ratio, buckets of 5 points). Mass below the page "
            "threshold means spec decode is net-negative that share of the time, even if the mean looks fine."
        )
        .datasource(DS)
        .span(12)
        .height(9)
        .with_target(
            query(
                sum_by("le", f"increase({metric}_bucket{{{SEL}}}[$__rate_interval])"),
                "{{le}}",
                fmt=pm.PromQueryFormat.HEATMAP,
            )
        )
        .calculate(False)
        .unit("short")
        .no_value("No traffic")
        .y_axis(heatmap.YAxisConfig().unit("percentunit").min(0).max(1).decimals(0))
        .color(
            heatmap.HeatmapColorOptions()
            .mode(hm.HeatmapColorMode.SCHEME)
            .scheme("Spectral")
            .scale(hm.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
            .fill("dark-orange")
        )
        .cell_gap(1)
        .cell_values(heatmap.CellValues().unit("short"))
        .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE))
        .show_value(cm.VisibilityMode.NEVER)
        .show_legend()
        .mode(cm.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_color_scale(True)
        .scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LINEAR))
        .hide_from(cb.HideSeriesConfig().legend(False).tooltip(False).viz(False))
    )
    quantiles = (
        ts_panel(
            "Per-interval α: P10 / P50 / P90",
            "Quantiles of the per-interval α histogram over $window (interpolated within 5-point buckets). "
            f"P10 below {PAGE_THRESHOLD:.0%} means at least a tenth of the intervals were net-negative "
            "(the SpecDecodeIntervalAcceptanceLow alert).",
            queries(
                *(
                    (
                        histogram_quantile_expr(q, metric, SEL, MODEL, "$window"),
                        f"P{round(q * 100)} " + MODEL_LEGEND,
                    )
                    for q in (0.1, 0.5, 0.9)
                )
            ),
            "percentunit",
        )
        .min(0)
        .max(1)
        .thresholds(steps((None, RED), (PAGE_THRESHOLD, "transparent")))
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE_AND_AREA))
    )
    below = (
        stat_panel(
            f"Intervals with α < {PAGE_THRESHOLD:.0%}",
            f"Share of collection intervals over $window whose α was below {PAGE_THRESHOLD:.0%} "
            f'(the histogram\'s le="{PAGE_THRESHOLD}" bucket over its count).',
            guarded_ratio(
                sum_by(MODEL, rate(f"{metric}_bucket", sel=f'{SEL}, le="{PAGE_THRESHOLD}"')),
                sum_by(MODEL, rate(f"{metric}_count")),
            ),
            "percentunit",
            w=4,
            h=9,
        )
        .thresholds(steps((None, GREEN), (0.1, YELLOW), (0.25, RED)))
        .graph_mode(cm.BigValueGraphMode.AREA)
        .decimals(1)
    )
    # Make the row add up to 24 columns: heatmap 12 + quantiles 8 + share 4.
    quantiles = quantiles.span(8).height(9)
    return [db.Row("How is α distributed?"), hm_panel, quantiles, below]


def row_positions() -> list[Any]:
    by_pos = "specdecode_accepted_tokens_by_position_total"
    drafts = "specdecode_drafts_total"
    curve_expr = f"sum by (position) ({rate(by_pos)})\n/ on () group_left ()\n(sum ({rate(drafts)}) > 0)"
    curve = (
        barchart.Panel()
        .title("Acceptance by draft position (now)")
        .description(
            "P(accepted prefix > i) for each draft position i over $window: per-position "
            "accepted counts / drafts, "
            "pooled over the selected pods (pick one model for a clean curve). Where it "
            "falls off, later draft "
            "tokens are mostly wasted work."
        )
        .datasource(DS)
        .span(8)
        .height(9)
        .with_target(query(curve_expr, "{{position}}", instant=True, fmt=pm.PromQueryFormat.TABLE))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="convertFieldType",
                options={
                    "conversions": [{"targetField": "position", "destinationType": "number"}],
                    "fields": {},
                },
            )
        )
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="sortBy", options={"fields": {}, "sort": [{"field": "position", "desc": False}]}
            )
        )
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": {},
                    "renameByName": {"Value": "P(prefix > i)"},
                },
            )
        )
        .x_field("position")
        .unit("percentunit")
        .min(0)
        .max(1)
        .no_value("No traffic")
        .thresholds(steps(*ALPHA_STEPS))
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
        .show_value(cm.VisibilityMode.AUTO)
        .orientation(cm.VizOrientation.VERTICAL)
        .x_tick_label_rotation(0)
        .line_width(1)
        .fill_opacity(80)
        .gradient_mode(cm.GraphGradientMode.NONE)
        .legend(
            cb.VizLegendOptions()
            .show_legend(False)
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .calcs([])
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE).sort(cm.SortOrder.NONE))
    )
    curve_ts = (
        ts_panel(
            "Acceptance by draft position over time",
            "The same curve over time, one line per position: a drop that starts at a late "
            "position is a draft "
            "getting stale; a drop at position 0 is a task-mix or temperature change.",
            queries(
                (
                    f"sum by ({MODEL}, position) ({rate(by_pos)})\n/ on ({MODEL}) group_left ()\n"
                    f"({model_rate(drafts)} > 0)",
                    "pos {{position}} {{model_name}}",
                )
            ),
            "percentunit",
            w=8,
            h=9,
        )
        .min(0)
        .max(1)
    )
    by_k = (
        bargauge.Panel()
        .title("Expected speedup by k'")
        .description(
            "The sidecar's modelled speedup (DESIGN §5) for each shorter k' ≤ k, from the "
            "per-position curve over "
            "$window (mean over the selected sidecars). The longest bar is the k to configure; compare with "
            "'k: configured → recommended' above."
        )
        .datasource(DS)
        .span(8)
        .height(9)
        .with_target(
            query(
                f"avg by (model_name, num_speculative_tokens) "
                f'(specdecode_expected_speedup_by_length{{{SEL}, window="$window"}})',
                "k'={{num_speculative_tokens}} {{model_name}}",
                instant=True,
            )
        )
        .unit(UNIT_SPEEDUP)
        .decimals(2)
        .min(0)
        .no_value("No traffic")
        .thresholds(steps(*SPEEDUP_STEPS))
        .display_mode(cm.BarGaugeDisplayMode.GRADIENT)
        .orientation(cm.VizOrientation.HORIZONTAL)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields(""))
        .show_unfilled(True)
        .value_mode(cm.BarGaugeValueMode.COLOR)
        .name_placement(cm.BarGaugeNamePlacement.AUTO)
        .sizing(cm.BarGaugeSizing.AUTO)
        .min_viz_height(16)
        .min_viz_width(8)
        .max_viz_height(300)
    )
    return [
        db.Row("Where along the draft does acceptance fall off, and which k is better?"),
        curve,
        curve_ts,
        by_k,
    ]


def row_token_flow() -> list[Any]:
    ri = "$__rate_interval"
    flow = (
        ts_panel(
            "Token flow",
            "Drafted, accepted and rejected (drafted − accepted) draft tokens per second, "
            "and all emitted tokens, "
            "pooled per model. Rejected tokens are the draft and verification work that bought nothing.",
            queries(
                (model_rate("specdecode_draft_tokens_total", ri), "drafted " + MODEL_LEGEND),
                (model_rate("specdecode_accepted_tokens_total", ri), "accepted " + MODEL_LEGEND),
                (
                    f"{model_rate('specdecode_draft_tokens_total', ri)}\n-\n"
                    f"{model_rate('specdecode_accepted_tokens_total', ri)}",
                    "rejected " + MODEL_LEGEND,
                ),
                (model_rate("specdecode_emitted_tokens_total", ri), "emitted " + MODEL_LEGEND),
            ),
            UNIT_TOKENS_PER_S,
        )
        .min(0)
        .override_by_query("C", override_props(color={"mode": "fixed", "fixedColor": RED}))
        .override_by_query("B", override_props(color={"mode": "fixed", "fixedColor": GREEN}))
    )
    drafts = ts_panel(
        "Verification steps with a draft",
        "Drafts per second (one per request per engine step that carried a draft), per model.",
        queries((model_rate("specdecode_drafts_total", ri), MODEL_LEGEND)),
        "reqps",
    ).min(0)
    return [db.Row("Token flow"), flow.span(16), drafts.span(8)]


def row_latency() -> list[Any]:
    ri = "$__rate_interval"
    tpot = "vllm:request_time_per_output_token_seconds"
    itl = "vllm:inter_token_latency_seconds"
    by = "model_name"
    tpot_panel = ts_panel(
        "Time per output token (vLLM) p50 / p99",
        "vLLM's per-request TPOT histogram (true time per generated token; vLLM ≥ 0.11). This is what spec "
        "decode should lower: read it beside α. Filters: namespace, pod, model_name, "
        "engine (vLLM's own scrape).",
        queries(
            (histogram_quantile_expr(0.5, tpot, VLLM_SEL, by, ri), "p50 {{model_name}}"),
            (histogram_quantile_expr(0.99, tpot, VLLM_SEL, by, ri), "p99 {{model_name}}"),
        ),
        "s",
        w=8,
    ).min(0)
    itl_panel = ts_panel(
        "Inter-token latency (vLLM) p50 / p99",
        "vLLM's inter-token latency: one sample per engine step, which emits 1 … k+1 "
        "tokens under spec decode, "
        "so it rises while TPOT falls when acceptance is good.",
        queries(
            (histogram_quantile_expr(0.5, itl, VLLM_SEL, by, ri), "p50 {{model_name}}"),
            (histogram_quantile_expr(0.99, itl, VLLM_SEL, by, ri), "p99 {{model_name}}"),
        ),
        "s",
        w=8,
    ).min(0)
    load = (
        ts_panel(
            "Running requests and generated tokens (vLLM)",
            "Load context: requests running (left) and vLLM's generated tokens per second "
            "(right). Acceptance and "
            "the verification cost both move with batch size.",
            queries(
                (f"sum by ({by}) (vllm:num_requests_running{{{VLLM_SEL}}})", "running {{model_name}}"),
                (sum_by(by, rate("vllm:generation_tokens_total", ri, VLLM_SEL)), "generated {{model_name}}"),
            ),
            "short",
            w=8,
        )
        .min(0)
        .override_by_query("B", override_props(unit=UNIT_TOKENS_PER_S, custom__axisPlacement="right"))
    )
    return [db.Row("Latency beside it (vLLM)"), tpot_panel, itl_panel, load]


def row_alert_view() -> list[Any]:
    short_rule = f"model:specdecode_acceptance_ratio:rate{RECORDED_SHORT}"
    long_rule = f"model:specdecode_acceptance_ratio:rate{RECORDED_LONG}"
    page = (
        ts_panel(
            "α as the alerts see it (recording rules)",
            f"The recording rules the alerts fire on ({short_rule}, {long_rule}; namespace and model_name "
            "filters only: these are per model). Red band: the page (critical) threshold "
            f"{PAGE_THRESHOLD:.0%}. Dashed: the 1-day baseline ({BASELINE_RULE}, ending 1h ago) and "
            f"the drift threshold {DRIFT_DROP:.0%} below it (SpecDecodeAcceptanceRateDrift); they need a "
            "day of history.",
            queries(
                (f"{short_rule}{{{MODEL_RULE_SEL}}}", f"{RECORDED_SHORT} " + MODEL_LEGEND),
                (f"{long_rule}{{{MODEL_RULE_SEL}}}", f"{RECORDED_LONG} " + MODEL_LEGEND),
                (f"{BASELINE_RULE}{{{MODEL_RULE_SEL}}}", "1d baseline " + MODEL_LEGEND),
                (
                    f"{BASELINE_RULE}{{{MODEL_RULE_SEL}}} - {DRIFT_DROP}",
                    f"drift threshold (baseline − {DRIFT_DROP:.0%}) " + MODEL_LEGEND,
                ),
            ),
            "percentunit",
        )
        .override_by_query("C", override_props(custom__lineStyle=dashed_line(), custom__fillOpacity=0))
        .override_by_query("D", override_props(custom__lineStyle=dashed_line(), custom__fillOpacity=0))
        .min(0)
        .max(1)
        .thresholds(steps((None, RED), (PAGE_THRESHOLD, "transparent")))
        .thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE_AND_AREA))
    )
    p10_rule = f"model:specdecode_interval_acceptance_ratio:p10_rate{RECORDED_LONG}"
    p10 = (
        ts_panel(
            "Per-interval α P10 / P50 (recording rules)",
            f"The quantile recording rules behind SpecDecodeIntervalAcceptanceLow (over {RECORDED_LONG}).",
            queries(
                (f"{p10_rule}{{{MODEL_RULE_SEL}}}", "P10 " + MODEL_LEGEND),
                (
                    f"model:specdecode_interval_acceptance_ratio:p50_rate{RECORDED_LONG}{{{MODEL_RULE_SEL}}}",
                    "P50 " + MODEL_LEGEND,
                ),
            ),
            "percentunit",
        )
        .min(0)
        .max(1)
    )
    return [db.Row("What the alerts see"), page, p10]


def row_health() -> list[Any]:
    up = (
        stat_panel(
            "Sidecar → vLLM collection",
            "specdecode_up per sidecar target: 1 when the sidecar's last collection from vLLM succeeded.",
            f"min by (instance, target) (specdecode_up{{{HEALTH_SEL}}})",
            "none",
            legend="{{instance}} {{target}}",
            w=4,
            h=6,
        )
        .mappings(up_mappings())
        .no_value("No sidecar")
        .thresholds(steps((None, RED), (1, GREEN)))
    )
    scraped = (
        stat_panel(
            "Prometheus → sidecar scrape",
            "Prometheus' own up{} for the sidecar job: 0 means Prometheus cannot scrape the sidecar "
            "(SpecDecodeExporterDown). Only scrape targets that exported specdecode_up in the last day: "
            "vLLM's own job is left out.",
            f"min by (instance) (up{{{HEALTH_SEL}}}\n"
            f"  and on (job, instance) last_over_time(specdecode_up{{{HEALTH_SEL}}}[1d]))",
            "none",
            legend="{{instance}}",
            w=4,
            h=6,
        )
        .mappings(up_mappings())
        .no_value("No sidecar")
        .thresholds(steps((None, RED), (1, GREEN)))
    )
    errors = ts_panel(
        "Collection errors by reason",
        "Failed collections per second by reason (connect, timeout, http_status, too_large, parse, "
        "no_spec_metrics). no_spec_metrics after a vLLM upgrade means the metric names "
        "changed or spec decode "
        "is off.",
        queries(
            (
                f"sum by (reason) (rate(specdecode_collect_errors_total{{{HEALTH_SEL}}}[$__rate_interval]))",
                "{{reason}}",
            )
        ),
        "ops",
        w=6,
        h=6,
    ).min(0)
    duration = ts_panel(
        "Collection duration",
        "Duration of the sidecar's last collection (fetch + parse) per target.",
        queries(
            (
                f"max by (instance, target) (specdecode_collect_duration_seconds{{{HEALTH_SEL}}})",
                "{{instance}} {{target}}",
            )
        ),
        "s",
        w=4,
        h=6,
    ).min(0)
    alerts = (
        table.Panel()
        .title("Firing alerts")
        .description(
            f"Alerts named {ALERT_PREFIX}* now firing (Prometheus' ALERTS series). Alerts "
            "without a model_name "
            "label (sidecar absent, target down) are shown whatever model is selected. See "
            "the runbook link at "
            "the top."
        )
        .datasource(DS)
        .span(6)
        .height(6)
        .with_target(
            query(
                f'ALERTS{{alertname=~"{ALERT_PREFIX}.*", alertstate="firing", namespace=~"$namespace", '
                f'model_name=~"$model_name|"}}',
                "{{alertname}}",
                instant=True,
                fmt=pm.PromQueryFormat.TABLE,
            )
        )
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True, "__name__": True, "alertstate": True},
                    "indexByName": {"alertname": 0, "severity": 1, "model_name": 2},
                    "renameByName": {},
                },
            )
        )
        .unit("none")
        .no_value("No alerts firing")
        .cell_height(cm.TableCellHeight.SM)
        .show_header(True)
        .align(cm.FieldTextAlignment.AUTO)
        .inspect(False)
    )
    info = (
        table.Panel()
        .title("Sidecar targets")
        .description("specdecode_info: per target the API (vllm-v1, vllm-v0, …), method and configured k.")
        .datasource(DS)
        .span(24)
        .height(5)
        .with_target(query(f"specdecode_info{{{SEL}}}", "{{target}}", instant=True, fmt=pm.PromQueryFormat.TABLE))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True, "__name__": True},
                    "indexByName": {},
                    "renameByName": {},
                },
            )
        )
        .unit("none")
        .no_value("No sidecar")
        .cell_height(cm.TableCellHeight.SM)
        .show_header(True)
        .align(cm.FieldTextAlignment.AUTO)
        .inspect(False)
    )
    return [db.Row("Health"), up, scraped, errors, duration, alerts, info]


ROWS = (
    row_verdict,
    row_trends,
    row_distribution,
    row_positions,
    row_token_flow,
    row_latency,
    row_alert_view,
    row_health,
)

# ---------------------------------------------------------------------------------------------------------
# Variables, links, annotations, assembly
# ---------------------------------------------------------------------------------------------------------


def label_var(name: str, label: str, metric_selector: str, *, description: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DS)
        .query(f"label_values({metric_selector}, {name})")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )


def variables() -> list[Any]:
    ds = (
        db.DatasourceVariable(DATASOURCE_VAR)
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus that scrapes the sidecars and vLLM.")
        .current(dm.VariableOption(selected=True, text="default", value="default"))
    )
    window = (
        db.CustomVariable("window")
        .label("Window")
        .description("Window of the ratios: the sidecar's window label and the PromQL range of rate().")
        .values(",".join(WINDOWS))
        .current(dm.VariableOption(selected=True, text=DEFAULT_WINDOW, value=DEFAULT_WINDOW))
        .options([dm.VariableOption(selected=w == DEFAULT_WINDOW, text=w, value=w) for w in WINDOWS])
        .multi(False)
        .include_all(False)
    )
    return [
        ds,
        label_var("namespace", "Namespace", "specdecode_up", description="Kubernetes namespace (All outside k8s)."),
        label_var(
            "job",
            "Job",
            'specdecode_up{namespace=~"$namespace"}',
            description="The sidecar's scrape job (vLLM's own job is not filtered by it).",
        ),
        label_var(
            "model_name",
            "Model",
            'specdecode_drafts_total{namespace=~"$namespace", job=~"$job"}',
            description="vLLM's served model name.",
        ),
        label_var(
            "engine",
            "Engine",
            'specdecode_drafts_total{namespace=~"$namespace", job=~"$job", model_name=~"$model_name"}',
            description="vLLM data-parallel engine index.",
        ),
        label_var(
            "pod",
            "Pod",
            'specdecode_up{namespace=~"$namespace", job=~"$job"}',
            description="Pod (sidecar and vLLM share it; All outside k8s).",
        ),
        label_var(
            "instance",
            "Instance",
            'specdecode_up{namespace=~"$namespace", job=~"$job", pod=~"$pod"}',
            description="The sidecar's scrape address (vLLM's panels are not filtered by it).",
        ),
        window,
    ]


def build() -> dm.Dashboard:
    builder = (
        db.Dashboard(TITLE)
        .uid(DASHBOARD_UID)
        .description(
            "vLLM speculative decoding: acceptance rate α, break-even, modelled speedup, "
            "per-position acceptance, "
            "k advice and latency, from the specdecode-exporter sidecar. Generated by grafana/generate.py."
        )
        .tags(TAGS)
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time(TIME_FROM, "now")
        .timezone("browser")
        .refresh(REFRESH)
        .timepicker(db.TimePicker().refresh_intervals(["10s", "30s", "1m", "5m", "15m", "1h"]))
        .link(
            db.DashboardLink("Runbook")
            .type(dm.DashboardLinkType.LINK)
            .url(RUNBOOK_URL)
            .icon("doc")
            .tooltip("What to do when a specdecode alert fires")
            .target_blank(True)
            .as_dropdown(False)
            .include_vars(False)
            .keep_time(False)
            .tags([])
        )
        .annotation(
            db.AnnotationQuery()
            .name("Annotations & Alerts")
            .built_in(1)
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        )
        .annotation(
            db.AnnotationQuery()
            .name(f"{ALERT_PREFIX} alerts firing")
            .enable(True)
            .hide(False)
            .icon_color("red")
            .datasource(DS)
            .expr(f'ALERTS{{alertname=~"{ALERT_PREFIX}.*", alertstate="firing", namespace=~"$namespace"}}')
        )
        .variables(variables())
    )
    for row in ROWS:
        for item in row():
            builder = builder.with_row(item) if isinstance(item, db.Row) else builder.with_panel(item)
    dash = builder.build()
    for i, panel in enumerate(dash.panels or [], start=1):
        panel.id_val = i  # stable ids in reading order (the SDK leaves them at 0)
    return dash


def render() -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run .venv/bin/python grafana/generate.py", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
