"""The rules read like Sloth's: files by concern, each group's purpose at its head, no expression a wall of PromQL,
the page a dozen lines over records named for what they are, every number left in an alert a threshold its runbook
section names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.monitoring import rules

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
FILES = [ALERTS / name for name in rules.RULE_FILES]
RUNBOOK = ALERTS / "runbook.md"
MAX_LINES, MAX_CHARS, PAGE_LINES = 30, 1500, 20


def _groups(path: Path) -> list[dict[str, Any]]:
    return list(yaml.safe_load(path.read_text(encoding="utf-8"))["groups"])


def _every_rule() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, rule) for path in FILES for group in _groups(path) for rule in group["rules"]]


def _name(rule: dict[str, Any]) -> str:
    return str(rule.get("record") or rule.get("alert"))


def test_the_rules_are_five_files_by_concern() -> None:
    concerns = {path.name: {g["name"] for g in _groups(path)} for path in FILES}
    assert list(concerns) == ["specdecode-stage.rules.yaml", "specdecode-windows.rules.yaml",
                              "specdecode-derived.rules.yaml", "specdecode-page.rules.yaml",
                              "specdecode-tickets.rules.yaml"]
    assert all(name.startswith("specdecode.rules.stage.") for name in concerns["specdecode-stage.rules.yaml"])
    assert {rules.PAGE_EVIDENCE_GROUP, rules.PAGE_GROUP} <= concerns["specdecode-page.rules.yaml"]
    assert rules.TICKETS_GROUP in concerns["specdecode-tickets.rules.yaml"]
    alerts = {name for name, rule in _every_rule() if "alert" in rule}
    assert alerts == {"specdecode-page.rules.yaml", "specdecode-tickets.rules.yaml"}


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_each_file_and_each_group_says_what_it_is_for(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").split("\n")
    head = [line for line in lines[:lines.index("groups:")] if line.startswith("# ")]
    assert len(head) > 2, "the file's purpose after the generated-file header"
    starts = [i for i, line in enumerate(lines) if line.startswith("  - name: ")]
    assert len(starts) == len(_groups(path))
    for i in starts:
        above = i
        while lines[above - 1].startswith("  # "):
            above -= 1
        purpose = " ".join(line.removeprefix("  # ") for line in lines[above:i])
        assert len(purpose) > 40, f"{lines[i]}: no purpose at its head"


def test_no_expression_is_a_wall_of_promql() -> None:
    """No record or alert over ~30 lines or 1,500 characters: long arithmetic is split into named steps."""
    walls = {_name(rule): (len(rule["expr"]), rule["expr"].count("\n")) for _, rule in _every_rule()
             if len(rule["expr"]) > MAX_CHARS or rule["expr"].rstrip("\n").count("\n") + 1 > MAX_LINES}
    assert walls == {}
    alerts = [rule for _, rule in _every_rule() if "alert" in rule]
    assert all(rule["expr"].rstrip("\n").count("\n") + 1 <= PAGE_LINES for rule in alerts), \
        {_name(r): r["expr"].count("\n") for r in alerts}


def test_the_page_combines_each_windows_named_evidence() -> None:
    """Per window: α, the drafted tokens, the test statistic, whether it proves α below the threshold, whether it
    shows α at or above it; the page reads the last two of every window and the hold, and nothing raw."""
    cfg = monitoring_config.shipped()
    records = {rule["record"]: rule["expr"] for _, rule in _every_rule() if "record" in rule}
    page = next(rule["expr"] for _, rule in _every_rule() if rule.get("alert") == rules.PAGE)
    for window in cfg.statistics.page_windows:
        alpha, drafted = rules.alpha_record(cfg, window), rules.evidence_record(cfg, window)
        z, proven = rules.page_z_record(cfg, window), rules.proven_below_record(cfg, window)
        assert {alpha, drafted, z, proven, rules.at_or_above_record(cfg, window)} <= records.keys(), window
        assert f"{proven} or {rules.at_or_above_record(cfg, window)}" in page
        # the proof is the test statistic past the window's bar, with α below the threshold and the evidence there
        assert records[z].rstrip("\n") in records[proven] and f"{alpha} < 0.5" in records[proven]
        assert f"{drafted} >= 600" in records[proven]
    assert f"{rules.shortest_window_record(cfg)} < 0.5" in page
    assert "[" not in page and "_total" not in page
    assert page.rstrip("\n").count("\n") + 1 <= 14


_NUMBER = re.compile(r"(?<![\w:.])\d+(?:\.\d+)?(?![\w:.])")


def numbers(expr: str) -> set[str]:
    """The numbers an expression compares or computes with: not label values, durations, or records' names."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\[[^\]]*\]|offset \w+", "", bare)
    bare = re.sub(r"[\w]*:[\w:]*", "record", bare)
    return set(_NUMBER.findall(bare))


def _sections() -> dict[str, str]:
    text = RUNBOOK.read_text(encoding="utf-8")
    return dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, re.S | re.M))


def test_every_number_left_in_an_alert_is_a_threshold_its_runbook_section_names() -> None:
    sections = _sections()
    unnamed = {}
    for _, rule in _every_rule():
        if "alert" not in rule:
            continue
        section = sections[rule["alert"]]
        missing = sorted(n for n in numbers(rule["expr"])
                         if not re.search(rf"(?<![\w.]){re.escape(n)}(?!\w|\.\d)", section))
        if missing:
            unnamed[rule["alert"]] = missing
    assert unnamed == {}


def test_the_number_scan_sees_numbers_and_nothing_else() -> None:
    expr = ('model:specdecode_acceptance_ratio:rate2m < 0.5\nand on (a) x:y:sampled_increase30m >= 600\n'
            'and sum_over_time(r:s:t{le="0.25"}[1m44s999ms] offset 10m) > 4.75')
    assert numbers(expr) == {"0.5", "600", "4.75"}
