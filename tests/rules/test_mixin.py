"""The jsonnet mixin, evaluated by the real jsonnet (the `jsonnet` package's C++ binding), is the same rules and
dashboard as the YAML and JSON files: a kube-prometheus user who imports it gets exactly what promtool tests."""

from __future__ import annotations

import json
from typing import Any

import _jsonnet as jsonnet  # the `jsonnet` package (a test dependency)
import yaml

from tests.grafana.grafana_dashboard_helpers import ROOT

MIXIN = ROOT / "mixin" / "mixin.libsonnet"


def evaluate(field: str) -> Any:
    snippet = f'(import "{MIXIN.name}").{field}'
    return json.loads(jsonnet.evaluate_snippet("snippet", snippet, jpathdir=[str(MIXIN.parent)]))


def test_the_mixin_rules_are_the_rule_file() -> None:
    rules = yaml.safe_load((ROOT / "alerts" / "specdecode.rules.yaml").read_text())["groups"]
    from_mixin = evaluate("prometheusRules")["groups"] + evaluate("prometheusAlerts")["groups"]
    assert sorted(from_mixin, key=lambda g: g["name"]) == sorted(rules, key=lambda g: g["name"])
    assert {"specdecode.alerts"} == {g["name"] for g in evaluate("prometheusAlerts")["groups"]}
    assert all("alert" in r for g in evaluate("prometheusAlerts")["groups"] for r in g["rules"])
    assert all("record" in r for g in evaluate("prometheusRules")["groups"] for r in g["rules"])


def test_the_mixin_dashboard_is_the_dashboard_file() -> None:
    dashboard = json.loads((ROOT / "grafana" / "dashboards" / "specdecode.json").read_text())
    assert evaluate("grafanaDashboards") == {"specdecode.json": dashboard}


def test_the_mixin_composes_like_a_mixin() -> None:
    """A user's own mixin merged on top (jsonnet's `+`) keeps ours and adds theirs: the fields are hidden (::),
    and merge (+::), as kube-prometheus expects."""
    mine = '{ prometheusAlerts+:: { groups+: [{name: "mine", rules: []}] } }'
    snippet = f'local m = (import "{MIXIN.name}") + {mine}; [g.name for g in m.prometheusAlerts.groups]'
    names = json.loads(jsonnet.evaluate_snippet("snippet", snippet, jpathdir=[str(MIXIN.parent)]))
    assert names == ["specdecode.alerts", "mine"]
    assert json.loads(jsonnet.evaluate_snippet("snippet", f'std.objectFields(import "{MIXIN.name}")',
                                               jpathdir=[str(MIXIN.parent)])) == []
