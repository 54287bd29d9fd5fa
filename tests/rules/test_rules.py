"""The alert and recording rules in alerts/: generated output up to date, promtool check + unit tests,
annotations and runbook anchors, and the example Alertmanager routing (amtool). The rules are generated from the
monitoring config (src/specdecode_exporter/core/contract/monitoring.yaml) by specdecode_exporter.monitoring.build.

promtool/amtool come from Debian's `prometheus` and `prometheus-alertmanager` packages
(scripts/install-tools.sh). Outside CI a missing tool skips its tests; with CI=true it fails them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode_exporter.core.config.validation import ConfigError, duration_seconds
from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.stats.evidence import expected_crossings
from specdecode_exporter.monitoring import build, mixin, rules, stage
from specdecode_exporter.monitoring.rules import rule_groups

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
RULE_FILES = [ALERTS / name for name in rules.RULE_FILES]  # in the order they read each other
RUNBOOK = ALERTS / "runbook.md"
AM_CONFIG = ALERTS / "alertmanager.example.yml"
UNIT_TESTS = sorted((ALERTS / "tests").glob("*.test.yaml"))
SEVERITIES = {"critical", "warning", "info"}


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not found: run scripts/install-tools.sh (Debian packages prometheus, prometheus-alertmanager)"
        if _in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="module")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="module")
def amtool() -> str:
    return _tool("amtool")


def _run(*cmd: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT)


def _groups() -> list[dict[str, Any]]:
    return [group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]]


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _groups() for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def github_anchor(heading: str) -> str:
    """GitHub's heading slug: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _runbook_anchors() -> set[str]:
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", RUNBOOK.read_text(), re.M)}


# ------------------------------------------------------------------------------------------ generator


def test_committed_rules_are_up_to_date() -> None:
    only = [f"alerts/{name}" for name in rules.RULE_FILES]
    assert build.build(build.sources(None), check=True, only=only) == 0, "run: make generate"
    assert sorted(ALERTS.glob("*.rules.yaml")) == sorted(RULE_FILES), "a rules file the build does not write"


