"""The Grafana dashboard, from the monitoring config, with Grafana's own Python SDK (``grafana-foundation-sdk``,
the build for Grafana 11.6: every panel, option and field config is a typed model from Grafana's schema).

Every query comes from specdecode_exporter.monitoring.promql, the same module the recording rules use; pooling is by the
config's alert level, so at window 5m the headline α equals the rule ``model:specdecode_acceptance_ratio:rate5m``.
A panel is one function of the dashboard context; ROWS registers it in its row.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

from specdecode_exporter.core import metrics as m
from specdecode_exporter.core.monitoring_config import MonitoringConfig
from specdecode_exporter.core.verdict import VERDICT_BY_CODE, Verdict
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring import rules, stage

TAGS = ["specdecode", "vllm", "llm-serving"]
DATASOURCE_VAR = "datasource"
UNIT_TOKENS_PER_S = "si:tok/s"
UNIT_SPEEDUP = "suffix:×"
UNIT_TOKENS_PER_STEP = "suffix: tok/step"
RED, YELLOW, GREEN, BLUE = "red", "yellow", "green", "blue"
VERDICT_COLOURS = {Verdict.HURTING: RED, Verdict.MARGINAL: YELLOW, Verdict.PAYING_OFF: GREEN}
DS = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
# The variables every dashboard has; labels of the config's alert level that are not among them get their own.
STANDARD_VARIABLES = ("namespace", "job", "model_name", "engine", "pod", "instance")
RATE_INTERVAL = "$__rate_interval"
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"


def _matchers(names: Sequence[str]) -> str:
    return ", ".join(f'{name}=~"${name}"' for name in names)


@dataclass(frozen=True)
class Context:
    """What every panel reads: the config and the selectors built from it."""

    cfg: MonitoringConfig

    @property
    def extra_variables(self) -> tuple[str, ...]:
        return tuple(label for label in self.cfg.level_labels() if label not in STANDARD_VARIABLES)

    @property
    def scope(self) -> q.Scope:
        """The sidecar's series under every variable, pooled by the alert level (per model)."""
        names = (*self.extra_variables, "namespace", "job", "pod", "instance", "model_name", "engine")
        return q.Scope(_matchers(names), self.cfg.level_labels())

    @property
    def tapped(self) -> q.Scope:
        """The request tap's series: per model (they have no engine label), by the alert level."""
        names = (*self.extra_variables, "namespace", "job", "pod", "instance", "model_name")
        return q.Scope(_matchers(names), self.cfg.level_labels())

    @property
    def health(self) -> str:
        """Health series may lack model_name (a target that never answered): scrape identity only."""
        return _matchers((*self.extra_variables, "namespace", "job", "pod", "instance"))

    @property
    def vllm(self) -> q.Scope:
        """vLLM's own series come from another scrape job and port: pod and model identity only."""
        return q.Scope(_matchers((*self.extra_variables, "namespace", "pod", "model_name", "engine")),
                       ("model_name",))

    @property
    def rule_matchers(self) -> str:
        return _matchers(self.cfg.level_labels())

    @property
    def legend(self) -> str:
        labels = self.cfg.level_labels()
        return " ".join(["{{model_name}}", *(f"{{{{{label}}}}}" for label in labels if label != "model_name")])

    @property
    def page(self) -> float:
        return self.cfg.thresholds.page_acceptance_ratio

    @property
    def alert_prefix(self) -> str:
        return rules.ALERT_NAME_PREFIX

    @property
    def pooled(self) -> stage.Pooled:
        """Per-model panels read the rules' short stage, never the pods' raw series over a window: cheap at any
        dashboard range."""
        return stage.Pooled(self.cfg, self.rule_matchers)

    def alpha(self, window: str = "$window") -> str:
        return self.pooled.ratio("accepted_tokens", "draft_tokens", window)

    def mean_length(self) -> str:
        return "1 + " + self.pooled.ratio("accepted_tokens", "drafts", "$window")

    def speedup(self) -> str:
        """The modelled speedup from the pooled counters and the configured break-even (promql.expected_speedup)."""
        rate = functools.partial(self.pooled.rate, window="$window")
        drafts = f"({rate('drafts')} > 0)"
        return (f"(1 + {rate('accepted_tokens')} / {drafts})\n/\n(1 + {rate('draft_tokens')} / {drafts}\n   * "
                f"{q.break_even(self.scope)})")

    def tpot_mean(self, spec_decode: str) -> str:
        """The sidecars' pooled TPOT for spec-decode ("true") or control ("false") pods, exact from _sum/_count."""
        return self.pooled.ratio("tpot_sum", "tpot_count", "$window", f'spec_decode="{spec_decode}"',
                                 by_also=("spec_decode",))

    def tpot_quantile(self, quantile: float, spec_decode: str) -> str:
        return self.pooled.quantile(quantile, "tpot", "$window", f'spec_decode="{spec_decode}"',
                                    by_also=("spec_decode",))

    def observed(self, statistic: str) -> str:
        """Observed speedup per model: the fleet's (control pods' TPOT over spec-decode pods') where there are
        control pods, else the best pod's own (against its control target or measured baseline)."""
        quantile = {"mean": None, "p50": 0.5, "p99": 0.99}[statistic]
        control, spec = ((self.tpot_mean("false"), self.tpot_mean("true")) if quantile is None else
                         (self.tpot_quantile(quantile, "false"), self.tpot_quantile(quantile, "true")))
        statistic_matcher = f'statistic="{statistic}"'
        pods = f"max by ({self.scope.by_clause}) ({self.windowed(m.OBSERVED_SPEEDUP.name, statistic_matcher)})"
        return f"(({control})\n/ ignoring (spec_decode)\n({spec} > 0))\nor\n{pods}"

    def rate(self, key: str, window: str = RATE_INTERVAL) -> str:
        """A counter's rate per model, from the stage's record of it (stage.families' ``key``)."""
        return self.pooled.rate(key, window)

    def side(self, what: str, spec_decode: str) -> str:
        """A capacity figure of the spec-decode ("true") or control ("false") pods over $window."""
        marked = (f'spec_decode="{spec_decode}"',)
        def ratio(numerator: str, denominator: str) -> str:
            return self.pooled.ratio(numerator, denominator, "$window", *marked, by_also=("spec_decode",))

        return {"preemptions": ratio("preemptions", "tpot_count"), "generated": ratio("generated", "engines"),
                "kv_cache": self.pooled.rate("kv_cache", "$window", *marked, by_also=("spec_decode",))}[what]

    def capacity_costs(self) -> tuple[str, str]:
        """The verdict's capacity conditions against the control pods, over $window (core.verdict)."""
        bounds = self.cfg.verdict.capacity
        increase = (f"({self.side('preemptions', 'true')})\n- ignoring (spec_decode)\n"
                    f"({self.side('preemptions', 'false')})")
        throughput = (f"({self.side('generated', 'true')})\n/ ignoring (spec_decode)\n"
                      f"({self.side('generated', 'false')} > 0)\nand on ({self.scope.by_clause})\n"
                      f"({q.spec_pods_waiting(self.scope, '$window')} >= {q.fmt_num(bounds.min_waiting_requests)})")
        return (f"({increase}) <= bool {q.fmt_num(bounds.max_preemptions_per_request_increase)}",
                f"({throughput}) >= bool {q.fmt_num(bounds.min_throughput_ratio)}")

    def per_pod(self) -> q.Scope:
        """The sidecar's series one by one (each target and engine), under every variable."""
        labels = (*self.cfg.level_labels(), "pod", "target", "engine")
        return q.Scope(self.scope.matchers, tuple(dict.fromkeys(labels)))

    def windowed(self, metric: str, *matchers: str) -> str:
        """One of the sidecar's windowed gauges, at the dashboard's window."""
        return q.selector(metric, self.scope.also('window="$window"', *matchers))


