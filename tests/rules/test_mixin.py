"""The jsonnet mixin, evaluated by the real jsonnet (the `jsonnet` package's C++ binding), is the same rules and
dashboard as the YAML and JSON files: a kube-prometheus user who imports it gets exactly what promtool tests. Its
_config holds the values users tune, and an override of any of them renders what the generators render from a
monitoring config with the same change."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import _jsonnet as jsonnet  # the `jsonnet` package (a test dependency)
import yaml

from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring import mixin, mixin_dashboard
from specdecode_exporter.monitoring.rules import RULE_FILES, rule_groups
from tests.grafana.grafana_dashboard_helpers import ROOT
from tests.helpers import require_tool

MIXIN = ROOT / "mixin" / "mixin.libsonnet"
FIELDS = ("prometheusAlerts", "prometheusRules", "grafanaDashboards")


def evaluate(field: str, overrides: str = "{}") -> Any:
    snippet = f'((import "{MIXIN.name}") + {overrides}).{field}'
    return json.loads(jsonnet.evaluate_snippet("snippet", snippet, jpathdir=[str(MIXIN.parent)]))


def test_the_mixin_rules_are_the_rule_file() -> None:
    rules = [g for name in RULE_FILES for g in yaml.safe_load((ROOT / "alerts" / name).read_text())["groups"]]
    from_mixin = evaluate("prometheusRules")["groups"] + evaluate("prometheusAlerts")["groups"]
    assert sorted(from_mixin, key=lambda g: g["name"]) == sorted(rules, key=lambda g: g["name"])
    alert_groups = {g["name"] for g in evaluate("prometheusAlerts")["groups"]}
    assert alert_groups == {"specdecode.alerts", "specdecode.alerts.tickets"}
    assert all("alert" in r for g in evaluate("prometheusAlerts")["groups"] for r in g["rules"])
    assert all("record" in r for g in evaluate("prometheusRules")["groups"] for r in g["rules"])


def test_the_mixin_composes_like_a_mixin() -> None:
    """A user's own mixin merged on top (jsonnet's `+`) keeps ours and adds theirs: the fields are hidden (::),
    and merge (+::), as kube-prometheus expects."""
    mine = '{ prometheusAlerts+:: { groups+: [{name: "mine", rules: []}] } }'
    snippet = f'local m = (import "{MIXIN.name}") + {mine}; [g.name for g in m.prometheusAlerts.groups]'
    names = json.loads(jsonnet.evaluate_snippet("snippet", snippet, jpathdir=[str(MIXIN.parent)]))
    assert names == ["specdecode.alerts", "specdecode.alerts.tickets", "mine"]
    assert json.loads(jsonnet.evaluate_snippet("snippet", f'std.objectFields(import "{MIXIN.name}")',
                                               jpathdir=[str(MIXIN.parent)])) == []


def test_the_mixin_is_laid_out_as_kubernetes_mixin_and_each_part_renders_with_the_config() -> None:
    """config.libsonnet, lib/, and a file per field (alerts/, rules/, dashboards/), which mixin.libsonnet merges: a
    user who imports one part beside the config gets what the entry point gives for that field."""
    on_disk = {str(path.relative_to(MIXIN.parent)) for path in MIXIN.parent.rglob("*.libsonnet")}
    written = {*mixin.FILES, mixin_dashboard.SHAPE, *mixin_dashboard.SOURCES}
    assert on_disk == written, "a file under mixin/ the build does not write (or one it did not write)"
    for path, field in mixin.PARTS.items():
        snippet = f'((import "{mixin.CONFIG}") + (import "{path}")).{field}'
        alone = json.loads(jsonnet.evaluate_snippet("snippet", snippet, jpathdir=[str(MIXIN.parent)]))
        assert alone == evaluate(field), path
        assert json.loads(jsonnet.evaluate_snippet("snippet", f'std.objectFields(import "{path}")',
                                                   jpathdir=[str(MIXIN.parent)])) == []


# ------------------------------------------------------------------------------------------ _config overrides

# A value of each kind different from every default, so that each override changes what is rendered.
OVERRIDE = {"ratio": 0.35, "number": 2.5, "duration": "7m", "matchers": 'cluster="prod"'}


def generated(cfg: MonitoringConfig) -> dict[str, Any]:
    """What the generators render from ``cfg``, as the mixin's fields."""
    groups = rule_groups(cfg)["groups"]
    alerts = [g for g in groups if any("alert" in r for r in g["rules"])]
    records = [g for g in groups if g not in alerts]
    return {"prometheusAlerts": {"groups": alerts}, "prometheusRules": {"groups": records},
            "grafanaDashboards": {"specdecode.json": json.loads(mixin_dashboard.render(cfg, MIXIN.parent))}}


