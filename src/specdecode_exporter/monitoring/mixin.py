"""The jsonnet mixin (mixin/): the rules and the dashboard, reading the values users tune from ``_config``, laid out
as kubernetes-mixin lays its out (FILES): ``config.libsonnet`` (``_config``), ``lib/utils.libsonnet`` (the helpers
the dashboard's expressions call: label matchers from ``_config`` go through ``utils.selector`` alone), ``alerts/``,
``rules/`` and ``dashboards/`` (one field each), and ``mixin.libsonnet``, which merges them::

    (import 'mixin.libsonnet') + { _config+:: { pageAcceptanceRatio: 0.4 } }

The alerts, the rules and the rules' keys of ``_config`` are monitoring.mixin_rules': the rules' own templates with
named formats. The dashboard, here: rendered once by its generator from a symbolic copy of the monitoring config
whose tunable values are placeholders (TUNABLE). A string is a unique token; a number keeps its value (so
comparisons and validation still work) and becomes a token where it is formatted; arithmetic, str.replace/rstrip
and promql.bucket_at_or_below carry their derivation along as a jsonnet expression. Every rendered string holding
tokens becomes a jsonnet format string over ``$._config`` values; a number that is a placeholder becomes its
expression. A new panel needs nothing here; a new tunable value is one line in TUNABLE (and, where the rules read
it, in monitoring.tunables). tests/rules/test_mixin.py overrides every tunable value in jsonnet and checks that the
mixin renders exactly what the generators render from a monitoring config with the same change.

What is not in ``_config`` (aggregation levels, quantiles, the sidecar's windows, which alert reads which window)
changes the set or the names of the rules: change it in the monitoring config and rebuild.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from specdecode_exporter.core.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring import mixin_rules

Kind = Literal["ratio", "number", "duration", "text", "matchers"]


@dataclass(frozen=True, slots=True)
class Tunable:
    """One value of the monitoring config that ``_config`` holds: where it is in MonitoringConfig, its key."""

    path: str  # attribute path in MonitoringConfig, e.g. thresholds.page_acceptance_ratio
    key: str  # its name in _config
    kind: Kind  # "matchers": label matchers that may be empty, joined with ", " to others


TUNABLE: tuple[Tunable, ...] = (
    Tunable("runbook_base_url", "runbookBaseURL", "text"),
    Tunable("selectors.metric", "metricSelector", "matchers"),
    Tunable("selectors.exporter_job", "exporterJobSelector", "text"),
    Tunable("windows.short", "shortWindow", "duration"),
    Tunable("windows.evaluation_interval", "windowEvaluationInterval", "duration"),
    Tunable("baseline.offset", "baselineOffset", "duration"),
    Tunable("min_draft_tokens_per_second", "minDraftTokensPerSecond", "number"),
    Tunable("min_requests_per_hour", "minRequestsPerHour", "number"),
    Tunable("thresholds.page_acceptance_ratio", "pageAcceptanceRatio", "ratio"),
    Tunable("thresholds.good_acceptance_ratio", "goodAcceptanceRatio", "ratio"),
    Tunable("thresholds.drift_drop", "driftDrop", "ratio"),
    Tunable("thresholds.interval_acceptance_ratio", "intervalAcceptanceRatio", "ratio"),
    Tunable("thresholds.request_acceptance_ratio", "requestAcceptanceRatio", "ratio"),
    Tunable("speedups.hurting_below", "hurtingBelow", "number"),
    Tunable("speedups.paying_off_from", "payingOffFrom", "number"),
    Tunable("cost_vs_control.max_preemptions_per_request_increase", "maxPreemptionsPerRequestIncrease", "number"),
    Tunable("cost_vs_control.min_throughput_ratio", "minThroughputRatio", "ratio"),
    Tunable("cost_vs_control.min_waiting_requests", "minWaitingRequests", "number"),
    Tunable("speculation_stopped.share_below", "speculationShareBelow", "ratio"),
    Tunable("speculation_stopped.min_generated_tokens_per_second", "minGeneratedTokensPerSecond", "number"),
    Tunable("dashboard.uid", "dashboardUID", "text"),
    Tunable("dashboard.title", "dashboardTitle", "text"),
    Tunable("dashboard.refresh", "dashboardRefresh", "text"),
    Tunable("dashboard.time_from", "dashboardTimeFrom", "text"),
)
# Besides these: _config.alerts.<name>.severity and ['for'] of every alert, and _config.extraAlertLabels.
ALERT_FIELDS = (("severity", "severity"), ("for_", "for"))
EXTRA_LABELS_KEY = "extraAlertLabels"
ALERTS_KEY = "alerts"
# The monitoring config's values that are not in _config, and why (tests/rules/test_mixin.py: every value is in one).
BAKED = {
    "target_labels": "the labels of the rules' joins: the rules' structure",
    "levels": "the aggregation levels: which recording rules exist",
    "alert_level": "names the recording rules",
    "windows.sidecar": "the sidecar's --collect.windows; the dashboard's window choices",
    "windows.verdict": "the dashboard's default window, one of windows.sidecar",
    "quantiles": "which quantile recording rules exist",
    "thresholds.interval_quantile": "one of quantiles: names the recording rule the ticket reads",
    "thresholds.request_quantile": "names the per-request quantile recording rule",
    "alerts.window": "which of the short and long windows an alert reads",
    "probe.measure_below": "the probe's, not the rules' or the dashboard's",
    "probe.ship_speedup": "the probe's, not the rules' or the dashboard's",
    "force_for": "the end-to-end profile's",
    "windows.long": "the tickets' window: their tests' bars are worked out from its length (core.evidence)",
    "windows.sidecar_alert": "the per-pod latency tests' window: their bars are worked out from its length",
    "baseline.range": "the drift ticket adds the baseline's own variance, worked out from its length",
    "statistics.draft_tokens_per_request": "the tests' variance per drafted token, worked out at build time",
    "statistics.request_acceptance_sd": "the tests' variance per drafted token, worked out at build time",
    "statistics.min_requests": "the tests' minimum evidence, worked out at build time",
    "statistics.evaluation_interval": "the tests' bars count its evaluations (core.evidence)",
    "windows.stage_interval": "the stage's records are increases over it, and the windows divide by it",
    "statistics.page_windows": "which page windows and recording rules exist; their bars (core.evidence)",
    "statistics.page_budget_shares": "the page's bars are worked out from them (core.evidence)",
    "statistics.page_margin": "the page's null α, where its bars hold",
    "statistics.false_pages_per_30d": "the page's bars are worked out from it (core.evidence)",
    "statistics.false_tickets_per_30d": "the tickets' bars are worked out from it (core.evidence)",
    "profile": "which profile was applied",
}

_TOKEN = re.compile("\ue000[0-9]+\ue001")
_NUMBER_SPEC = re.compile(r"(?:\.([0-9]+))?([gfe%])")


def config_ref(*keys: str) -> str:
    """The jsonnet expression of a _config value: $._config.a.b, with ['for'] where a key is not an identifier."""
    return "$._config" + "".join(f".{k}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and k != "for"
                                 else f"[{_literal(k)}]" for k in keys)


def _literal(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


class Placeholders:
    """The tokens of one symbolic render and the jsonnet expression each stands for."""

    def __init__(self) -> None:
        self.expressions: dict[str, str] = {}
        self.optional: set[str] = set()  # tokens of "matchers" values: may be empty
        self.splices: set[str] = set()  # tokens used as a key: the object they stand for is merged in

    def token(self, expression: str) -> str:
        token = f"\ue000{len(self.expressions)}\ue001"
        self.expressions[token] = expression
        return token


class SymbolicText(str):
    """A string config value in a symbolic render: its text is a unique token."""

    placeholders: Placeholders
    expression: str

    def __new__(cls, placeholders: Placeholders, expression: str) -> SymbolicText:
        text = super().__new__(cls, placeholders.token(expression))
        text.placeholders, text.expression = placeholders, expression
        return text

    def replace(self, old: str, new: str, count: int = -1) -> str:  # type: ignore[override]
        if count != -1:
            raise TypeError("a mixin _config value cannot be replaced a counted number of times")
        return SymbolicText(self.placeholders, f"std.strReplace({self.expression}, {_literal(old)}, {_literal(new)})")

    def rstrip(self, chars: str | None = None) -> str:
        if not chars:
            raise TypeError("strip named characters from a mixin _config value")
        return SymbolicText(self.placeholders, f"std.rstripChars({self.expression}, {_literal(chars)})")


def _number_format(expression: str, spec: str) -> str:
    """Python's format(x, spec) as jsonnet (std.format is printf-like, as Python's % is)."""
    if spec == "":
        return f"std.toString({expression})"
    match = _NUMBER_SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(f"format spec {spec!r} of a mixin _config value has no jsonnet counterpart here")
    precision, kind = match.groups()
    dot = f".{precision}" if precision is not None else ""
    if kind == "%":
        return f"std.format({_literal(f'%{dot}f%%')}, {expression} * 100)"
    return f"std.format({_literal(f'%{dot}{kind}')}, {expression})"


class SymbolicNumber(float):
    """A number config value in a symbolic render: its value as configured, and its jsonnet expression. Arithmetic
    keeps it symbolic; formatting it gives a token."""

    placeholders: Placeholders
    expression: str

    def __new__(cls, value: float, placeholders: Placeholders, expression: str) -> SymbolicNumber:
        number = super().__new__(cls, value)
        number.placeholders, number.expression = placeholders, expression
        return number

    def derive(self, value: float, jsonnet: Callable[[str], str]) -> SymbolicNumber:
        """A value computed from this one in Python, and the same computation in jsonnet."""
        return SymbolicNumber(value, self.placeholders, jsonnet(self.expression))

    def __format__(self, spec: str) -> str:
        return self.placeholders.token(_number_format(self.expression, spec))

    def __str__(self) -> str:
        return format(self, "")

    def _apply(self, value: float, op: str, other: float, reflected: bool = False) -> SymbolicNumber:
        theirs = other.expression if isinstance(other, SymbolicNumber) else _literal(float(other))
        left, right = (theirs, self.expression) if reflected else (self.expression, theirs)
        return SymbolicNumber(value, self.placeholders, f"({left} {op} {right})")

    def __add__(self, other: float, /) -> SymbolicNumber:
        return self._apply(float(self) + other, "+", other)

    def __radd__(self, other: float, /) -> SymbolicNumber:
        return self._apply(other + float(self), "+", other, reflected=True)

    def __sub__(self, other: float, /) -> SymbolicNumber:
        return self._apply(float(self) - other, "-", other)

    def __rsub__(self, other: float, /) -> SymbolicNumber:
        return self._apply(other - float(self), "-", other, reflected=True)

    def __mul__(self, other: float, /) -> SymbolicNumber:
        return self._apply(float(self) * other, "*", other)

    def __rmul__(self, other: float, /) -> SymbolicNumber:
        return self._apply(other * float(self), "*", other, reflected=True)

    def __truediv__(self, other: float, /) -> SymbolicNumber:
        return self._apply(float(self) / other, "/", other)

    def __rtruediv__(self, other: float, /) -> SymbolicNumber:
        return self._apply(other / float(self), "/", other, reflected=True)

    def __neg__(self) -> SymbolicNumber:
        return SymbolicNumber(-float(self), self.placeholders, f"(-{self.expression})")


# ----------------------------------------------------------------------------------------- the symbolic config


def get_path(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def with_value(obj: Any, path: str, value: Any) -> Any:
    """``obj`` (frozen dataclasses) with the field at ``path`` replaced by ``value``."""
    head, _, rest = path.partition(".")
    return dataclasses.replace(obj, **{head: with_value(getattr(obj, head), rest, value) if rest else value})


def _placeholder(placeholders: Placeholders, tunable: Tunable, value: Any) -> Any:
    expression = config_ref(tunable.key)
    if tunable.kind in ("ratio", "number"):
        return SymbolicNumber(float(value), placeholders, expression)
    text = SymbolicText(placeholders, expression)
    if tunable.kind == "matchers":
        placeholders.optional.add(text)
    return text


def symbolic(cfg: MonitoringConfig, placeholders: Placeholders) -> MonitoringConfig:
    """``cfg`` with every tunable value, every alert's severity and for:, and the extra labels as placeholders."""
    for tunable in TUNABLE:
        cfg = with_value(cfg, tunable.path, _placeholder(placeholders, tunable, get_path(cfg, tunable.path)))
    alerts = tuple((name, dataclasses.replace(settings, **{attribute: SymbolicText(placeholders, config_ref(
        "alerts", name, key)) for attribute, key in ALERT_FIELDS})) for name, settings in cfg.alerts)
    splice = placeholders.token(config_ref(EXTRA_LABELS_KEY))
    placeholders.splices.add(splice)
    return dataclasses.replace(cfg, alerts=alerts, extra_alert_labels=((splice, ""),))


