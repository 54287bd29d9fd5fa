"""The jsonnet mixin (mixin/): the rules and the dashboard, reading the values users tune from ``_config``, laid out
as kubernetes-mixin lays its out (FILES): ``config.libsonnet`` (``_config``), ``alerts/``, ``rules/`` and
``dashboards/`` (one field each), and ``mixin.libsonnet``, which merges them::

    (import 'mixin.libsonnet') + { _config+:: { pageAcceptanceRatio: 0.4 } }

The alerts, the rules and the rules' keys of ``_config`` are monitoring.mixin_rules': the rules' own templates with
named formats. The dashboard is jsonnet written by hand (monitoring.mixin_dashboard: the source the build renders
grafana/dashboards/ from); its keys of ``_config`` are written here beside the rules'.

What is not in ``_config`` (aggregation levels, quantiles, the sidecar's windows, which alert reads which window)
changes the set or the names of the rules: change it in the monitoring config and rebuild.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring import mixin_dashboard, mixin_rules


def with_value(obj: Any, path: str, value: Any) -> Any:
    """``obj`` (frozen dataclasses) with the field at ``path`` replaced by ``value``."""
    head, _, rest = path.partition(".")
    return dataclasses.replace(obj, **{head: with_value(getattr(obj, head), rest, value) if rest else value})


USAGE = """\
// Override any value of _config (config.libsonnet) from your own jsonnet, e.g. a lower page threshold and a wider
// drift margin:
//   (import 'mixin.libsonnet') + { _config+:: { pageAcceptanceRatio: 0.4, driftDrop: 0.1 } }
// Per alert: _config+:: { alerts+: { SpecDecodeAcceptanceRateLow+: { 'for': '5m' } } }; extra labels on every
// alert: _config+:: { extraAlertLabels+: { team: 'ml-platform' } }.
"""

# The mixin's files (under mixin/), laid out as kubernetes-mixin lays its out: the entry point that imports the
# others, _config, and a file per field. Each field's file reads $._config, so it renders with config.libsonnet (or a
# _config of your own) merged beside it.
ENTRY = "mixin.libsonnet"
CONFIG = "config.libsonnet"
ALERTS_PART, RULES_PART = "alerts/alerts.libsonnet", "rules/rules.libsonnet"
# Every field's file, in the entry point's order; the dashboards' is hand-written, the others generated (FILES).
PARTS = {ALERTS_PART: mixin_rules.ALERTS_FIELD, RULES_PART: mixin_rules.RULES_FIELD,
         mixin_dashboard.FIELD: "grafanaDashboards"}
FILES = (ENTRY, CONFIG, ALERTS_PART, RULES_PART)


def render(cfg: MonitoringConfig, header: str) -> dict[str, str]:
    """The mixin's generated files (FILES, paths relative to mixin/), each after ``header``; the dashboard's own
    files are hand-written (monitoring.mixin_dashboard)."""
    imports = " +\n".join(f"(import '{path}')" for path in (CONFIG, *PARTS))
    config_fields = mixin_rules.config_fields(cfg, mixin_dashboard.config(cfg))
    return {ENTRY: header + USAGE + imports + "\n",
            CONFIG: header + USAGE + "{\n  _config+:: {\n" + config_fields + "  },\n}\n",
            ALERTS_PART: header + mixin_rules.alerts_libsonnet(cfg),
            RULES_PART: header + mixin_rules.rules_libsonnet(cfg)}
