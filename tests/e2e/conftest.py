"""E2E fixtures: the running chain (module scope) and a record of measured figures printed at the end of the run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devtools import chain as c
from devtools.procs import alertmanager_binary, prometheus_binary
from tests import figures
from tests.helpers import require_tool


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    """The test's measured figures, one dict per scenario, shown at the end of the run (tests/figures.py)."""
    found: list[dict[str, Any]] = []
    yield found
    figures.attach(request.node, found)


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
