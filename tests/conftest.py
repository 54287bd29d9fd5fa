"""The suite tests the package as users install it: a wheel built from src/ and installed into the venv, never
src/ itself (`make install` builds and installs it; `make test` does that first)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

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
