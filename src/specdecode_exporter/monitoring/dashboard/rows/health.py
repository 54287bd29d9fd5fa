"""The dashboard's row: Health: the sidecars, their targets and the alerts firing."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models import prometheus as pm

from specdecode_exporter.core import metrics as m
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring.dashboard.context import GREEN, RED, Context, Row
from specdecode_exporter.monitoring.dashboard.panels import (
    queries,
    query,
    stat_panel,
    steps,
    table_panel,
    ts_panel,
    up_mappings,
)


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
    errors = ctx.staged_sum("collect_errors", ("reason",), ctx.health)  # the per-target record the health alerts read
    return ts_panel(
        "Collection errors by reason",
        "Failed collections per second by reason (connect, timeout, http_status, too_large, parse, "
        "no_spec_metrics). no_spec_metrics after a vLLM upgrade means the metric names changed or spec decode "
        "is off.", queries((errors, "{{reason}}")),
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


# The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above
# and its name here.
ROW = Row("Health", (collection_up, scrape_up, collection_errors, collection_duration, firing_alerts, sidecar_targets))
