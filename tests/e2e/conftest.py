"""E2E fixtures: the running chain (module scope) and a record of measured figures printed at the end of the run."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import chain as c
from devtools.procs import alertmanager_binary, prometheus_binary
from tests.helpers import require_tool

# Measured figures, one dict per scenario; printed in the terminal summary (visible without -s) and, when
# $SPECDECODE_E2E_REPORT names a file, written there as JSON.
MEASUREMENTS: list[dict[str, Any]] = []


@pytest.fixture
def record() -> Iterator[list[dict[str, Any]]]:
    yield MEASUREMENTS


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[c.Chain]:
    missing = [name for name, path in (("prometheus", prometheus_binary()),
                                       ("prometheus-alertmanager", alertmanager_binary())) if path is None]
    if missing:
        require_tool(None, f"{', '.join(missing)} (Debian packages)")
    workdir = tmp_path_factory.mktemp("chain")
    with c.running_chain(workdir) as running:
        yield running
    # running_chain's exit stopped every process (also when a test failed or the setup raised).


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not MEASUREMENTS:
        return
    terminalreporter.section("specdecode e2e: measured alert chain figures")
    for item in MEASUREMENTS:
        terminalreporter.write_line(item.get("line", json.dumps(item)))
    path = os.environ.get("SPECDECODE_E2E_REPORT")
    if path:
        Path(path).write_text(json.dumps(MEASUREMENTS, indent=2) + "\n")