def test_e2e_profile_has_short_durations(tmp_path: Path, promtool: str) -> None:
    out = tmp_path / "e2e.rules.yaml"
    assert build.main(["--profile", "e2e", "--rules-out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} == {a["alert"] for a in _alerts()}
    assert {a["for"] for a in alerts} == {"15s"}
    records = {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    assert "model:specdecode_acceptance_ratio:rate1m" in records
    assert "model:specdecode_acceptance_ratio:baseline5m" in records
    check = _run(promtool, "check", "rules", str(out))
    assert check.returncode == 0, check.stdout + check.stderr


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "monitoring.yaml"
    bad.write_text("thresholds: {page_acceptance_ratio: 1.5}\n")
    with pytest.raises(ConfigError, match=r"thresholds\.page_acceptance_ratio"):
        monitoring_config.load(bad)
    bad.write_text("alerts: {SpecDecodeTargetDown: {for: 5 minutes}}\n")
    with pytest.raises(ConfigError, match=r"alerts\.SpecDecodeTargetDown\.for"):
        monitoring_config.load(bad)
    bad.write_text("thresholds: {page_acceptance_ratoi: 0.4}\n")
    with pytest.raises(ConfigError, match=r"thresholds\.page_acceptance_ratoi: unknown key"):
        monitoring_config.load(bad)
    # The build says it in one line and exits 2.
    assert build.main(["--config", str(bad), "--check"]) == 2


def test_config_changes_reach_every_rule(tmp_path: Path) -> None:
    path = tmp_path / "monitoring.yaml"
    path.write_text(yaml.safe_dump({
        "selectors": {"metric": 'cluster="prod"'},
        "levels": {"model": ["cluster", "namespace", "model_name"]},
        "thresholds": {"page_acceptance_ratio": 0.4},
    }))
    doc = rule_groups(monitoring_config.load(path))
    for group in doc["groups"]:
        for rule in group["rules"]:
            # every raw specdecode_* selector (not the recorded level:metric:op names) has the matcher
            raw = re.findall(r"(?<![:\w])specdecode_[a-z_]+(\{[^}]*\})?", rule["expr"])
            for matchers in raw:
                assert 'cluster="prod"' in matchers, (rule.get("record") or rule.get("alert"), rule["expr"])
    page = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "SpecDecodeAcceptanceRateLow")
    assert "< 0.4" in page["expr"] and "on (cluster, namespace, model_name)" in page["expr"]
    assert "below 40%" in page["annotations"]["summary"]


# --------------------------------------------------------------------------------------------- promtool


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
def test_promtool_check_rules(promtool: str, path: Path) -> None:
    """Each file alone (a ruler may load one concern without the others, e.g. only the stage for a test)."""
    proc = _run(promtool, "check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


# One file a test: each is a unit of its own for `make test`'s workers (tests/slow.py names the slow ones).
@pytest.mark.timeout(960)  # pytest's own limit (300 s) would cut the 15-minute guard below short
@pytest.mark.parametrize("unit_tests", UNIT_TESTS, ids=lambda path: path.name)
def test_promtool_unit_tests(promtool: str, unit_tests: Path) -> None:
    # A guard against a hang, not a timing target: page.test.yaml evaluates three hours of 15 s steps for six
    # scenarios, and on a shared 2-core machine with other jobs beside it that alone has taken over 5 minutes.
    proc = _run(promtool, "test", "rules", str(unit_tests), timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    assert UNIT_TESTS, "no alerts/tests/*.test.yaml"
    fired: set[str] = set()
    silent: set[str] = set()
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - fired == set(), "alerts never seen firing in a unit test"
    assert names - silent == set(), "alerts never checked to stay silent in a unit test"


# ---------------------------------------------------------------------------------- annotations/runbook


def test_every_alert_has_severity_annotations_and_runbook() -> None:
    alerts = _alerts()
    assert len(alerts) >= 9
    anchors = _runbook_anchors()
    base = monitoring_config.load().runbook_base_url.rstrip("/")
    for alert in alerts:
        name = alert["alert"]
        assert alert["labels"]["severity"] in SEVERITIES, name
        ann = alert["annotations"]
        for key in ("summary", "description", "runbook_url"):
            assert ann.get(key), f"{name}: missing {key}"
        if "absent(" not in alert["expr"]:  # absent() has neither a useful value nor labels
            assert "{{" in ann["description"], f"{name}: description should show the value or the labels"
        url = ann["runbook_url"]
        assert url.startswith(f"{base}/alerts/runbook.md#"), url
        anchor = url.split("#", 1)[1]
        assert anchor in anchors, f"{name}: no section #{anchor} in alerts/runbook.md"
        assert re.match(r"^\d+[smhd]$", alert["for"]), f"{name}: for: {alert.get('for')}"


def test_runbook_sections_match_alerts() -> None:
    sections = set(re.findall(r"^## (\S+)$", RUNBOOK.read_text(), re.M))
    assert sections == {a["alert"] for a in _alerts()}


def test_the_page_tests_each_window_at_its_budgeted_z(tmp_path: Path) -> None:
    """Each page window's critical z comes from the false-page budget (core.stats.evidence), split between the windows:
    a larger budget lowers every bar, more windows raise it. The page is critical and waits for no `for:` beyond
    what its tests demand (pages.test.yaml: a one-minute blip does not page)."""

    def bars(text: str) -> list[float]:
        path = tmp_path / "monitoring.yaml"
        path.write_text(text)
        cfg = monitoring_config.load(path)
        groups = rule_groups(cfg)["groups"]
        page = next(r for g in groups for r in g["rules"] if r.get("alert") == rules.PAGE)
        assert page["labels"]["severity"] == "critical" and page["for"] == "0s"
        proofs = {r["record"]: r["expr"] for g in groups for r in g["rules"] if ":proven_below_page_rate" in
                  r.get("record", "")}
        assert all(name in page["expr"] for name in proofs)  # the page reads each window's proof by name
        return [float(re.findall(r"\n> ([0-9.]+)\n$", proofs[rules.proven_below_record(cfg, w)])[0])
                for w in cfg.statistics.page_windows]

    cfg = monitoring_config.load()
    shipped = bars("{}\n")
    assert shipped == [round(z, 2) for _, z in rules.page_tests(cfg)]
    assert len(shipped) == len(cfg.statistics.page_windows)
    every = duration_seconds(cfg.statistics.evaluation_interval)
    budgets = cfg.statistics.page_budgets()
    assert sum(budgets) == pytest.approx(cfg.statistics.false_pages_per_30d)
    for z, window, budget in zip(shipped, cfg.statistics.page_windows, budgets, strict=True):
        assert expected_crossings(z, duration_seconds(window), every) == pytest.approx(budget, rel=0.05)
    assert all(a > b for a, b in zip(shipped, bars("statistics: {false_pages_per_30d: 10}\n"), strict=True))
    assert bars("statistics: {page_windows: [2m], page_budget_shares: [1]}\n")[0] < shipped[0]
    # a window's larger share lowers its bar and raises the others'
    even = bars("statistics: {page_budget_shares: [1, 1, 1, 1, 1]}\n")
    assert shipped[1] < even[1] and all(s > e for i, (s, e) in enumerate(zip(shipped, even, strict=True)) if i != 1)


# ----------------------------------------------------------------------------------------- alertmanager


def test_amtool_check_config(amtool: str) -> None:
    proc = _run(amtool, "check-config", str(AM_CONFIG))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "alertname=SpecDecodeAcceptanceRateLow", "model_name=llama"], "pager"),
        (["severity=warning", "alertname=SpecDecodeAcceptanceRateDrift", "model_name=llama"], "ticket"),
        (["severity=warning", "alertname=SpecDecodeTargetDown", "instance=10.0.0.1:9877"], "ticket"),
        (["severity=info", "alertname=SpecDecodeRecommendedKLower", "model_name=llama"], "ticket"),
    ],
)
def test_amtool_routes(amtool: str, labels: list[str], receiver: str) -> None:
    proc = _run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={AM_CONFIG}",
        f"--verify.receivers={receiver}",
        *labels,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_alerts_route_by_their_severity(amtool: str) -> None:
    """Every alert in the rules file reaches the receiver its severity calls for."""
    for alert in _alerts():
        receiver = "pager" if alert["labels"]["severity"] == "critical" else "ticket"
        proc = _run(
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={AM_CONFIG}",
            f"--verify.receivers={receiver}",
            f"alertname={alert['alert']}",
            f"severity={alert['labels']['severity']}",
        )
        assert proc.returncode == 0, f"{alert['alert']}: {proc.stdout}{proc.stderr}"