def _plain_number(value: Any) -> Any:
    """5 rather than 5.0, as a user would write it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def defaults(cfg: MonitoringConfig) -> dict[str, Any]:
    """The _config object: every tunable value as configured."""
    values: dict[str, Any] = {t.key: _plain_number(get_path(cfg, t.path)) for t in TUNABLE}
    values[ALERTS_KEY] = {name: {key: getattr(settings, attribute) for attribute, key in ALERT_FIELDS}
                        for name, settings in cfg.alerts}
    values[EXTRA_LABELS_KEY] = dict(cfg.extra_alert_labels)
    return values


# ----------------------------------------------------------------------------------------------- jsonnet text


def _optional_contexts(text: str, placeholders: Placeholders) -> str:
    """Matchers that may be empty appear as ``{M}`` (alone) or ``M, `` (before others): calls of the one selector
    helper (lib/utils.libsonnet), which drops the braces or the comma when the value is empty, as promql.selector
    and Scope.also do."""
    for token in placeholders.optional:
        if token not in text:
            continue
        value = placeholders.expressions[token]
        alone = placeholders.token(f"{SELECTOR}({value})")
        first = placeholders.token(f"{SELECTOR}({value}, beforeOthers=true)")
        text = text.replace("{" + token + "}", alone).replace(token + ", ", first)
        if token in text:
            raise ValueError(f"{placeholders.expressions[token]} appears outside a selector's matchers: {text!r}")
    return text


def _string(text: str, placeholders: Placeholders) -> str:
    text = _optional_contexts(str(text), placeholders)  # str(): a SymbolicText's own replace() must not run here
    tokens = _TOKEN.findall(text)
    if not tokens:
        return _literal(text)
    if tokens == [text]:
        return placeholders.expressions[text]
    template = "%s".join(part.replace("%", "%%") for part in _TOKEN.split(text))
    return f"{_literal(template)} % [{', '.join(placeholders.expressions[t] for t in tokens)}]"


def jsonnet(value: Any, placeholders: Placeholders, indent: str = "") -> str:
    """``value`` (JSON data holding placeholders) as jsonnet, laid out like json.dumps(indent=2)."""
    inner = indent + "  "
    if isinstance(value, SymbolicNumber):
        return value.expression
    if isinstance(value, str):
        return _string(value, placeholders)
    if isinstance(value, Mapping):
        splices = [placeholders.expressions[k] for k in value if k in placeholders.splices]
        fields = [f"{inner}{_literal(k)}: {jsonnet(v, placeholders, inner)}"
                  for k, v in value.items() if k not in placeholders.splices]
        obj = "{\n" + ",\n".join(fields) + f"\n{indent}}}" if fields else "{}"
        return " + ".join([obj, *splices])
    if isinstance(value, Sequence):
        if not value:
            return "[]"
        return "[\n" + ",\n".join(inner + jsonnet(v, placeholders, inner) for v in value) + f"\n{indent}]"
    return _literal(value)


def plain(value: Any) -> Any:
    """A dashboard model (grafana-foundation-sdk) as JSON data, placeholders kept (json.dumps would lose them)."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return plain(to_json())
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


