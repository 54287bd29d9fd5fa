"""The dashboard's row: What it costs against the control pods: memory and throughput."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.builders import prometheus as pb

from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring.dashboard.context import UNIT_TOKENS_PER_S, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import dashed, override_props, queries, query, ts_panel


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


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("What it costs against the control pods: memory and throughput (window $window)",
          (kv_usage_vs_control, preemptions_vs_control, throughput_vs_control))
