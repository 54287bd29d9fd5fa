"""The builders every row's panels share: queries, thresholds, value mappings and the stat, time-series, table
and heatmap panels as this dashboard draws them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from specdecode_exporter.monitoring.dashboard.context import DS, GREEN, RED, YELLOW, Context


def query(expr: str, legend: str = "__auto", *, ref: str = "A", instant: bool = False,
          fmt: pm.PromQueryFormat | None = None) -> pb.Dataquery:
    built = pb.Dataquery().expr(expr).ref_id(ref).datasource(DS).legend_format(legend)
    built = built.instant() if instant else built.range()
    return built.format(fmt) if fmt is not None else built


def queries(*items: tuple[str, str]) -> list[pb.Dataquery]:
    """Range queries (expr, legend) with refIds A, B, C, …"""
    return [query(expr, legend, ref=chr(ord("A") + i)) for i, (expr, legend) in enumerate(items)]


def steps(*pairs: tuple[float | None, str]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in pairs])


def alpha_steps(ctx: Context) -> tuple[tuple[float | None, str], ...]:
    return (None, RED), (ctx.page, YELLOW), (ctx.cfg.thresholds.good_acceptance_ratio, GREEN)


def speedup_steps(ctx: Context) -> tuple[tuple[float | None, str], ...]:
    return (None, RED), (ctx.cfg.verdict.hurting_below, YELLOW), (ctx.cfg.verdict.paying_off_from, GREEN)


def below_page_band(ctx: Context) -> db.ThresholdsConfig:
    return steps((None, RED), (ctx.page, "transparent"))


def no_traffic_mappings() -> list[dm.ValueMapping]:
    no_traffic = dm.ValueMappingResult(text="No traffic", color="text", index=0)
    return [dm.SpecialValueMap(options=dm.DashboardSpecialValueMapOptions(match=dm.SpecialValueMatch.NULL_AND_NAN,
                                                                          result=no_traffic))]


def value_mappings(texts: dict[int, tuple[str, str]]) -> list[dm.ValueMapping]:
    return [dm.ValueMap(options={str(value): dm.ValueMappingResult(text=text, color=colour, index=i)
                                 for i, (value, (text, colour)) in enumerate(texts.items())})]


def up_mappings() -> list[dm.ValueMapping]:
    return value_mappings({0: ("DOWN", RED), 1: ("UP", GREEN)})


def legend_table(*calcs: str) -> cb.VizLegendOptions:
    return (cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE).placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True).calcs(list(calcs)))


def override_props(**props: Any) -> list[dm.DynamicConfigValue]:
    return [dm.DynamicConfigValue(id_val=k.replace("__", "."), value=v) for k, v in props.items()]


def dashed() -> list[dm.DynamicConfigValue]:
    return override_props(custom__lineStyle={"fill": "dash", "dash": [10, 10]}, custom__fillOpacity=0)


def line_and_area() -> cb.GraphThresholdsStyleConfig:
    return cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE_AND_AREA)


def stat_panel(ctx: Context, title: str, description: str, expr: str, unit: str, *, w: int = 4, h: int = 5,
               legend: str | None = None) -> stat.Panel:
    return (stat.Panel().title(title).description(description).datasource(DS).span(w).height(h)
            .with_target(query(expr, legend or ctx.legend, instant=True)).unit(unit).no_value("No traffic")
            .mappings(no_traffic_mappings())
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields(""))
            .color_mode(cm.BigValueColorMode.BACKGROUND).graph_mode(cm.BigValueGraphMode.NONE)
            .text_mode(cm.BigValueTextMode.VALUE_AND_NAME).justify_mode(cm.BigValueJustifyMode.AUTO)
            .orientation(cm.VizOrientation.AUTO))


def ts_panel(title: str, description: str, targets: Sequence[pb.Dataquery], unit: str, *, w: int = 12,
             h: int = 8) -> timeseries.Panel:
    return (timeseries.Panel().title(title).description(description).datasource(DS).span(w).height(h)
            .targets(list(targets)).unit(unit).no_value("No traffic").line_width(2).fill_opacity(10)
            .show_points(cm.VisibilityMode.NEVER).span_nulls(False).legend(legend_table("lastNotNull", "min", "mean"))
            .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)))


def table_panel(title: str, description: str, target: pb.Dataquery, *, w: int, h: int, no_value: str,
                exclude: dict[str, bool], order: dict[str, int] | None = None) -> table.Panel:
    return (table.Panel().title(title).description(description).datasource(DS).span(w).height(h)
            .with_target(target)
            .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                "excludeByName": exclude, "indexByName": order or {}, "renameByName": {}}))
            .unit("none").no_value(no_value).cell_height(cm.TableCellHeight.SM).show_header(True)
            .align(cm.FieldTextAlignment.AUTO).inspect(False))


def acceptance_heatmap(title: str, description: str, cells: str, no_value: str) -> Any:
    """A heatmap of an α histogram (buckets of 5 points) over time, as Grafana draws pre-bucketed data."""
    return (heatmap.Panel().title(title).description(description)
        .datasource(DS).span(12).height(9)
        .with_target(query(cells, "{{le}}",
                           fmt=pm.PromQueryFormat.HEATMAP))
        .calculate(False).unit("short").no_value(no_value)
        .y_axis(heatmap.YAxisConfig().unit("percentunit").min(0).max(1).decimals(0))
        .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Spectral")
               .scale(hm.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64).fill("dark-orange"))
        .cell_gap(1).cell_values(heatmap.CellValues().unit("short"))
        .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE))
        .show_value(cm.VisibilityMode.NEVER).show_legend().mode(cm.TooltipDisplayMode.SINGLE).show_y_histogram()
        .show_color_scale(True).scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LINEAR))
        .hide_from(cb.HideSeriesConfig().legend(False).tooltip(False).viz(False)))