USAGE = """\
// Override any value of _config (config.libsonnet) from your own jsonnet, e.g. a lower page threshold and a wider
// drift margin:
//   (import 'mixin.libsonnet') + { _config+:: { pageAcceptanceRatio: 0.4, driftDrop: 0.1 } }
// Per alert: _config+:: { alerts+: { SpecDecodeAcceptanceRateLow+: { 'for': '5m' } } }; extra labels on every
// alert: _config+:: { extraAlertLabels+: { team: 'ml-platform' } }.
"""

# The mixin's files (under mixin/), laid out as kubernetes-mixin lays its out: the entry point that imports the
# others, _config, the one library of helpers, and a file per field. Each field's file reads $._config, so it
# renders with config.libsonnet (or a _config of your own) merged beside it.
ENTRY = "mixin.libsonnet"
CONFIG = "config.libsonnet"
UTILS = "lib/utils.libsonnet"
ALERTS_PART, RULES_PART, DASHBOARDS_PART = ("alerts/alerts.libsonnet", "rules/rules.libsonnet",
                                            "dashboards/dashboards.libsonnet")
PARTS = {ALERTS_PART: mixin_rules.ALERTS_FIELD, RULES_PART: mixin_rules.RULES_FIELD,
         DASHBOARDS_PART: "grafanaDashboards"}