# ----------------------------------------------------------------------------------------- builder helpers


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


# -------------------------------------------------------------- row: is speculative decoding paying off?


def alpha_stat(ctx: Context) -> Any:
    return (stat_panel(
        ctx, "Acceptance rate α",
        "α = accepted draft tokens / drafted tokens over $window, pooled over the selected pods and engines "
        f"(sums of counter rates, then divided). Red below the page threshold ({ctx.page:.0%}), green from "
        f"{ctx.cfg.thresholds.good_acceptance_ratio:.0%}.", ctx.alpha(), "percentunit")
        .thresholds(steps(*alpha_steps(ctx))).min(0).max(1).decimals(1))


def mean_length_stat(ctx: Context) -> Any:
    return (stat_panel(
        ctx, "Mean acceptance length",
        "Tokens produced per target forward pass: 1 + accepted / drafts (vLLM's definition; includes the "
        "bonus token). 1.0 means every draft was rejected.",
        ctx.mean_length(), UNIT_TOKENS_PER_STEP)
        .thresholds(steps((None, BLUE))).color_mode(cm.BigValueColorMode.VALUE).decimals(2))


def speedup_stat(ctx: Context) -> Any:
    return (stat_panel(
        ctx, "Expected speedup",
        "Modelled speedup over plain decoding (docs/architecture.md, break-even model): (1 + accepted/drafts) "
        "/ (1 + draft_tokens/drafts · configured break-even α), pooled over the selected pods. Below 1× spec "
        "decode costs more than it saves. A model of the cost, not a measurement: compare with the latency row, "
        "and measure it before you ship with `specdecode-exporter probe`.", ctx.speedup(), UNIT_SPEEDUP)
        .thresholds(steps(*speedup_steps(ctx))).decimals(2))


