"""The generated rule groups are layers a remote ruler can evaluate (docs/fleet.md, "Rule placement").

vmalert, Thanos Ruler and Mimir's ruler evaluate a group against the remote store and write its records back to it,
so a rule that reads a series recorded in its own group reads the previous evaluation's value, or nothing until the
write lands. The generated files must never do that: no rule reads a record of its own group, and every record a
rule reads comes from a group listed before its own (the file reads as layers: raw → windows → derived → alerts).
Checked on every generated rules file (the YAML files in their order, the PrometheusRule, the e2e profile's rules)
and the mixin's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import _jsonnet as jsonnet  # the `jsonnet` package (a test dependency)
import pytest
import yaml

from specdecode_exporter.monitoring import rules
from specdecode_exporter.monitoring.build import render_rules, sources

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"(?<![\w:\"'])[a-zA-Z_:][a-zA-Z0-9_:]*")

Groups = Sequence[Mapping[str, Any]]


def read_names(expr: str) -> set[str]:
    """Every metric-like name an expression mentions (outside quoted label values)."""
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return set(_NAME.findall(unquoted))


def layer_violations(groups: Groups) -> Iterator[str]:
    """One line per rule that reads a record of its own group or of a later group."""
    recorded_in = {rule["record"]: i for i, group in enumerate(groups) for rule in group["rules"] if "record" in rule}
    for i, group in enumerate(groups):
        for rule in group["rules"]:
            name = rule.get("record") or rule.get("alert")
            for read in sorted(read_names(rule["expr"]) & recorded_in.keys()):
                where = recorded_in[read]
                if where == i:
                    yield f"{group['name']}: {name} reads {read}, recorded in the same group"
                elif where > i:
                    yield f"{group['name']}: {name} reads {read}, recorded in a later group ({groups[where]['name']})"


def _rules_file() -> Groups:
    """The rules files' groups, the files in the order they read each other (rules.RULE_FILES)."""
    return [group for name in rules.RULE_FILES
            for group in yaml.safe_load((ROOT / "alerts" / name).read_text())["groups"]]


def _prometheus_rule() -> Groups:
    return list(yaml.safe_load((ROOT / "deploy" / "base" / "prometheusrule.yaml").read_text())["spec"]["groups"])


def _e2e_profile() -> Groups:
    return list(yaml.safe_load(render_rules(sources(None, "e2e")))["groups"])


def _mixin() -> Groups:
    mixin = ROOT / "mixin" / "mixin.libsonnet"

    def field(name: str) -> list[dict[str, Any]]:
        text = jsonnet.evaluate_snippet("snippet", f'(import "{mixin.name}").{name}', jpathdir=[str(mixin.parent)])
        return list(json.loads(text)["groups"])

    # A mixin user loads prometheusRules before prometheusAlerts (kube-prometheus does).
    return field("prometheusRules") + field("prometheusAlerts")


def group_kinds(groups: Groups) -> list[str]:
    """The groups' names in order, one evidence group per tested window counted once (profiles differ in windows)."""
    names = [re.sub(r"^specdecode\.rules\.evidence\..*", "specdecode.rules.evidence", g["name"]) for g in groups]
    return list(dict.fromkeys(names))


@pytest.mark.parametrize("load", [_rules_file, _prometheus_rule, _e2e_profile, _mixin],
                         ids=["rules-file", "prometheusrule", "e2e-profile", "mixin"])
def test_no_group_reads_its_own_records(load: Any) -> None:
    groups = load()
    # The same groups (the mixin lists its records' groups before its alerts', as kube-prometheus loads them).
    assert sorted(group_kinds(groups)) == sorted(group_kinds(_rules_file()))
    assert list(layer_violations(groups)) == []


MIMIR_MAX_RULES_PER_GROUP = 20  # ruler_max_rules_per_rule_group's default: a larger group is refused at load


@pytest.mark.parametrize("load", [_rules_file, _prometheus_rule, _e2e_profile, _mixin],
                         ids=["rules-file", "prometheusrule", "e2e-profile", "mixin"])
def test_every_group_loads_into_mimir_with_its_default_limits(load: Any) -> None:
    sizes = {g["name"]: len(g["rules"]) for g in load()}
    assert {name: n for name, n in sizes.items() if n > MIMIR_MAX_RULES_PER_GROUP} == {}
    assert len(sizes) <= 70  # ruler_max_rule_groups_per_tenant's default


def test_derived_records_are_layered_not_absent() -> None:
    """The layering is real, not vacuous: derived records (the baseline, the observed speedup) and the alerts read
    records of earlier groups."""
    groups = _rules_file()
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    readers = {group["name"] for group in groups for rule in group["rules"] if read_names(rule["expr"]) & recorded}
    derived = {"specdecode.rules.baseline", "specdecode.rules.speedup", rules.PAGE_GROUP, rules.TICKETS_GROUP,
               rules.PAGE_EVIDENCE_GROUP, "specdecode.rules.tickets", "specdecode.rules.variance.bound"}
    assert derived <= readers, readers


def test_a_chained_group_is_caught() -> None:
    chained = [{"name": "g", "rules": [
        {"record": "model:x:rate5m", "expr": "sum(rate(x_total[5m]))"},
        {"record": "model:y:ratio", "expr": 'model:x:rate5m{a="model:x:rate5m"} / 2'},
    ]}]
    assert list(layer_violations(chained)) == ["g: model:y:ratio reads model:x:rate5m, recorded in the same group"]
    backwards = [{"name": "alerts", "rules": [{"alert": "A", "expr": "model:x:rate5m > 1"}]}, chained[0]]
    assert "alerts: A reads model:x:rate5m, recorded in a later group (g)" in list(layer_violations(backwards))


def test_quoted_label_values_are_not_reads() -> None:
    assert read_names('foo{job="model:x:rate5m"} / bar') == {"foo", "job", "bar"}
