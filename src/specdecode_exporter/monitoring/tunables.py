"""The values of the monitoring config a mixin user tunes from ``_config``, as the rules read them: named placeholders.

The rules are built as templates (monitoring.rules): wherever an expression, a record's name or an annotation uses
one of these values it holds its placeholder, ``%(pageAcceptanceRatio)g``, never the number, and every literal
``%`` is written ``%%``. ``fill`` renders a template with ``mapping(cfg)``: Python's ``%`` operator, the way
kubernetes-mixin renders ``'…%(selector)s…' % $._config``. The mixin (monitoring.mixin_rules) emits the same
templates with ``% $._config`` and a ``_config`` of these keys, so jsonnet renders exactly the shipped rules, and a
value overridden in jsonnet changes what the same change in the monitoring config changes.

A key is the user's (a field of ``_config`` with the configured default), or derived from the user's keys: a hidden
field (``::``) whose jsonnet expression reads ``self`` (so it follows an override) and whose Python value is the
same computation. Numbers are rendered with ``g`` (Python and jsonnet agree on it; jsonnet's ``s`` writes 17
digits). Every other value of the monitoring config changes the set or the names of the rules: the rules take it
as it is configured (monitoring.mixin.BAKED says why for each).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring.promql import bucket_at_or_below


@dataclass(frozen=True, slots=True)
class Key:
    """One key of ``_config`` the rules read."""

    name: str
    conversion: Literal["s", "g"]  # how the value is written into a template: text, or a number (%g)
    value: Callable[[MonitoringConfig], Any]  # its value, from the monitoring config
    # Derived: its jsonnet expression over ``self`` (the _config object), given the monitoring config (for a baked
    # constant in it); None: the user's.
    jsonnet: Callable[[MonitoringConfig], str] | None = None
    path: str | None = None  # the user's: where the monitoring config holds it (attributes of MonitoringConfig)

    @property
    def placeholder(self) -> str:
        return f"%({self.name}){self.conversion}"


BUCKETS_KEY = "acceptanceRatioBuckets"  # a hidden constant of _config: the per-request histograms' bounds
BUCKET_FUNCTION = "bucketAtOrBelow"  # a hidden function of _config: the largest of those bounds at or below x
BUCKET_JSONNET = (f"{BUCKET_FUNCTION}(x):: std.foldl(function(best, b) if b <= x + 1e-9 then b else best, "
                  f"self.{BUCKETS_KEY}, null)")


def _bucket(user_key: str, ratio: Callable[[MonitoringConfig], float]) -> Key:
    """The bucket bound a threshold falls on (promql.bucket_at_or_below)."""
    jsonnet = f"self.{BUCKET_FUNCTION}(self.{user_key})"
    return Key(f"{user_key.removesuffix('Ratio')}Bucket", "g",
               lambda cfg: bucket_at_or_below(m.ACCEPTANCE_RATIO_BUCKETS, ratio(cfg)), lambda _: jsonnet)


def _percent(user_key: str, ratio: Callable[[MonitoringConfig], float]) -> Key:
    """A ratio as a percentage, for the annotations: 0.5 → 50 (written ``%(…Percent)g%%``)."""
    return Key(f"{user_key.removesuffix('Ratio').removesuffix('Below')}Percent", "g",
               lambda cfg: ratio(cfg) * 100, lambda _: f"self.{user_key} * 100")


def _page(cfg: MonitoringConfig) -> float:
    return cfg.thresholds.page_acceptance_ratio


def _request(cfg: MonitoringConfig) -> float:
    return cfg.thresholds.request_acceptance_ratio


def _page_null(cfg: MonitoringConfig) -> float:
    return cfg.thresholds.page_acceptance_ratio + cfg.statistics.page_margin


def _user(name: str, conversion: Literal["s", "g"], path: str) -> Key:
    """A key the user sets: the monitoring config's value at ``path`` (attributes of MonitoringConfig)."""
    def value(cfg: MonitoringConfig) -> Any:
        found: Any = cfg
        for attribute in path.split("."):
            found = getattr(found, attribute)
        return found
    return Key(name, conversion, value, path=path)