FILES = (ENTRY, CONFIG, UTILS, *PARTS)
SELECTOR = "utils.selector"  # the one way label matchers from _config (which may be empty) enter an expression

UTILS_TEXT = """\
{
  // selector(matchers): '{' + matchers + '}', the whole of a selector's matchers; selector(matchers,
  // beforeOthers=true): matchers + ', ', in front of the expression's own. Nothing where matchers is '' (the
  // default metricSelector), so an empty selector adds neither braces nor a comma.
  selector(matchers, beforeOthers=false)::
    if matchers == '' then '' else if beforeOthers then matchers + ', ' else '{' + matchers + '}',

  // bucketAtOrBelow(bounds, x): the largest of the ascending bucket bounds at or below x, the bucket a threshold
  // falls on (promql.bucket_at_or_below).
  bucketAtOrBelow(bounds, x)::
    std.foldl(function(best, b) if b <= x + 1e-9 then b else best, bounds, null),
}
"""
HELPERS = re.compile(r"\butils\.")


def _part(key: str, value: Any, placeholders: Placeholders, path: str) -> str:
    """One field's file: the field, merged (+::) and hidden, as kube-prometheus expects; the helpers imported
    where its expressions call them."""
    body = f"{{\n  {key}+:: {jsonnet(value, placeholders, '  ')},\n}}\n"
    if not HELPERS.search(body):
        return body
    up = "../" * path.count("/")
    return f"local utils = import '{up}{UTILS}';\n\n{body}"


