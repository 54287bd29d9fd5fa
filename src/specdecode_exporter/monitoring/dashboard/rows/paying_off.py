"""The dashboard's row: Is speculative decoding paying off? The headline stats over $window."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models import common as cm

from specdecode_exporter.core import metrics as m
from specdecode_exporter.core.verdict import VERDICT_BY_CODE
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring.dashboard.context import (
    BLUE,
    GREEN,
    RED,
    UNIT_SPEEDUP,
    UNIT_TOKENS_PER_STEP,
    VERDICT_COLOURS,
    YELLOW,
    Context,
    Row,
)
from specdecode_exporter.monitoring.dashboard.panels import (
    alpha_steps,
    no_traffic_mappings,
    query,
    speedup_steps,
    stat_panel,
    steps,
    value_mappings,
)


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


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Is speculative decoding paying off? (window $window)",
          (alpha_stat, mean_length_stat, speedup_stat, break_even_stat, verdict_stat, k_advice_stat))
