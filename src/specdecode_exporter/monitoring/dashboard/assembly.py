"""The dashboard: its header, links and variables, then the rows of ``rows.ROWS`` in order."""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from specdecode_exporter.core import metrics as m
from specdecode_exporter.core.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring.dashboard.context import DATASOURCE_VAR, DS, TAGS, Context, label_matchers
from specdecode_exporter.monitoring.dashboard.rows import ROWS


def label_var(name: str, label: str, metric_selector: str, description: str) -> db.QueryVariable:
    return (db.QueryVariable(name).label(label).description(description).datasource(DS)
            .query(f"label_values({metric_selector}, {name})").refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))


def variables(ctx: Context) -> list[Any]:
    extra = ctx.extra_variables
    scoped = label_matchers(extra)
    up, drafts = m.UP.name, m.DRAFTS.exposed_name

    def within(*names: str) -> str:
        return ", ".join(part for part in (scoped, label_matchers(names)) if part)

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
                         "the monitoring config by src/specdecode_exporter/monitoring/dashboard/ (a module per row).")
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
    for row in ROWS:
        builder = builder.with_row(db.Row(row.title))
        for make_panel in row.panels:
            builder = builder.with_panel(make_panel(ctx))
    dash = builder.build()
    for i, panel in enumerate(dash.panels or [], start=1):
        panel.id_val = i  # stable ids in reading order (the SDK leaves them at 0)
    return dash


def render(cfg: MonitoringConfig) -> str:
    return json.dumps(build(cfg), cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
