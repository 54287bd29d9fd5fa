"""The dashboard's row: Latency beside it (vLLM)."""

from __future__ import annotations

from typing import Any

from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring.dashboard.context import ITL, RATE_INTERVAL, UNIT_TOKENS_PER_S, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import override_props, queries, ts_panel


def vllm_quantiles(ctx: Context, title: str, description: str, histogram: str) -> Any:
    """P50 and P99 of one of vLLM's own latency histograms, per model, from vLLM's own series (the sidecar does not
    export inter-token latency: the one panel that ranges over raw series)."""
    return ts_panel(
        title, description,
        queries(*((q.histogram_quantile(quantile, histogram, ctx.vllm, RATE_INTERVAL), f"{name} {{{{model_name}}}}")
                  for quantile, name in ((0.5, "p50"), (0.99, "p99")))),
        "s", w=8).min(0)


def tpot_quantiles(ctx: Context) -> Any:
    """vLLM's TPOT histogram as the sidecars export it, from the rules' stage: cheap at any range."""
    quantiles = ((ctx.pooled.quantile(quantile, "tpot", RATE_INTERVAL, by_also=("spec_decode",)),
                  f"{name} {{{{model_name}}}} spec_decode={{{{spec_decode}}}}")
                 for quantile, name in ((0.5, "p50"), (0.99, "p99")))
    return ts_panel(
        "Time per output token (vLLM) p50 / p99",
        "vLLM's per-request TPOT histogram (true time per generated token; vLLM ≥ 0.11), as the sidecars export it "
        "(reset-safe; spec_decode=false: control pods), per model from the rules' one-minute stage. This is what "
        "spec decode should lower: read it beside α.",
        queries(*quantiles), "s", w=8).min(0)


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
                (ctx.staged_sum("generated", ("model_name",)), "generated {{model_name}}")),
        "short", w=8)
        .min(0).override_by_query("B", override_props(unit=UNIT_TOKENS_PER_S, custom__axisPlacement="right")))


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Latency beside it (vLLM)", (tpot_quantiles, itl_quantiles, load_panel))
