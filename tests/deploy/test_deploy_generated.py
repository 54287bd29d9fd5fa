"""The PrometheusRule carries exactly alerts/, the dashboard ConfigMap exactly grafana/, and the
component's patches exactly deploy/sidecar/sidecar-patch.yaml: all generated, never edited by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from deploy_helpers import DEPLOY, ROOT, find, render

RULES = ROOT / "alerts" / "specdecode.rules.yaml"
DASHBOARD = ROOT / "grafana" / "dashboards" / "specdecode.json"
# kubectl's client-side apply copies the object into an annotation limited to 256 KiB in all;
# a ConfigMap is limited to 1 MiB. The README applies server-side, but stay under both.
ANNOTATION_LIMIT = 262_144


def test_generated_files_are_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(DEPLOY / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"run `python deploy/generate.py`:\n{proc.stdout}{proc.stderr}"


def test_prometheus_rule_carries_exactly_the_rules_in_alerts() -> None:
    assert RULES.is_file(), f"{RULES.relative_to(ROOT)} missing (alerts/generate.py writes it)"
    source = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    rule = find(render("deploy/base"), "PrometheusRule")
    assert rule["spec"]["groups"] == source["groups"]
    assert rule["spec"]["groups"], "no rule groups"


def test_dashboard_configmap_carries_the_dashboard_byte_for_byte() -> None:
    assert DASHBOARD.is_file(), f"{DASHBOARD.relative_to(ROOT)} missing"
    text = DASHBOARD.read_text(encoding="utf-8")
    cm = find(render("deploy/base"), "ConfigMap", "specdecode-exporter-dashboard")
    assert cm["data"] == {"specdecode.json": text}
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1", "label Grafana's sidecar loads dashboards by"
    json.loads(cm["data"]["specdecode.json"])
    assert len(json.dumps(cm).encode()) < ANNOTATION_LIMIT


def test_every_rule_in_the_prometheus_rule_is_labelled_and_documented() -> None:
    rule = find(render("deploy/base"), "PrometheusRule")
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            if "alert" in r:
                assert r["labels"]["severity"] in {"critical", "warning", "info"}, r["alert"]
                assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), r["alert"]