# The user's keys, in the order config.libsonnet lists them.
USER: tuple[Key, ...] = (
    _user("runbookBaseURL", "s", "runbook_base_url"),
    _user("metricSelector", "s", "selectors.metric"),
    _user("exporterJobSelector", "s", "selectors.exporter_job"),
    _user("shortWindow", "s", "windows.short"),
    _user("windowEvaluationInterval", "s", "windows.evaluation_interval"),
    _user("baselineOffset", "s", "baseline.offset"),
    _user("minDraftTokensPerSecond", "g", "min_draft_tokens_per_second"),
    _user("minRequestsPerHour", "g", "min_requests_per_hour"),
    _user("pageAcceptanceRatio", "g", "thresholds.page_acceptance_ratio"),
    _user("driftDrop", "g", "thresholds.drift_drop"),
    _user("intervalAcceptanceRatio", "g", "thresholds.interval_acceptance_ratio"),
    _user("requestAcceptanceRatio", "g", "thresholds.request_acceptance_ratio"),
    _user("hurtingBelow", "g", "speedups.hurting_below"),
    _user("maxPreemptionsPerRequestIncrease", "g", "cost_vs_control.max_preemptions_per_request_increase"),
    _user("minThroughputRatio", "g", "cost_vs_control.min_throughput_ratio"),
    _user("minWaitingRequests", "g", "cost_vs_control.min_waiting_requests"),
    _user("speculationShareBelow", "g", "speculation_stopped.share_below"),
    _user("minGeneratedTokensPerSecond", "g", "speculation_stopped.min_generated_tokens_per_second"),
)
NULLABLE = frozenset({"windowEvaluationInterval"})  # null: the field it fills (a group's interval) is left out

# What derives from them: hidden fields of _config.
DERIVED: tuple[Key, ...] = (
    Key("metricMatchers", "s", lambda c: f"{{{c.metric_selector}}}" if c.metric_selector else "",
        lambda _: "if self.metricSelector == '' then '' else '{' + self.metricSelector + '}'"),
    Key("metricMatchersFirst", "s", lambda c: f"{c.metric_selector}, " if c.metric_selector else "",
        lambda _: "if self.metricSelector == '' then '' else self.metricSelector + ', '"),
    Key("exporterJobSelectorQuoted", "s", lambda c: c.exporter_job_selector.replace('"', "'"),
        lambda _: "std.strReplace(self.exporterJobSelector, '\"', \"'\")"),
    Key("runbookURL", "s", lambda c: c.runbook_base_url.rstrip("/") + "/alerts/runbook.md",
        lambda _: "std.rstripChars(self.runbookBaseURL, '/') + '/alerts/runbook.md'"),
    Key("pageNullRatio", "g", _page_null,
        lambda c: f"self.pageAcceptanceRatio + {json.dumps(c.statistics.page_margin)}"),
    _bucket("pageAcceptanceRatio", _page),
    _bucket("requestAcceptanceRatio", _request),
    _percent("pageAcceptanceRatio", _page),
    _percent("pageNullRatio", _page_null),
    _percent("requestAcceptanceRatio", _request),
    _percent("intervalAcceptanceRatio", lambda c: c.thresholds.interval_acceptance_ratio),
    _percent("speculationShareBelow", lambda c: c.speculation_stopped.share_below),
    _percent("minThroughputRatio", lambda c: c.cost_vs_control.min_throughput_ratio),
    Key("driftDropPoints", "g", lambda c: c.thresholds.drift_drop * 100, lambda _: "self.driftDrop * 100"),
)
KEYS: dict[str, Key] = {k.name: k for k in (*USER, *DERIVED)}


def p(name: str) -> str:
    """The placeholder of key ``name``: ``%(name)g`` for a number, ``%(name)s`` for text."""
    return KEYS[name].placeholder


def mapping(cfg: MonitoringConfig) -> dict[str, Any]:
    """Every key's value from ``cfg``: what the templates are filled with."""
    return {k.name: k.value(cfg) for k in KEYS.values()}


def escape(text: str) -> str:
    """Literal text (a baked value, a Prometheus template's printf) inside a template."""
    return text.replace("%", "%%")


def fill(template: Any, values: Mapping[str, Any]) -> Any:
    """A template (rule groups: dicts, lists, strings) rendered with ``values``; a field whose template is the
    placeholder of a nullable key whose value is None is left out."""
    if isinstance(template, str):
        return template % values
    if isinstance(template, Mapping):
        return {k: fill(v, values) for k, v in template.items() if not _absent(v, values)}
    if isinstance(template, list | tuple):
        return [fill(v, values) for v in template]
    return template


def _absent(template: Any, values: Mapping[str, Any]) -> bool:
    return isinstance(template, str) and any(template == f"%({name})s" and values.get(name) is None
                                             for name in NULLABLE)
