"""The sdist and the wheel carry every file of the package: built here with `python -m build` (the wheel from
the sdist, as pip builds it), each compared with the files git tracks under src/specdecode_exporter."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "specdecode_exporter"


def tracked_package_files() -> set[str]:
    """Paths relative to src/, as git tracks them (the package's files, Python or not)."""
    out = subprocess.run(["git", "ls-files", "-z", f"src/{PACKAGE}"], cwd=ROOT, capture_output=True, check=True)
    return {name.removeprefix("src/") for name in out.stdout.decode().split("\0") if name}


@pytest.fixture(scope="module")
def distributions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    with tarfile.open(sdist) as tar:
        top = f"{sdist.name.removesuffix('.tar.gz')}/"
        sdist_files = {m.name.removeprefix(top) for m in tar.getmembers() if m.isfile()}
    with zipfile.ZipFile(wheel) as whl:
        wheel_files = set(whl.namelist())
    return {"sdist": {n.removeprefix("src/") for n in sdist_files if n.startswith("src/")}, "wheel": wheel_files,
            "sdist_all": sdist_files}


def test_git_tracks_the_package_data_this_test_looks_for() -> None:
    tracked = tracked_package_files()
    assert f"{PACKAGE}/core/contract/monitoring.yaml" in tracked  # the file whose absence crashed `pip install .`
    assert f"{PACKAGE}/py.typed" in tracked


@pytest.mark.parametrize("kind", ["sdist", "wheel"])
def test_every_tracked_file_of_the_package_is_shipped(distributions: dict[str, set[str]], kind: str) -> None:
    missing = sorted(tracked_package_files() - distributions[kind])
    assert not missing, f"the {kind} lacks {missing}: add them to [tool.setuptools.package-data] in pyproject.toml"


def test_the_sdist_can_be_built_and_tested_from(distributions: dict[str, set[str]]) -> None:
    """The sdist has what a downstream packager needs to build it: the project file, the README it names, the
    licence."""
    assert {"pyproject.toml", "README.md", "LICENSE"} <= distributions["sdist_all"]


def test_the_wheel_holds_nothing_but_the_package(distributions: dict[str, set[str]]) -> None:
    """No tests, tools or benches leak into site-packages under top-level names of their own."""
    tops = {name.split("/", 1)[0] for name in distributions["wheel"]}
    assert tops == {PACKAGE, next(t for t in tops if t.endswith(".dist-info"))}
