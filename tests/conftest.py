"""The suite tests the package as users install it: a wheel built from src/ and installed into the venv, never
src/ itself (`make install` builds and installs it; `make test` does that first)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests import figures, slow

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "specdecode_exporter"


def _digests(package: Path) -> dict[str, str]:
    return {str(p.relative_to(package)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(package.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def installed_package() -> Path:
    import specdecode_exporter

    return Path(specdecode_exporter.__file__).resolve().parent


def pytest_sessionstart(session: pytest.Session) -> None:
    installed = installed_package()
    if installed == SOURCE.resolve():
        raise pytest.UsageError(f"the tests import {SOURCE} itself (an editable install?): they must test the "
                                "installed wheel; run `make install`")
    if SOURCE.is_dir():
        want, have = _digests(SOURCE), _digests(installed)
        differ = sorted(name for name in want.keys() | have.keys() if want.get(name) != have.get(name))
        if differ:
            raise pytest.UsageError(f"the installed package ({installed}) is not src/ as it is now ({len(differ)} "
                                    f"files differ, e.g. {', '.join(differ[:3])}): run `make install`")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tests (tests/slow.py); on a pytest-xdist worker, collect the slowest units first (every
    worker collects alike, and the scheduler below hands the units out in the order collected)."""
    for item in items:
        if slow.find(item.nodeid) is not None:
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):
        seconds = {item.nodeid: slow.seconds(item.nodeid) for item in items}
        items.sort(key=lambda item: -seconds[item.nodeid])  # stable: a unit's tests keep their order


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before pytest-xdist's own choice
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `-n N` (pytest-xdist's `load`, or `loadgroup`): hand out tests in the units of tests/slow.py, each a
    whole file unless an entry there says otherwise, slowest first."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return slow.unit(nodeid)

    config.option.loadscopereorder = False  # keep the collected order: slowest units first, not the largest
    return UnitScheduling(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    figures.collect(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    figures.summary(terminalreporter)