def render(cfg: MonitoringConfig, header: str) -> dict[str, str]:
    """The mixin's files (paths relative to mixin/), each after ``header``. Needs grafana-foundation-sdk
    (ImportError without it). The alerts, the rules and the rules' keys of _config: monitoring.mixin_rules."""
    from specdecode_exporter.monitoring import dashboard

    placeholders = Placeholders()
    symbolic_cfg = symbolic(cfg, placeholders)
    dashboards = {"specdecode.json": plain(dashboard.build(symbolic_cfg))}
    imports = " +\n".join(f"(import '{path}')" for path in (CONFIG, *PARTS))
    dashboard_defaults = {k: v for k, v in defaults(cfg).items() if k not in (ALERTS_KEY, EXTRA_LABELS_KEY)}
    files = {ENTRY: header + USAGE + imports + "\n",
             CONFIG: header + USAGE + "{\n  _config+:: {\n" + mixin_rules.config_fields(cfg, dashboard_defaults)
             + "  },\n}\n",
             UTILS: header + "// The helpers every expression of the mixin calls.\n" + UTILS_TEXT,
             ALERTS_PART: header + mixin_rules.alerts_libsonnet(cfg),
             RULES_PART: header + mixin_rules.rules_libsonnet(cfg)}
    files[DASHBOARDS_PART] = header + _part(PARTS[DASHBOARDS_PART], dashboards, placeholders, DASHBOARDS_PART)
    return files
