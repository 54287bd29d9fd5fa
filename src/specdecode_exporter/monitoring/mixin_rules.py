"""The mixin's alerts and rules (mixin/alerts/alerts.libsonnet, mixin/rules/rules.libsonnet) and the rules' keys of
its ``_config``, written the way kubernetes-mixin writes its own: each expression a ``|||`` block ending in
``% $._config``, reading the values users tune by name (``%(pageAcceptanceRatio)g``).

The text is the rules' own templates (monitoring.rules builds every expression, record name and annotation as one,
monitoring.tunables names the keys), so jsonnet renders exactly what the rules files hold, and an override of a key
in jsonnet renders what the same change in the monitoring config renders (tests/rules/test_mixin_rules.py). A key
derived from others (a percentage for the annotations, the bucket a threshold falls on, the selector's two forms)
is a hidden field of ``_config`` computed from ``self``: it follows an override of what it derives from.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator, Mapping
from typing import Any

from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring import rules, tunables
from specdecode_exporter.monitoring.rules import ALERT_GROUPS, Group, RuleFile

ALERTS_FIELD, RULES_FIELD = "prometheusAlerts", "prometheusRules"
CONFIG = "$._config"
LINE = 160  # no line of the mixin longer
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TEXT = 100  # a one-line string longer than this is written as pieces joined with +


def string(text: str) -> str:
    """A jsonnet single-quoted string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def field_name(name: str) -> str:
    return name if _IDENTIFIER.fullmatch(name) and name != "for" else string(name)