def break_even_stat(ctx: Context) -> Any:
    return (stat_panel(
        ctx, "Break-even α",
        "α below which spec decode costs more than it saves, from the sidecar's cost model (c_draft + "
        "c_verify, see the sidecar config), calibrated to the observed speedup where a baseline gives one. "
        "Highest value over the selected pods.",
        q.break_even_in_force(ctx.scope), "percentunit")
        .thresholds(steps((None, BLUE))).color_mode(cm.BigValueColorMode.VALUE).decimals(1))


def verdict_stat(ctx: Context) -> Any:
    bands = ctx.cfg.verdict
    texts = {code: (verdict.value.capitalize(), VERDICT_COLOURS[verdict]) for code, verdict in
             VERDICT_BY_CODE.items()}
    return (stat_panel(
        ctx, "Verdict",
        "The sidecar's verdict, computed the same way (specdecode_exporter/core/verdict.py, bands from the monitoring "
        "config), "
        "from the observed speedup where there is a baseline (control pods, or the pods' own baselines), else the "
        f"modelled one: 'Hurting' below {bands.hurting_below:g}×; 'Marginal' below {bands.paying_off_from:g}×, "
        f"with α below the page threshold ({ctx.page:.0%}), with an observed P99 speedup below "
        f"{bands.hurting_below:g}× (a tail regression), or, against the control pods, with "
        f"{bands.capacity.max_preemptions_per_request_increase:g} more preemptions per request or below "
        f"{bands.capacity.min_throughput_ratio:.0%} of their tokens/s while requests wait (it costs memory or "
        "capacity); else 'Paying off'. 'No traffic' when the model drafted nothing over $window.",
        q.verdict_code(ctx.alpha(), f"({ctx.observed('mean')})\nor\n({ctx.speedup()})", bands,
                       tail=ctx.observed("p99"), costs=ctx.capacity_costs()), "none")
        .mappings([*no_traffic_mappings(), *value_mappings(texts)])
        .thresholds(steps((None, RED), (1, YELLOW), (2, GREEN))))


def k_advice_stat(ctx: Context) -> Any:
    by = ctx.scope.by_clause
    configured = (f"count by ({by}) (count by ({by}, position) "
                  f"({q.selector(m.ACCEPTED_BY_POSITION.exposed_name, ctx.scope.matchers)}))")
    recommended = f"max by ({by}) ({ctx.windowed(m.RECOMMENDED_K.name)})"
    return (stat_panel(
        ctx, "k: configured → recommended",
        "Configured k = number of draft positions the sidecar sees. Recommended k' = the sidecar's argmax of "
        "expected speedup over k' ≤ k over $window (highest over the selected pods).", "", "none")
        .targets([query(configured, "configured {{model_name}}", ref="A", instant=True),
                  query(recommended, "recommended {{model_name}}", ref="B", instant=True)])
        .thresholds(steps((None, BLUE))).color_mode(cm.BigValueColorMode.VALUE).decimals(0))


# -------------------------------------------------------------- row: is it paying off, measured?


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


# ------------------------------------------------------------------ row: per request (the request tap)