def test_grouping_by_model() -> None:
    route = yaml.safe_load(AM_CONFIG.read_text())["route"]
    assert "model_name" in route["group_by"]


# ------------------------------------------------------------------------------------------ install tools


def test_install_tools_script_is_valid_bash() -> None:
    script = ROOT / "scripts" / "install-tools.sh"
    assert os.access(script, os.X_OK)
    proc = _run("bash", "-n", str(script))
    assert proc.returncode == 0, proc.stderr


def test_unit_tests_fix_the_group_order() -> None:
    """promtool orders groups randomly unless told; every unit test file loads every rules file and lists all
    generated groups."""
    groups = [g["name"] for g in _groups()]
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc.get("rule_files") == [f"../{p.name}" for p in RULE_FILES], path.name
        assert doc.get("group_eval_order") == groups, path.name


RANGE_OR_OFFSET = re.compile(r"(?<![\w:])([a-zA-Z_][a-zA-Z0-9_:]*)(?:\{[^}]*\})?(?:\[([^\]:]+)\]| offset (\w+))")


@pytest.mark.parametrize("profile", [None, "e2e"])
def test_no_rule_ranges_over_raw_series(profile: str | None) -> None:
    """Two stages: no rule reads the pods' raw series over a range; only the short stage's groups read them a step
    back (offset: their own interval, at most 1m); every window reads the stage's per-model records
    (docs/fleet.md)."""
    cfg = monitoring_config.load(profile=profile) if profile else monitoring_config.load()
    stage_groups = {g["name"]: g["interval"] for g in stage.stage_groups(cfg)}
    assert max(duration_seconds(step) for step in stage_groups.values()) <= 60
    ranges = 0
    for group in rule_groups(cfg)["groups"]:
        for rule in group["rules"]:
            for name, window, offset in RANGE_OR_OFFSET.findall(re.sub(r'"[^"]*"', '""', rule["expr"])):
                where = f"{group['name']}: {rule.get('record') or rule.get('alert')} reads {name}"
                ranges += bool(window)
                assert ":" in name or not window, f"{where}[{window}]"
                assert ":" in name or not offset or offset == stage_groups.get(group["name"]), where
    assert ranges > 50  # the windows do read the stage's records over ranges


def test_every_group_carries_its_own_interval() -> None:
    """The rules cost the same whatever the ruler's global interval: the short stage's page evidence, the page's
    windows and the page itself every statistics.evaluation_interval (its budget counts evaluations), the window
    records, the rest of the stage and the tickets every minute (windows.evaluation_interval,
    windows.stage_interval: a quarter of the ruler's CPU at a 15 s global interval, bench.fleet_steady); emptied, the
    window groups and the tickets fall back to the ruler's default."""
    cfg = monitoring_config.load()
    budgeted = ({rules.evidence_group(w) for w in rules.tested_windows(cfg)} | {rules.PAGE_GROUP}
                | {rules.PAGE_EVIDENCE_GROUP, f"specdecode.rules.stage.{stage.EVIDENCE_GROUP}"})
    groups = _groups()
    assert cfg.windows.evaluation_interval == "1m" and cfg.statistics.evaluation_interval == "15s"
    assert {g["name"]: g.get("interval") for g in groups} == {
        g["name"]: cfg.statistics.evaluation_interval if g["name"] in budgeted else "1m" for g in groups}
    assert len(budgeted) < len(groups)
    alerts = {r["alert"]: g.get("interval") for g in groups for r in g["rules"] if "alert" in r}
    assert alerts.pop(rules.PAGE) == "15s" and set(alerts.values()) == {"1m"} and len(alerts) >= 18
    # The 15 s stage records only what the 15 s groups read (the health tickets' error counts are staged every 1m).
    fast_stage = next(g for g in groups if g["name"] == f"specdecode.rules.stage.{stage.EVIDENCE_GROUP}")
    readers = budgeted - {fast_stage["name"]}
    fast_reads = "\n".join(r["expr"] for g in groups if g["name"] in readers for r in g["rules"])
    assert all(r["record"] in fast_reads for r in fast_stage["rules"] if r["record"] != stage.CLOCK), fast_stage
    at_default = rule_groups(mixin.with_value(cfg, "windows.evaluation_interval", None))["groups"]
    staged = {g["name"] for g in stage.stage_groups(cfg)}  # every windows.stage_interval, whatever the ruler's
    assert {g["name"] for g in at_default if "interval" not in g} == {g["name"] for g in groups} - budgeted - staged