def _words(text: str) -> list[str]:
    """``text``'s words, each with its trailing spaces; a short Prometheus template action ({{ … }}) is one word."""
    out = []
    for unit in re.findall(r"\{\{.*?\}\}\S*\s*|\S+\s*|\s+", text):
        out.extend([unit] if len(unit) <= _TEXT // 2 or not unit.startswith("{{") else re.split(r"(?<= )", unit))
    return [w for w in out if w]


def _pieces(text: str) -> list[str]:
    """``text`` cut at spaces into pieces of at most _TEXT characters (each keeps its trailing space)."""
    pieces, current = [], ""
    for word in _words(text):
        if current and len(current) + len(word) > _TEXT:
            pieces.append(current)
            current = ""
        current += word
    return [*pieces, current] if current else pieces


def template(text: str, indent: str, config: str = CONFIG) -> str:
    """One template as a jsonnet value: a literal where it holds no ``%``; else formatted with ``config``; a
    multi-line text as a ``|||`` block, a long line as pieces joined with ``+``."""
    if "%" not in text:
        literal = string(text) if "\n" not in text else None
        if literal is not None and len(literal) <= _TEXT:
            return literal
    suffix = f" % {config}" if "%" in text else ""
    if "\n" in text:
        if not text.endswith("\n"):
            raise ValueError(f"a multi-line template ends with a newline: {text!r}")
        body = "".join(f"{indent}  {line}\n" if line else "\n" for line in text[:-1].split("\n"))
        return f"|||\n{body}{indent}|||{suffix}"
    pieces = _pieces(text)
    if len(pieces) == 1:
        return string(text) + suffix
    joined = f"\n{indent}  + ".join(string(piece) for piece in pieces)
    return f"(\n{indent}  {joined}\n{indent}){suffix}" if suffix else f"(\n{indent}  {joined}\n{indent})"


def comment(text: str, indent: str) -> str:
    return "".join(f"{indent}// {line}\n" for line in textwrap.wrap(text, 116 - len(indent)))


def _settings(alert: str, key: str) -> str:
    return f"{CONFIG}.alerts.{alert}" + (f"['{key}']" if key == "for" else f".{key}")


def _alert(rule: Mapping[str, Any], indent: str) -> Iterator[str]:
    name = rule["alert"]
    inner = indent + "  "
    own = f"({CONFIG} + {CONFIG}.alerts.{name})"  # the alert's own for: and severity besides _config
    yield f"{inner}alert: {string(name)},\n"
    yield f"{inner}expr: {template(rule['expr'], inner)},\n"
    yield f"{inner}'for': {_settings(name, 'for')},\n"
    yield f"{inner}labels: {{ severity: {_settings(name, 'severity')} }} + {CONFIG}.extraAlertLabels,\n"
    yield f"{inner}annotations: {{\n"
    for key, text in rule["annotations"].items():
        config = own if "%(for)s" in text or "%(severity)s" in text else CONFIG
        yield f"{inner}  {field_name(key)}: {template(text, inner + '  ', config)},\n"
    yield f"{inner}}},\n"


def _record(rule: Mapping[str, Any], indent: str) -> Iterator[str]:
    inner = indent + "  "
    yield f"{inner}record: {template(rule['record'], inner)},\n"
    yield f"{inner}expr: {template(rule['expr'], inner)},\n"
    if rule.get("labels"):
        labels = ", ".join(f"{field_name(k)}: {template(v, inner)}" for k, v in rule["labels"].items())
        yield f"{inner}labels: {{ {labels} }},\n"


def _interval(value: str, indent: str) -> str:
    null_when = next((k for k in tunables.NULLABLE if value == f"%({k})s"), None)
    if null_when is not None:
        ref = f"{CONFIG}.{null_when}"
        return f"{indent}[if {ref} != null then 'interval']: {ref},\n"
    return f"{indent}interval: {template(value, indent)},\n"


def _group(group: Group, indent: str) -> Iterator[str]:
    inner = indent + "  "
    yield comment(group.purpose, indent)
    yield f"{indent}{{\n{inner}name: {string(group.name)},\n"
    if "interval" in group.body:
        yield _interval(group.body["interval"], inner)
    yield f"{inner}rules: [\n"
    for rule in group.body["rules"]:
        yield f"{inner}  {{\n"
        yield from (_alert(rule, inner + "  ") if "alert" in rule else _record(rule, inner + "  "))
        yield f"{inner}  }},\n"
    yield f"{inner}],\n{indent}}},\n"


def _part(field: str, files: list[RuleFile], alerts: bool) -> str:
    out = [f"{{\n  {field}+:: {{\n    groups+: [\n"]
    for file in files:
        groups = [g for g in file.groups if (g.name in ALERT_GROUPS) == alerts]
        if not groups:
            continue
        out.append(comment(f"{file.name}: {file.purpose}", "      "))
        out.append("      //\n")
        for group in groups:
            out.extend(_group(group, "      "))
    out.append("    ],\n  },\n}\n")
    return "".join(out)


def alerts_libsonnet(cfg: MonitoringConfig) -> str:
    """mixin/alerts/alerts.libsonnet (after the generated-file header)."""
    return _part(ALERTS_FIELD, rules.rule_file_templates(cfg), alerts=True)


def rules_libsonnet(cfg: MonitoringConfig) -> str:
    """mixin/rules/rules.libsonnet (after the generated-file header)."""
    return _part(RULES_FIELD, rules.rule_file_templates(cfg), alerts=False)


# --------------------------------------------------------------------------------------------------- _config


def value(x: Any) -> str:
    """A default of _config as jsonnet: 5 rather than 5.0, as a user would write it; null for none."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    if isinstance(x, str):
        return string(x)
    return json.dumps(x)


def user_defaults(cfg: MonitoringConfig) -> dict[str, Any]:
    """The rules' keys of _config a user sets, with the configured values."""
    return {key.name: key.value(cfg) for key in tunables.USER}


def config_fields(cfg: MonitoringConfig, others: Mapping[str, Any], indent: str = "    ") -> str:
    """The fields of ``_config``: the rules' keys, ``others`` (the dashboard's, those the rules do not read), every
    alert's severity and for:, the extra labels; then what derives from the rules' keys (hidden)."""
    lines = [f"{indent}// The rules' values (mixin/alerts, mixin/rules; the dashboard reads some too).\n"]
    lines += [f"{indent}{k}: {value(v)},\n" for k, v in user_defaults(cfg).items()]
    rest = {k: v for k, v in others.items() if k not in user_defaults(cfg)}
    if rest:
        lines.append(f"{indent}// The dashboard's.\n")
        lines += [f"{indent}{k}: {value(v)},\n" for k, v in rest.items()]
    lines.append(f"{indent}// Per alert: its severity and for:.\n{indent}alerts: {{\n")
    for name, settings in cfg.alerts:
        own = f"severity: {string(settings.severity)}, 'for': {string(settings.for_)}"
        lines.append(f"{indent}  {name}: {{ {own} }},\n")
    lines.append(f"{indent}}},\n{indent}// Labels added to every alert.\n")
    extra = ", ".join(f"{field_name(k)}: {string(v)}" for k, v in cfg.extra_alert_labels)
    lines.append(f"{indent}extraAlertLabels: {{{f' {extra} ' if extra else ''}}},\n")
    lines.append(f"{indent}// Derived from the values above, for the rules' texts: hidden, and not to be overridden.\n")
    buckets = ", ".join(value(float(b)) for b in m.ACCEPTANCE_RATIO_BUCKETS)
    lines.append(f"{indent}{tunables.BUCKETS_KEY}:: [{buckets}],\n")
    lines.append(f"{indent}{tunables.BUCKET_JSONNET},\n")
    for key in tunables.DERIVED:
        assert key.jsonnet is not None
        lines.append(f"{indent}{key.name}:: {key.jsonnet(cfg)},\n")
    return "".join(lines)
