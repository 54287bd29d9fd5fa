"""The Grafana dashboard: jsonnet, in the mixin (mixin/dashboards/, a file per row, and the panel kinds and PromQL
helpers in mixin/lib/), rendered here with the `jsonnet` package into grafana/dashboards/specdecode.json.

The jsonnet is the dashboard's one source. It reads two objects, both built from the monitoring config:

- ``_config`` (mixin/config.libsonnet): the values a jsonnet user tunes — thresholds, verdict bands, the page's
  short window, the runbook URL, the dashboard's uid and title. CONFIG_KEYS names the dashboard's, each with where
  it sits in the monitoring config.
- the shape (mixin/dashboards/shape.libsonnet, generated; shape()): what the rules and the sidecar define and the
  panels read by name — the records (from monitoring.rules and monitoring.stage, with the step each stage record
  is an increase over), the sidecar's metric names (core.contract.metrics), the aggregation level and its labels, the
  sidecar's windows, the quantiles. Not in ``_config``: a change to them changes which rules exist or what they
  are named, so it is made in the monitoring config and rebuilt; the records' names are never retyped in jsonnet.

``python -m specdecode_exporter.monitoring.build`` renders the dashboard from the mixin's sources with the
monitoring config's ``_config`` and shape (a user's ``--config`` included): the build needs the `jsonnet` package
(the ``dashboard`` extra) and the mixin's sources (a checkout, or ``--mixin DIR``); the running sidecar needs
neither.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specdecode_exporter.core.config.validation import duration_seconds
from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.core.contract.verdict import VERDICT_BY_CODE
from specdecode_exporter.monitoring import promql, rules, stage

# The dashboard's _config keys and where each sits in the monitoring config (attribute path of MonitoringConfig).
CONFIG_KEYS: dict[str, str] = {
    "runbookBaseURL": "runbook_base_url",
    "shortWindow": "windows.short",
    "baselineOffset": "baseline.offset",
    "pageAcceptanceRatio": "thresholds.page_acceptance_ratio",
    "goodAcceptanceRatio": "thresholds.good_acceptance_ratio",
    "driftDrop": "thresholds.drift_drop",
    "hurtingBelow": "speedups.hurting_below",
    "payingOffFrom": "speedups.paying_off_from",
    "maxPreemptionsPerRequestIncrease": "cost_vs_control.max_preemptions_per_request_increase",
    "minThroughputRatio": "cost_vs_control.min_throughput_ratio",
    "minWaitingRequests": "cost_vs_control.min_waiting_requests",
    "speculationShareBelow": "speculation_stopped.share_below",
    "dashboardUID": "dashboard.uid",
    "dashboardTitle": "dashboard.title",
    "dashboardRefresh": "dashboard.refresh",
    "dashboardTimeFrom": "dashboard.time_from",
}

# The mixin's dashboard, under mixin/: the field file mixin.libsonnet merges, the dashboard (a function of _config and
# the shape), the rows (one file each, as monitoring/dashboard/rows/ once were), the helpers, and the generated shape.
FIELD = "dashboards/dashboards.libsonnet"
DASHBOARD = "dashboards/specdecode.libsonnet"
SHAPE = "dashboards/shape.libsonnet"
ROWS = ("paying_off", "measured", "acceptance_over_time", "distribution", "per_request", "routing", "positions",
        "token_flow", "latency", "speculating", "costs", "alerts", "health")
SOURCES = (FIELD, DASHBOARD, "dashboards/context.libsonnet", *(f"dashboards/rows/{row}.libsonnet" for row in ROWS),
           "lib/panels.libsonnet", "lib/promql.libsonnet", "lib/stage.libsonnet")
DASHBOARD_FILE = "specdecode.json"  # its key in grafanaDashboards, and its name under grafana/dashboards/

# The sidecar's metrics the panels read, by the name the jsonnet gives them.
METRICS: dict[str, str] = {
    "up": m.UP.name,
    "info": m.INFO.name,
    "collectDuration": m.COLLECT_DURATION.name,
    "drafts": m.DRAFTS.exposed_name,
    "acceptedByPosition": m.ACCEPTED_BY_POSITION.exposed_name,
    "acceptanceRatio": m.ACCEPTANCE_RATIO.name,
    "intervalAcceptance": m.INTERVAL_ACCEPTANCE.name,
    "meanDraftLength": m.MEAN_DRAFT_LENGTH.name,
    "tokenAcceptanceProbability": m.TOKEN_ACCEPTANCE_PROBABILITY.name,
    "expectedSpeedupByLength": m.EXPECTED_SPEEDUP_BY_LENGTH.name,
    "recommendedK": m.RECOMMENDED_K.name,
    "breakEven": m.BREAK_EVEN.name,
    "breakEvenAtLoad": m.BREAK_EVEN_AT_LOAD.name,
    "calibratedCost": m.CALIBRATED_COST.name,
    "observedSpeedup": m.OBSERVED_SPEEDUP.name,
    "requestsRunning": m.REQUESTS_RUNNING.name,
    "requestsWaiting": m.REQUESTS_WAITING.name,
    "recommendedKByBatchSize": m.RECOMMENDED_K_BY_BATCH_SIZE.name,
    "expectedSpeedupByBatchSize": m.EXPECTED_SPEEDUP_BY_BATCH_SIZE.name,
    "scheduleExpectedGain": m.SCHEDULE_EXPECTED_GAIN.name,
    "acceptanceVariance": m.ACCEPTANCE_VARIANCE.name,
    "routeClassState": m.ROUTE_CLASS_STATE.name,
    "routeMeasuredSpeedup": m.ROUTE_MEASURED_SPEEDUP.name,
}


def _value(cfg: MonitoringConfig, path: str) -> Any:
    value: Any = cfg
    for name in path.split("."):
        value = getattr(value, name)
    return int(value) if isinstance(value, float) and value.is_integer() else value  # 5, as a user writes it


def config(cfg: MonitoringConfig) -> dict[str, Any]:
    """The dashboard's _config values, as the monitoring config sets them."""
    return {key: _value(cfg, path) for key, path in CONFIG_KEYS.items()}