def request_heatmap(ctx: Context) -> Any:
    return acceptance_heatmap(
        "Per-request α over time",
        "One observation per completion request through the request tap: that request's own α from vLLM's "
        "per-request metrics (--per-request-spec-decode-metrics summary). A band of mass below the page threshold "
        "is traffic spec decode slows down, however healthy the aggregate α looks. Empty without the tap "
        "(--proxy.listen-address).",
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
    scope = q.Scope(ctx.tapped.matchers, (*ctx.tapped.by, "acceptance"))
    return ts_panel(
        "Request speed by acceptance band",
        "Median generation speed (output tokens per second) of the tapped requests in each band of their own α: "
        "are the low-α requests the slow ones?",
        queries((q.histogram_quantile(0.5, m.REQUEST_SPEED.name, scope, "$window"), "α {{acceptance}} {{model_name}}")),
        UNIT_TOKENS_PER_S, w=12, h=8).min(0)


def requests_without_metrics(ctx: Context) -> Any:
    scope = q.Scope(ctx.tapped.matchers, ("reason",))
    return ts_panel(
        "Tapped requests without spec-decode metrics",
        "By reason: not_enabled means vLLM runs without --per-request-spec-decode-metrics; n_gt_1 and "
        "multi_prompt are requests vLLM gives no per-request figures for; the rest are failures.",
        queries((q.rate_sum(m.REQUESTS_WITHOUT_SPEC.exposed_name, scope, RATE_INTERVAL), "{{reason}}")),
        "reqps", w=12, h=8).min(0)


# ------------------------------------------------------- row: routing (the tap sends slow classes elsewhere)

ROUTE_CLASS = ("model_name", "workload", "temperature", "prompt_length")


def routed_classes(ctx: Context) -> Any:
    state = q.selector(m.ROUTE_CLASS_STATE.name, ctx.tapped.matchers)
    return (ts_panel(
        "Classes routed to the pool without spec decode",
        "1 while the request tap (proxy.route) sends a class of requests (model, workload, temperature band, and "
        "prompt-length band where configured) to the fallback pool: a block of its requests showed α below the "
        "break-even. A class routed for long is the SpecDecodeClassRouted ticket: its draft needs attention.",
        queries((f"max by ({q.by(ROUTE_CLASS)}) ({state})",
                 "{{model_name}} {{workload}} T {{temperature}} {{prompt_length}}")),
        "none", w=8, h=8).min(0).max(1).decimals(0))


def routed_requests(ctx: Context) -> Any:
    scope = q.Scope(ctx.tapped.matchers, ("upstream", "reason"))
    return ts_panel(
        "Requests by pool and reason",
        "Completions through a routing tap: to the speculative pool (unrouted classes, and the canary of routed "
        "ones) or to the fallback (benefit); fallback_down: meant for the fallback, which was unreachable. In "
        "observe mode the fallback counts say where enforce mode would have sent them.",
        queries((q.rate_sum(m.ROUTE_REQUESTS.exposed_name, scope, RATE_INTERVAL), "{{upstream}} {{reason}}")),
        "reqps", w=8, h=8).min(0)


def routed_speedup(ctx: Context) -> Any:
    measured = q.selector(m.ROUTE_MEASURED_SPEEDUP.name, ctx.tapped.matchers)
    return (ts_panel(
        "Measured speedup of routed classes (randomized canary)",
        "Per routed class: mean latency on the fallback / mean latency of its canary (the random share still "
        "served with speculative decoding), for time per output token and end to end. Below 1× the fallback is "
        "faster, as routing assumed; the most direct measure of what spec decode does for this traffic.",
        queries((f"max by ({q.by((*ROUTE_CLASS, 'latency'))}) ({measured})",
                 "{{model_name}} {{workload}} T {{temperature}} {{latency}}")),
        UNIT_SPEEDUP, w=8, h=8)
        .thresholds(steps((None, RED), (ctx.cfg.verdict.hurting_below, "transparent")))
        .thresholds_style(line_and_area()).axis_soft_min(0.5).axis_soft_max(1.5))


# ----------------------------------------------------------------------------------- row: acceptance over time


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


def mean_draft_length_over_time(ctx: Context) -> Any:
    return ts_panel(
        "Mean draft length (k̄, sidecar gauge)",
        f'{m.MEAN_DRAFT_LENGTH.name}{{window="$window"}}: drafted tokens per draft as the engine counted them, '
        "never assumed equal to k. Below k when a batch-size schedule (vLLM's num_speculative_tokens_per_batch_size, "
        "TensorRT-LLM's draft_len_schedule), adaptive verification or short ngram lookups draft fewer tokens; "
        "absent where the engine counts no drafts.",
        queries((ctx.windowed(m.MEAN_DRAFT_LENGTH.name), "{{model_name}} {{pod}}{{instance}} engine {{engine}}")),
        UNIT_TOKENS_PER_STEP, w=8,
    ).min(0)


# ------------------------------------------------------------------------------ row: how is α distributed?


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


# ------------------------------------------------------------------------------ row: positions and k


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


# ------------------------------------------------------------------------------------------ row: token flow


def token_flow(ctx: Context) -> Any:
    drafted, accepted = ctx.rate("draft_tokens"), ctx.rate("accepted_tokens")
    return (ts_panel(
        "Token flow",
        "Drafted, accepted and rejected (drafted − accepted) draft tokens per second, and all emitted tokens, "
        "pooled per model. Rejected tokens are the draft and verification work that bought nothing.",
        queries((drafted, "drafted " + ctx.legend), (accepted, "accepted " + ctx.legend),
                (f"{drafted}\n-\n{accepted}", "rejected " + ctx.legend),
                (ctx.rate("series_emitted"), "emitted " + ctx.legend)),
        UNIT_TOKENS_PER_S, w=8)
        .min(0).override_by_query("C", override_props(color={"mode": "fixed", "fixedColor": RED}))
        .override_by_query("B", override_props(color={"mode": "fixed", "fixedColor": GREEN})))


def drafts_rate(ctx: Context) -> Any:
    return ts_panel(
        "Verification steps with a draft",
        "Drafts per second (one per request per engine step that carried a draft), per model.",
        queries((ctx.rate("drafts"), ctx.legend)), "reqps", w=8).min(0)


# ------------------------------------------------------------------------------------ row: latency (vLLM)


def vllm_quantiles(ctx: Context, title: str, description: str, histogram: str) -> Any:
    """P50 and P99 of one of vLLM's own latency histograms, per model."""
    return ts_panel(
        title, description,
        queries(*((q.histogram_quantile(quantile, histogram, ctx.vllm, RATE_INTERVAL), f"{name} {{{{model_name}}}}")
                  for quantile, name in ((0.5, "p50"), (0.99, "p99")))),
        "s", w=8).min(0)


def tpot_quantiles(ctx: Context) -> Any:
    return vllm_quantiles(
        ctx, "Time per output token (vLLM) p50 / p99",
        "vLLM's per-request TPOT histogram (true time per generated token; vLLM ≥ 0.11). This is what spec "
        "decode should lower: read it beside α. Filters: namespace, pod, model_name, engine (vLLM's own scrape).",
        TPOT)


def itl_quantiles(ctx: Context) -> Any:
    return vllm_quantiles(
        ctx, "Inter-token latency (vLLM) p50 / p99",
        "vLLM's inter-token latency: one sample per engine step, which emits 1 … k+1 tokens under spec decode, "
        "so it rises while TPOT falls when acceptance is good.",
        ITL)


def load_panel(ctx: Context) -> Any:
    running = f"sum by (model_name) ({q.selector('vllm:num_requests_running', ctx.vllm.matchers)})"
    return (ts_panel(
        "Running requests and generated tokens (vLLM)",
        "Load context: requests running (left) and vLLM's generated tokens per second (right). Acceptance and "
        "the verification cost both move with batch size.",
        queries((running, "running {{model_name}}"),
                (q.rate_sum("vllm:generation_tokens_total", ctx.vllm, RATE_INTERVAL), "generated {{model_name}}")),
        "short", w=8)
        .min(0).override_by_query("B", override_props(unit=UNIT_TOKENS_PER_S, custom__axisPlacement="right")))


# ------------------------------------------------------------- row: is it still speculating? which k, when?


def speculative_share(ctx: Context) -> Any:
    pods = ctx.per_pod()
    share = q.guarded_ratio(q.rate_sum(m.EMITTED_TOKENS.exposed_name, pods, RATE_INTERVAL),
                            q.rate_sum(m.GENERATED_TOKENS.exposed_name, pods, RATE_INTERVAL))
    stopped = ctx.cfg.speculation_stopped.share_below
    return (ts_panel(
        "Speculative token share",
        "Share of each engine's generated tokens that speculative steps produced: (drafts + accepted) / generated "
        "tokens. 1 while every step speculates (a little below: each request's first token comes from prefill), 0 "
        "once speculation stopped while the engine still generates: an acceptance gate (TensorRT-LLM switches it off "
        "for good), a batch-size schedule at k = 0, an ngram drafter that finds nothing. Below "
        f"{stopped:.0%}: SpecDecodeSpeculationStopped.",
        queries((share, "{{pod}} {{target}} engine {{engine}}")), "percentunit", w=6)
        .min(0).max(1).thresholds(steps((None, RED), (stopped, "transparent"))).thresholds_style(line_and_area()))


def scheduled_steps(ctx: Context) -> Any:
    by = ctx.scope.by_clause
    selected = q.selector(m.SCHEDULED_STEPS.exposed_name, ctx.scope.matchers)
    steps_by_k = f"sum by ({by}, num_speculative_tokens) (rate({selected}[{RATE_INTERVAL}]))"
    return (ts_panel(
        "Scheduler steps by the k the schedule chose",
        "Where vLLM exports it (vllm:spec_decode_scheduled_steps, proposed upstream in vllm#54748): scheduler steps "
        "per second by the number of speculative tokens a batch-size schedule (num_speculative_tokens_per_batch_size) "
        "chose, 0 included. Steps at k = 0 are speculation stopped on purpose. Empty for every released vLLM.",
        queries((steps_by_k, "k={{num_speculative_tokens}} {{model_name}}")), "short", w=6)
        .min(0).stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)))


