"""The dashboard's row: Where along the draft does acceptance fall off, and which k is better?"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import barchart, bargauge
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring import stage
from specdecode_exporter.monitoring.dashboard.context import DS, UNIT_SPEEDUP, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import alpha_steps, queries, query, speedup_steps, steps, ts_panel


def position_curve(ctx: Context) -> Any:
    by_pos = stage.rate(ctx.cfg, "accepted_by_position", "$window", ctx.rule_matchers)
    drafts = stage.rate(ctx.cfg, "drafts", "$window", ctx.rule_matchers)
    curve = f"sum by (position) ({by_pos})\n/ on () group_left ()\n(sum ({drafts}) > 0)"
    transformations = [
        ("convertFieldType", {"conversions": [{"targetField": "position", "destinationType": "number"}],
                              "fields": {}}),
        ("sortBy", {"fields": {}, "sort": [{"field": "position", "desc": False}]}),
        ("organize", {"excludeByName": {"Time": True}, "indexByName": {}, "renameByName": {"Value": "P(prefix > i)"}}),
    ]
    panel = (barchart.Panel().title("Acceptance by draft position (now)").description(
        "P(accepted prefix > i) for each draft position i over $window: per-position accepted counts / drafts, "
        "pooled over the selected pods (pick one model for a clean curve). Where it falls off, later draft "
        "tokens are mostly wasted work.")
        .datasource(DS).span(8).height(9)
        .with_target(query(curve, "{{position}}", instant=True, fmt=pm.PromQueryFormat.TABLE)))
    for transform, options in transformations:
        panel = panel.with_transformation(dm.DataTransformerConfig(id_val=transform, options=options))
    return (panel.x_field("position").unit("percentunit").min(0).max(1).no_value("No traffic")
            .thresholds(steps(*alpha_steps(ctx))).color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
            .show_value(cm.VisibilityMode.AUTO).orientation(cm.VizOrientation.VERTICAL).x_tick_label_rotation(0)
            .line_width(1).fill_opacity(80).gradient_mode(cm.GraphGradientMode.NONE)
            .legend(cb.VizLegendOptions().show_legend(False).display_mode(cm.LegendDisplayMode.LIST)
                    .placement(cm.LegendPlacement.BOTTOM).calcs([]))
            .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE).sort(cm.SortOrder.NONE)))


def position_curve_over_time(ctx: Context) -> Any:
    by = ctx.scope.by_clause
    expr = (f"{ctx.pooled.rate('accepted_by_position', '$window', by_also=('position',))}\n"
            f"/ on ({by}) group_left ()\n({ctx.pooled.rate('drafts', '$window')} > 0)")
    return (ts_panel(
        "Acceptance by draft position over time",
        "The same curve over time, one line per position: a drop that starts at a late position is a draft "
        "getting stale; a drop at position 0 is a task-mix or temperature change.",
        queries((expr, "pos {{position}} {{model_name}}")), "percentunit", w=8, h=9).min(0).max(1))


def speedup_by_length(ctx: Context) -> Any:
    return (bargauge.Panel().title("Expected speedup by k'").description(
        "The sidecar's modelled speedup for each shorter k' ≤ k, from the per-position curve over $window "
        "(mean over the selected sidecars). The longest bar is the k to configure; compare with "
        "'k: configured → recommended' above.")
        .datasource(DS).span(8).height(9)
        .with_target(query(f"avg by (model_name, num_speculative_tokens) "
                           f"({ctx.windowed(m.EXPECTED_SPEEDUP_BY_LENGTH.name)})",
                           "k'={{num_speculative_tokens}} {{model_name}}", instant=True))
        .unit(UNIT_SPEEDUP).decimals(2).min(0).no_value("No traffic").thresholds(steps(*speedup_steps(ctx)))
        .display_mode(cm.BarGaugeDisplayMode.GRADIENT).orientation(cm.VizOrientation.HORIZONTAL)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields(""))
        .show_unfilled(True).value_mode(cm.BarGaugeValueMode.COLOR).name_placement(cm.BarGaugeNamePlacement.AUTO)
        .sizing(cm.BarGaugeSizing.AUTO).min_viz_height(16).min_viz_width(8).max_viz_height(300))


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Where along the draft does acceptance fall off, and which k is better?",
          (position_curve, position_curve_over_time, speedup_by_length))
