"""The dashboard's row: Token flow."""

from __future__ import annotations

from typing import Any

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring.dashboard.context import (
    GREEN,
    RED,
    UNIT_TOKENS_PER_S,
    UNIT_TOKENS_PER_STEP,
    Context,
    Row,
)
from specdecode_exporter.monitoring.dashboard.panels import override_props, queries, ts_panel


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


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Token flow", (token_flow, drafts_rate, mean_draft_length_over_time))