def schedule_table(ctx: Context) -> Any:
    by = ctx.scope.by_clause
    recommended = f"max by ({by}, batch_size) ({q.selector(m.RECOMMENDED_K_BY_BATCH_SIZE.name, ctx.scope.matchers)})"
    return table_panel(
        "Recommended k by batch size",
        "The sidecar's batch-size schedule over its longest window: for each range of running requests, the k with "
        "the highest modelled speedup (the acceptance seen at that batch size, the cost model's c_verify at that "
        "batch, calibrated to the observed speedup where a baseline gives one). Paste it as vLLM's "
        "num_speculative_tokens_per_batch_size or TensorRT-LLM's draft_len_schedule: the status page and `check` "
        "print both. Highest over the selected pods.",
        query(recommended, instant=True, fmt=pm.PromQueryFormat.TABLE), w=4, h=8, no_value="No schedule yet",
        exclude={"Time": True}, order={"model_name": 0, "batch_size": 1, "Value": 2})


def schedule_gain(ctx: Context) -> Any:
    by = ctx.scope.by_clause
    def speedup(schedule: str) -> str:
        selected = q.selector(m.EXPECTED_SPEEDUP_BY_BATCH_SIZE.name, ctx.scope.also(f'schedule="{schedule}"'))
        return f"max by ({by}, batch_size) ({selected})"

    fixed, chosen = speedup("fixed"), speedup("recommended")
    gain = f"max by ({by}) ({q.selector(m.SCHEDULE_EXPECTED_GAIN.name, ctx.scope.matchers)})"
    return (ts_panel(
        "Modelled speedup by batch size: fixed k against the schedule",
        "The evidence for the schedule: the modelled speedup over plain decoding in each batch-size range with "
        "today's fixed k (dashed) and with the recommended k, and the schedule's expected gain over fixed k with "
        "each range weighted by the time the engines spent there (right axis). Modelled, not measured: measure a "
        "change with `specdecode-exporter probe`.",
        queries((fixed, "fixed k {{batch_size}}"), (chosen, "schedule {{batch_size}}"),
                (gain, "expected gain {{model_name}}")), UNIT_SPEEDUP, w=8)
        .override_by_query("A", dashed()))


