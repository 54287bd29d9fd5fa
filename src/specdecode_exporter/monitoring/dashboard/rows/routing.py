"""The dashboard's row: Routing: the traffic spec decode slows down, sent to a pool without it (tap.route)."""

from __future__ import annotations

from typing import Any

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring.dashboard.context import RED, UNIT_SPEEDUP, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import line_and_area, queries, steps, ts_panel

ROUTE_CLASS = ("model_name", "workload", "temperature", "prompt_length")


def routed_classes(ctx: Context) -> Any:
    state = q.selector(m.ROUTE_CLASS_STATE.name, ctx.tapped.matchers)
    return (ts_panel(
        "Classes routed to the pool without spec decode",
        "1 while the request tap (tap.route) sends a class of requests (model, workload, temperature band, and "
        "prompt-length band where configured) to the fallback pool: a block of its requests showed α below the "
        "break-even. A class routed for long is the SpecDecodeClassRouted ticket: its draft needs attention.",
        queries((f"max by ({q.by(ROUTE_CLASS)}) ({state})",
                 "{{model_name}} {{workload}} T {{temperature}} {{prompt_length}}")),
        "none", w=8, h=8).min(0).max(1).decimals(0))


def routed_requests(ctx: Context) -> Any:
    return ts_panel(
        "Requests by pool and reason",
        "Completions through a routing tap: to the speculative pool (unrouted classes, and the canary of routed "
        "ones) or to the fallback (benefit); fallback_down: meant for the fallback, which was unreachable. In "
        "observe mode the fallback counts say where enforce mode would have sent them.",
        queries((ctx.staged_sum("route_requests_by_pool", ("upstream", "reason")), "{{upstream}} {{reason}}")),
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


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Routing: the traffic spec decode slows down, sent to a pool without it (tap.route)",
          (routed_classes, routed_requests, routed_speedup))