def rendered(overrides: str) -> dict[str, Any]:
    """The mixin's three fields under ``overrides``, in one evaluation."""
    snippet = (f'local m = (import "{MIXIN.name}") + {overrides}; '
               + "{" + ", ".join(f"{field}: m.{field}" for field in FIELDS) + "}")
    return json.loads(jsonnet.evaluate_snippet("snippet", snippet, jpathdir=[str(MIXIN.parent)]))


def test_every_alerts_severity_and_for_and_extra_labels_overridden_in_jsonnet() -> None:
    shipped = monitoring_config.shipped()
    cfg = mixin.with_value(shipped, "alerts", tuple(
        (name, mixin.with_value(mixin.with_value(settings, "severity", "info"), "for_", f"{i + 1}m"))
        for i, (name, settings) in enumerate(shipped.alerts)))
    cfg = mixin.with_value(cfg, "extra_alert_labels", (("team", "ml-platform"),))
    alerts = ", ".join(f"{name}+: {{ severity: 'info', 'for': '{i + 1}m' }}" for i, (name, _) in
                       enumerate(shipped.alerts))
    overrides = f"{{ _config+:: {{ alerts+: {{ {alerts} }}, extraAlertLabels+: {{ team: 'ml-platform' }} }} }}"
    assert rendered(overrides) == generated(cfg)


def _balanced(text: str, start: int) -> str:
    """The {...} that begins at ``start``."""
    depth = 0
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start : end + 1]
    raise AssertionError(text[start:])


def test_the_usage_examples_override_keys_the_config_has() -> None:
    """The override examples at the top of the mixin's files name keys _config has: jsonnet adds an unknown key
    without a word, so an example with a made-up key (longWindow, once) changes nothing for whoever copies it."""
    import re

    known = set(json.loads(jsonnet.evaluate_snippet(
        "snippet", f'std.objectFieldsAll((import "{MIXIN.name}")._config)', jpathdir=[str(MIXIN.parent)])))
    examples = [_balanced(mixin.USAGE, found.end()) for found in re.finditer(r"_config\+:: ", mixin.USAGE)]
    assert len(examples) == 3
    for example in examples:
        fields = json.loads(jsonnet.evaluate_snippet("snippet", f"std.objectFieldsAll({example})"))
        assert set(fields) <= known, (example, set(fields) - known)


USER = """{ _config+:: {
  pageAcceptanceRatio: 0.4,
  metricSelector: 'cluster="prod"',
  runbookBaseURL: 'https://runbooks.example.com/specdecode/',
  alerts+: { SpecDecodeAcceptanceRateLow+: { 'for': '5m', severity: 'warning' } },
} }"""


def _alert(groups: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for g in groups["groups"] for r in g["rules"] if r.get("alert") == name)


def test_a_users_overrides_reach_the_alerts_and_the_dashboard(tmp_path: Path) -> None:
    alerts, records = evaluate("prometheusAlerts", USER), evaluate("prometheusRules", USER)
    page = _alert(alerts, "SpecDecodeAcceptanceRateLow")
    assert ") < 0.4\n" in page["expr"]
    proof = next(r["expr"] for g in records["groups"] for r in g["rules"]
                 if r["record"] == "model:specdecode_acceptance_ratio:proven_below_page_rate2m")
    assert proof.startswith("model:specdecode_acceptance_ratio:rate2m < 0.4\n")
    assert (page["for"], page["labels"]["severity"]) == ("5m", "warning")
    assert "below 40%" in page["annotations"]["summary"]
    assert page["annotations"]["runbook_url"] == \
        "https://runbooks.example.com/specdecode/alerts/runbook.md#specdecodeacceptanceratelow"
    assert any('specdecode_accepted_tokens_total{cluster="prod"}' in r["expr"] for g in records["groups"]
               for r in g["rules"])
    below = next(r for g in records["groups"] for r in g["rules"]
                 if r["record"].startswith("model:specdecode_requests_below_page_threshold"))
    assert 'le="0.4"' in below["expr"] and below["record"].endswith(":ratio_rate1h")
    board = evaluate("grafanaDashboards", USER)["specdecode.json"]
    steps = [s["value"] for p in board["panels"] if p.get("title") == "Acceptance rate α"
             for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert 0.4 in steps and 0.5 not in steps
    promtool = require_tool(shutil.which("promtool"), "promtool (Debian package prometheus)")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": records["groups"] + alerts["groups"]}))
    check = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