# ----------------------------------------------- row: what spec decode costs against the control pods


def _spec_and_control(expr: Callable[[str], str], what: str) -> list[pb.Dataquery]:
    return queries((expr("true"), f"{what} with spec decode {{{{model_name}}}}"),
                   (expr("false"), f"{what} without (control) {{{{model_name}}}}"))


def kv_usage_vs_control(ctx: Context) -> Any:
    return (ts_panel(
        "KV-cache usage: spec-decode pods and control pods",
        "Mean KV-cache usage per engine (vLLM's kv_cache_usage_perc) over $window, spec-decode pods against control "
        "pods (the same model with spec decode off, spec_decode=\"false\"). A draft model takes GPU memory, and "
        "each running request holds k lookahead slots: the spec-decode pods fill their cache at a smaller batch.",
        _spec_and_control(functools.partial(ctx.side, "kv_cache"), "KV usage"),
        "percentunit", w=8)
        .min(0).max(1).override_by_query("B", dashed()))


def preemptions_vs_control(ctx: Context) -> Any:
    bound = ctx.cfg.cost_vs_control.max_preemptions_per_request_increase
    return (ts_panel(
        "Preemptions per request: spec-decode pods and control pods",
        "vLLM's preemptions (requests evicted for want of KV-cache blocks, recomputed later) per finished request "
        f"over $window. More than {bound:g} above the control pods': SpecDecodePreemptionsRaised, and the verdict is "
        "at best 'Marginal' (a latency win that preempts is not paying off).",
        _spec_and_control(functools.partial(ctx.side, "preemptions"), "preemptions"),
        "short", w=8)
        .min(0).override_by_query("B", dashed()))


def throughput_vs_control(ctx: Context) -> Any:
    costs = ctx.cfg.cost_vs_control
    waiting = q.spec_pods_waiting(ctx.scope, "$window")
    return (ts_panel(
        "Generated tokens/s per engine: spec-decode pods and control pods",
        "Throughput per engine over $window, with the requests waiting on the spec-decode pods (right axis). At "
        f"comparable load — the spec-decode pods queue at least {costs.min_waiting_requests:g} request(s), so they "
        f"run at their capacity — below {costs.min_throughput_ratio:.0%} of the control pods' tokens/s is "
        "SpecDecodeThroughputCut: faster tokens per request do not make up for fewer requests served.",
        [*_spec_and_control(functools.partial(ctx.side, "generated"), "tokens/s"),
         query(waiting, "waiting on spec decode {{model_name}}", ref="C")],
        UNIT_TOKENS_PER_S, w=8)
        .min(0).override_by_query("B", dashed())
        .override_by_query("C", override_props(unit="short", custom__axisPlacement="right")))


# -------------------------------------------------------------------------------- row: what the alerts see


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


# ------------------------------------------------------------------------------------------------ row: health


def collection_up(ctx: Context) -> Any:
    return (stat_panel(
        ctx, "Sidecar → vLLM collection",
        f"{m.UP.name} per sidecar target: 1 when the sidecar's last collection from vLLM succeeded.",
        f"min by (instance, target) ({q.selector(m.UP.name, ctx.health)})", "none",
        legend="{{instance}} {{target}}", w=4, h=6)
        .mappings(up_mappings()).no_value("No sidecar").thresholds(steps((None, RED), (1, GREEN))))


