"""The mixin's alerts and rules as a jsonnet user reads them, in kubernetes-mixin's shape: each expression a
``|||`` block formatted with named ``%(key)s`` values of ``_config`` (no positional ``%s``, no line over 160
characters). The real jsonnet (the `jsonnet` package's C++ binding) renders exactly the shipped rules files, and an
override of a ``_config`` value renders what the same change of the monitoring config renders, changing the rules
that use that value and nothing else."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import _jsonnet as jsonnet  # the `jsonnet` package (a test dependency)
import pytest
import yaml

from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring import mixin, mixin_rules, rules, tunables
from specdecode_exporter.monitoring.tunables import Key

ROOT = Path(__file__).resolve().parents[2]
MIXIN = ROOT / "mixin"
PARTS = (MIXIN / "alerts" / "alerts.libsonnet", MIXIN / "rules" / "rules.libsonnet")
Groups = list[dict[str, Any]]


@functools.cache
def rendered(overrides: str = "{}") -> tuple[Groups, Groups]:
    """The mixin's prometheusRules and prometheusAlerts groups under ``overrides`` (the config and the two parts
    alone: the dashboard is not evaluated)."""
    snippet = (f"local m = (import '{mixin.CONFIG}') + (import '{mixin.RULES_PART}') + (import '{mixin.ALERTS_PART}')"
               f" + {overrides}; [m.prometheusRules.groups, m.prometheusAlerts.groups]")
    records, alerts = json.loads(jsonnet.evaluate_snippet("snippet", snippet, jpathdir=[str(MIXIN)]))
    return records, alerts


def generated(cfg: MonitoringConfig) -> tuple[Groups, Groups]:
    """What the generators render from ``cfg``, split as the mixin's two fields."""
    groups = [g.body for f in rules.rule_files(cfg) for g in f.groups]
    return ([g for g in groups if g["name"] not in rules.ALERT_GROUPS],
            [g for g in groups if g["name"] in rules.ALERT_GROUPS])


def test_jsonnet_renders_exactly_the_shipped_rules_files() -> None:
    groups = [g for name in rules.RULE_FILES for g in yaml.safe_load((ROOT / "alerts" / name).read_text())["groups"]]
    records, alerts = rendered()
    assert records == [g for g in groups if g["name"] not in rules.ALERT_GROUPS]
    assert alerts == [g for g in groups if g["name"] in rules.ALERT_GROUPS]


@pytest.mark.parametrize("path", PARTS, ids=lambda path: path.parent.name)
def test_the_expressions_read_like_kubernetes_mixin(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert max(len(line) for line in text.split("\n")) <= mixin_rules.LINE
    assert not re.search(r"%s|%\[|% \[", text), "a positional format"
    assert text.count("expr: |||\n") > 10 and text.count("||| % $._config,\n") > 10
    known = set(json.loads(jsonnet.evaluate_snippet(
        "snippet", f"std.objectFieldsAll((import '{mixin.CONFIG}')._config)", jpathdir=[str(MIXIN)])))
    named = set(re.findall(r"%\((\w+)\)[sg]", text)) - {"for", "severity"}
    assert named and named <= known, named - known


# A value of each key, different from the shipped one.
CHANGED: dict[str, Any] = {
    "runbookBaseURL": "https://runbooks.example.com/specdecode/", "metricSelector": 'cluster="prod"',
    "exporterJobSelector": 'job="sidecars"', "shortWindow": "7m", "windowEvaluationInterval": "30s",
    "baselineOffset": "2h",
}


def _changed(key: Key) -> Any:
    return CHANGED.get(key.name, 0.35 if key.name.endswith(("Ratio", "Below", "Drop")) else 2.5)


def _depends_on(cfg: MonitoringConfig, name: str) -> set[str]:
    """``name`` and every derived key computed from it (transitively)."""
    found = {name}
    while True:
        more = {k.name for k in tunables.DERIVED if k.jsonnet is not None and k.name not in found
                and any(f"self.{f}" in k.jsonnet(cfg) for f in found)}
        if not more:
            return found
        found |= more


def _mentions(template: Any, names: set[str]) -> bool:
    return any(f"%({name})" in text for text in _texts(template) for name in names)


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def _differing(a: Groups, b: Groups) -> set[tuple[int, int]]:
    """(group, rule) positions that differ; rule -1: the group's own fields."""
    out = {(i, j) for i, (ga, gb) in enumerate(zip(a, b, strict=True))
           for j, (ra, rb) in enumerate(zip(ga["rules"], gb["rules"], strict=True)) if ra != rb}
    return out | {(i, -1) for i, (ga, gb) in enumerate(zip(a, b, strict=True))
                  if {k: v for k, v in ga.items() if k != "rules"} != {k: v for k, v in gb.items() if k != "rules"}}


@pytest.mark.parametrize("key", tunables.USER, ids=lambda key: key.name)
def test_an_override_renders_the_same_change_and_changes_what_reads_it_and_nothing_else(key: Key) -> None:
    shipped = monitoring_config.shipped()
    assert key.path is not None
    value = _changed(key)
    changed = rendered(f"{{ _config+:: {{ {key.name}: {json.dumps(value)} }} }}")
    assert changed == generated(mixin.with_value(shipped, key.path, value))
    templates = _shipped_templates()
    names = _depends_on(shipped, key.name)
    should = {(i, j) for i, g in enumerate(templates) for j, r in enumerate(g["rules"]) if _mentions(r, names)}
    should |= {(i, -1) for i, g in enumerate(templates)
               if _mentions({k: v for k, v in g.items() if k != "rules"}, names)}
    default = rendered()
    positions = [g["name"] for g in templates]
    flat_default = _in_file_order(default, positions)
    flat_changed = _in_file_order(changed, positions)
    assert should and _differing(flat_default, flat_changed) == should


@functools.cache
def _shipped_templates() -> Groups:
    return [g.body for f in rules.rule_file_templates(monitoring_config.shipped()) for g in f.groups]


def _in_file_order(fields: tuple[Groups, Groups], names: list[str]) -> Groups:
    by_name = {g["name"]: g for field in fields for g in field}
    return [by_name[name] for name in names]


def test_an_alerts_own_settings_change_that_alert_alone() -> None:
    records, alerts = rendered("{ _config+:: { alerts+: { SpecDecodeTargetDown+: { 'for': '7m' } } } }")
    default_records, default_alerts = rendered()
    assert records == default_records
    before = {r["alert"]: r for g in default_alerts for r in g["rules"]}
    after = {r["alert"]: r for g in alerts for r in g["rules"]}
    assert {name for name in after if after[name] != before[name]} == {"SpecDecodeTargetDown"}
    assert after["SpecDecodeTargetDown"]["for"] == "7m" and "for 7m;" in after["SpecDecodeTargetDown"][
        "annotations"]["description"]


def test_extra_labels_reach_every_alert_and_no_record() -> None:
    records, alerts = rendered("{ _config+:: { extraAlertLabels+: { team: 'ml-platform' } } }")
    assert records == rendered()[0]
    assert all(r["labels"]["team"] == "ml-platform" for g in alerts for r in g["rules"])
