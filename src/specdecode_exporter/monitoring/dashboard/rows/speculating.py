"""The dashboard's row: Is it still speculating? Which k at which batch size?"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import prometheus as pm

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring import stage
from specdecode_exporter.monitoring.dashboard.context import RATE_INTERVAL, RED, UNIT_SPEEDUP, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import (
    dashed,
    line_and_area,
    queries,
    query,
    steps,
    table_panel,
    ts_panel,
)


def speculative_share(ctx: Context) -> Any:
    # The records SpecDecodeSpeculationStopped reads, per engine.
    share = q.guarded_ratio(stage.rate(ctx.cfg, "series_emitted", RATE_INTERVAL, ctx.engines),
                            stage.rate(ctx.cfg, "series_generated", RATE_INTERVAL, ctx.engines))
    stopped = ctx.cfg.speculation_stopped.share_below
    return (ts_panel(
        "Speculative token share",
        "Share of each engine's generated tokens that speculative steps produced: (drafts + accepted) / generated "
        "tokens. 1 while every step speculates (a little below: each request's first token comes from prefill), 0 "
        "once speculation stopped while the engine still generates: an acceptance gate (TensorRT-LLM switches it off "
        "for good), a batch-size schedule at k = 0, an ngram drafter that finds nothing. Below "
        f"{stopped:.0%}: SpecDecodeSpeculationStopped.",
        queries((share, "{{instance}} {{target}} engine {{engine}}")), "percentunit", w=6)
        .min(0).max(1).thresholds(steps((None, RED), (stopped, "transparent"))).thresholds_style(line_and_area()))


def scheduled_steps(ctx: Context) -> Any:
    steps_by_k = ctx.pooled.rate("scheduled_steps", RATE_INTERVAL, by_also=("num_speculative_tokens",))
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


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Is it still speculating? Which k at which batch size?",
          (speculative_share, scheduled_steps, schedule_table, schedule_gain))