def scrape_up(ctx: Context) -> Any:
    sidecar_up = q.selector(m.UP.name, ctx.health)
    return (stat_panel(
        ctx, "Prometheus → sidecar scrape",
        "Prometheus' own up{} for the sidecar job: 0 means Prometheus cannot scrape the sidecar "
        f"(SpecDecodeExporterDown). Only scrape targets that exported {m.UP.name} in the last day: vLLM's own "
        "job is left out.",
        f"min by (instance) (up{{{ctx.health}}}\n  and on (job, instance) last_over_time({sidecar_up}[1d]))",
        "none", legend="{{instance}}", w=4, h=6)
        .mappings(up_mappings()).no_value("No sidecar").thresholds(steps((None, RED), (1, GREEN))))


def collection_errors(ctx: Context) -> Any:
    errors = q.selector(m.COLLECT_ERRORS.exposed_name, ctx.health)
    return ts_panel(
        "Collection errors by reason",
        "Failed collections per second by reason (connect, timeout, http_status, too_large, parse, "
        "no_spec_metrics). no_spec_metrics after a vLLM upgrade means the metric names changed or spec decode "
        "is off.", queries((f"sum by (reason) (rate({errors}[{RATE_INTERVAL}]))", "{{reason}}")),
        "ops", w=6, h=6).min(0)


def collection_duration(ctx: Context) -> Any:
    return ts_panel(
        "Collection duration",
        "Duration of the sidecar's last collection (fetch + parse) per target.",
        queries((f"max by (instance, target) ({q.selector(m.COLLECT_DURATION.name, ctx.health)})",
                 "{{instance}} {{target}}")), "s", w=4, h=6).min(0)


def firing_alerts(ctx: Context) -> Any:
    prefix = ctx.alert_prefix
    return table_panel(
        "Firing alerts",
        f"Alerts named {prefix}* now firing (Prometheus' ALERTS series). Alerts without a model_name label "
        "(sidecar absent, target down) are shown whatever model is selected. See the runbook link at the top.",
        query(f'ALERTS{{alertname=~"{prefix}.*", alertstate="firing", namespace=~"$namespace", '
              f'model_name=~"$model_name|"}}', "{{alertname}}", instant=True, fmt=pm.PromQueryFormat.TABLE),
        w=6, h=6, no_value="No alerts firing",
        exclude={"Time": True, "Value": True, "__name__": True, "alertstate": True},
        order={"alertname": 0, "severity": 1, "model_name": 2})


def sidecar_targets(ctx: Context) -> Any:
    return table_panel(
        "Sidecar targets",
        f"{m.INFO.name}: per target the API (vllm-v1, vllm-v0, …), method and configured k.",
        query(q.selector(m.INFO.name, ctx.scope.matchers), "{{target}}", instant=True,
              fmt=pm.PromQueryFormat.TABLE),
        w=24, h=5, no_value="No sidecar", exclude={"Time": True, "Value": True, "__name__": True})


Panel = Callable[[Context], Any]
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


# The dashboard's rows, top to bottom, and the panels of each, left to right (wrapping at 24 columns).
# A new panel is a function above and its name here.
ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Is speculative decoding paying off? (window $window)",
     (alpha_stat, mean_length_stat, speedup_stat, break_even_stat, verdict_stat, k_advice_stat)),
    ("Is it paying off, measured? (latency against a baseline, window $window)",
     (tpot_spec_vs_control, observed_vs_modelled, load_and_break_even)),
    ("Acceptance over time", (alpha_over_time, speedup_over_time, alpha_by_pod, mean_length_over_time)),
    ("How is α distributed?", (interval_heatmap, interval_quantiles, intervals_below_page)),
    ("Per request: which traffic does spec decode hurt? (the request tap)",
     (request_heatmap, alpha_by_band, requests_below_page, speed_by_acceptance, requests_without_metrics,
      page_variance)),
    ("Routing: the traffic spec decode slows down, sent to a pool without it (proxy.route)",
     (routed_classes, routed_requests, routed_speedup)),
    ("Where along the draft does acceptance fall off, and which k is better?",
     (position_curve, position_curve_over_time, speedup_by_length)),
    ("Token flow", (token_flow, drafts_rate, mean_draft_length_over_time)),
    ("Latency beside it (vLLM)", (tpot_quantiles, itl_quantiles, load_panel)),
    ("Is it still speculating? Which k at which batch size?",
     (speculative_share, scheduled_steps, schedule_table, schedule_gain)),
    ("What it costs against the control pods: memory and throughput (window $window)",
     (kv_usage_vs_control, preemptions_vs_control, throughput_vs_control)),
    ("What the alerts see", (alerts_alpha, alerts_interval_quantiles)),
    ("Health", (collection_up, scrape_up, collection_errors, collection_duration, firing_alerts, sidecar_targets)),
)