def _seconds(duration: str) -> int | float:
    seconds = duration_seconds(duration)
    return int(seconds) if float(seconds).is_integer() else seconds


def shape(cfg: MonitoringConfig) -> dict[str, Any]:
    """What the rules and the sidecar define that the panels read (the module's docstring)."""
    level, long_window = cfg.alert_level, cfg.long_window
    staged = {key: {"record": stage.record(cfg, key), "group": family.group, "how": family.how}
              for key, family in stage.families(cfg).items()}
    interval_quantiles = [{"quantile": q, "name": m.quantile_name(q), "record": promql.record_name(
        level, m.INTERVAL_ACCEPTANCE.name, f"{m.quantile_name(q)}_rate{long_window}")} for q in cfg.quantiles]
    return {
        "alertPrefix": rules.ALERT_NAME_PREFIX,
        "level": level,
        "levelLabels": list(cfg.level_labels()),
        "windows": list(cfg.sidecar_windows),
        "defaultWindow": cfg.verdict_window,
        "longWindow": long_window,
        "baselineRange": cfg.baseline_range,
        "intervalQuantiles": interval_quantiles,
        "requestQuantile": {"quantile": cfg.thresholds.request_quantile,
                            "name": m.quantile_name(cfg.thresholds.request_quantile)},
        "acceptanceBuckets": list(m.ACCEPTANCE_RATIO_BUCKETS),
        "verdicts": [{"code": code, "verdict": str(verdict)} for code, verdict in sorted(VERDICT_BY_CODE.items())],
        "records": {
            "alpha": rules.alpha_record(cfg, "%(window)s"),  # the window is _config's shortWindow, or the long one
            "baseline": rules.baseline_record(cfg),
            "varianceBound": rules.variance_record(cfg, "bound"),
            "tappedRequests": rules.tapped_requests_record(cfg),
        },
        "metrics": METRICS,
        "stageClock": stage.CLOCK,
        "stageSteps": {group: _seconds(stage.step(cfg, group)) for group in stage.STAGE_GROUPS},
        "stage": staged,
    }


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WIDTH = 130  # a list or object is written on one line where it fits in this width


def _jsonnet(value: Any, indent: str = "", lead: int = 0) -> str:
    """JSON data as jsonnet, one field or item a line where the whole does not fit on one (``lead``: the width of
    what comes before it on its line)."""
    if isinstance(value, Mapping):
        names = {key: key if _IDENTIFIER.fullmatch(key) else json.dumps(key) for key in value}
        fields = [f"{names[k]}: {_jsonnet(v, indent + '  ', len(indent) + len(names[k]) + 4)}"
                  for k, v in value.items()]
        opening, closing, inline = "{", "}", "{ " + ", ".join(fields) + " }" if fields else "{}"
    elif isinstance(value, list):
        fields = [_jsonnet(v, indent + "  ", len(indent) + 2) for v in value]
        opening, closing, inline = "[", "]", "[" + ", ".join(fields) + "]"
    else:
        return json.dumps(value, ensure_ascii=False)
    if max(lead, len(indent)) + len(inline) + 1 <= _WIDTH and "\n" not in inline:
        return inline
    return opening + "\n" + "".join(f"{indent}  {field},\n" for field in fields) + indent + closing


SHAPE_NOTE = """\
// What the rules and the sidecar define that the dashboard's panels read by name: the records (the short stage's
// by group, and the step in seconds each group's records are increases over), the sidecar's metrics, the
// aggregation level the per-model panels pool by, the sidecar's windows, the quantiles. Not _config: changing one
// changes which rules exist or what they are named; change it in the monitoring config and rebuild
// (docs/one-source.md).
"""


def shape_file(cfg: MonitoringConfig, header: str) -> str:
    """mixin/dashboards/shape.libsonnet."""
    return header + SHAPE_NOTE + _jsonnet(shape(cfg)) + "\n"


class MixinSourcesMissing(FileNotFoundError):
    """The mixin's dashboard sources are not where the build looked."""


class MixinEvaluationError(ValueError):
    """The mixin's dashboard does not evaluate: jsonnet's error, its first line."""


def render(cfg: MonitoringConfig, mixin_dir: Path) -> str:
    """grafana/dashboards/specdecode.json: the mixin's dashboard under the monitoring config's _config and shape.
    ImportError without the `jsonnet` package; MixinSourcesMissing without the mixin's sources;
    MixinEvaluationError where they do not evaluate."""
    # `_jsonnet` is the name of the `jsonnet` package's Python binding, its documented interface
    # (jsonnet.org/ref/bindings.html), not a private module.
    import _jsonnet

    entry = mixin_dir / DASHBOARD
    if not entry.is_file():
        raise MixinSourcesMissing(f"{entry}: the dashboard is rendered from the jsonnet mixin's sources")
    try:
        text = _jsonnet.evaluate_file(str(entry), tla_codes={"config": json.dumps(config(cfg)),
                                                             "shape": json.dumps(shape(cfg))})
    except RuntimeError as exc:  # how the binding reports an evaluation error; its stack trace follows the first line
        raise MixinEvaluationError(str(exc).splitlines()[0]) from None
    return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
