"""Measured figures that tests print at the end of a run (the e2e chains' detection delays, ...): a test's figures
travel on its report (its user_properties), so that they reach the terminal summary also from a pytest-xdist
worker (`make test` runs two, docs/tests.md); the summary shows them (visible without -s) and, when
$SPECDECODE_E2E_REPORT names a file, writes them there as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

PROPERTY = "specdecode_e2e_figures"
MEASUREMENTS: list[dict[str, Any]] = []  # in the process that reports: the controller under xdist


def attach(node: pytest.Item, figures: list[dict[str, Any]]) -> None:
    node.user_properties.extend((PROPERTY, item) for item in figures)


def collect(report: pytest.TestReport) -> None:
    if report.when == "teardown":  # a test's last report, with every property its fixtures added
        MEASUREMENTS.extend(value for name, value in report.user_properties if name == PROPERTY)


def summary(terminalreporter: Any) -> None:
    if not MEASUREMENTS:
        return
    terminalreporter.section("specdecode e2e: measured alert chain figures")
    for item in MEASUREMENTS:
        terminalreporter.write_line(item.get("line", json.dumps(item)))
    path = os.environ.get("SPECDECODE_E2E_REPORT")
    if path:
        Path(path).write_text(json.dumps(MEASUREMENTS, indent=2) + "\n")