# --------------------------------------------------------------------------- variables, links, assembly


def label_var(name: str, label: str, metric_selector: str, description: str) -> db.QueryVariable:
    return (db.QueryVariable(name).label(label).description(description).datasource(DS)
            .query(f"label_values({metric_selector}, {name})").refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))


def variables(ctx: Context) -> list[Any]:
    extra = ctx.extra_variables
    scoped = _matchers(extra)
    up, drafts = m.UP.name, m.DRAFTS.exposed_name

    def within(*names: str) -> str:
        return ", ".join(part for part in (scoped, _matchers(names)) if part)

    windows, default = list(ctx.cfg.sidecar_windows), ctx.cfg.verdict_window
    window = (db.CustomVariable("window").label("Window")
              .description("Window of the ratios: the sidecar's window label and the PromQL range of rate().")
              .values(",".join(windows)).current(dm.VariableOption(selected=True, text=default, value=default))
              .options([dm.VariableOption(selected=w == default, text=w, value=w) for w in windows])
              .multi(False).include_all(False))
    return [
        db.DatasourceVariable(DATASOURCE_VAR).label("Data source").type("prometheus")
        .description("The Prometheus that scrapes the sidecars and vLLM.")
        .current(dm.VariableOption(selected=True, text="default", value="default")),
        *(label_var(name, name.replace("_", " ").capitalize(), up, f"The {name} label (an aggregation level).")
          for name in extra),
        label_var("namespace", "Namespace", q.selector(up, scoped), "Kubernetes namespace (All outside k8s)."),
        label_var("job", "Job", f"{up}{{{within('namespace')}}}",
                  "The sidecar's scrape job (vLLM's own job is not filtered by it)."),
        label_var("model_name", "Model", f"{drafts}{{{within('namespace', 'job')}}}", "vLLM's served model name."),
        label_var("engine", "Engine", f"{drafts}{{{within('namespace', 'job', 'model_name')}}}",
                  "vLLM data-parallel engine index."),
        label_var("pod", "Pod", f"{up}{{{within('namespace', 'job')}}}",
                  "Pod (sidecar and vLLM share it; All outside k8s)."),
        label_var("instance", "Instance", f"{up}{{{within('namespace', 'job', 'pod')}}}",
                  "The sidecar's scrape address (vLLM's panels are not filtered by it)."),
        window,
    ]


def _header(ctx: Context) -> db.Dashboard:
    cfg, prefix = ctx.cfg, ctx.alert_prefix
    runbook = f"{cfg.runbook_base_url.rstrip('/')}/alerts/runbook.md"
    return (db.Dashboard(cfg.dashboard.title).uid(cfg.dashboard.uid)
            .description("vLLM speculative decoding: acceptance rate α, break-even, modelled speedup, per-position "
                         "acceptance, k advice and latency, from the specdecode-exporter sidecar. Generated from "
                         "the monitoring config by src/specdecode_exporter/monitoring/dashboard.py.")
            .tags(TAGS).editable().tooltip(dm.DashboardCursorSync.CROSSHAIR).time(cfg.dashboard.time_from, "now")
            .timezone("browser").refresh(cfg.dashboard.refresh)
            .timepicker(db.TimePicker().refresh_intervals(["10s", "30s", "1m", "5m", "15m", "1h"]))
            .link(db.DashboardLink("Runbook").type(dm.DashboardLinkType.LINK).url(runbook).icon("doc")
                  .tooltip("What to do when a specdecode alert fires").target_blank(True).as_dropdown(False)
                  .include_vars(False).keep_time(False).tags([]))
            .annotation(db.AnnotationQuery().name("Annotations & Alerts").built_in(1).enable(True).hide(True)
                        .icon_color("rgba(0, 211, 255, 1)").type("dashboard")
                        .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --")))
            .annotation(db.AnnotationQuery().name(f"{prefix} alerts firing").enable(True).hide(False)
                        .icon_color("red").datasource(DS)
                        .expr(f'ALERTS{{alertname=~"{prefix}.*", alertstate="firing", namespace=~"$namespace"}}'))
            .variables(variables(ctx)))


def build(cfg: MonitoringConfig) -> dm.Dashboard:
    ctx = Context(cfg)
    builder = _header(ctx)
    for title, panels in ROWS:
        builder = builder.with_row(db.Row(title))
        for make_panel in panels:
            builder = builder.with_panel(make_panel(ctx))
    dash = builder.build()
    for i, panel in enumerate(dash.panels or [], start=1):
        panel.id_val = i  # stable ids in reading order (the SDK leaves them at 0)
    return dash


def render(cfg: MonitoringConfig) -> str:
    return json.dumps(build(cfg), cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
