"""`make demo` installs only what the demo runs (the runtime dependencies, the wheel built once), not the test
toolchain, and takes a port (DEMO_PORT)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_demo_on_a_fresh_machine_installs_the_runtime_only_and_builds_once(tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # none yet: every step a fresh machine takes
    # --no-print-directory: under `make test` this make is a sub-make and would print "Entering directory" lines.
    result = subprocess.run(["make", "--no-print-directory", "-n", "demo", f"VENV={venv}", "DEMO_PORT=9911"],
                            cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
    commands = [line for line in result.stdout.splitlines() if not line.startswith("touch ")]
    assert commands == ["bash scripts/bootstrap-venv.sh --runtime", "bash scripts/install-package.sh",
                        f"{venv}/bin/specdecode-exporter demo --web.listen-address 127.0.0.1:9911"]
    script = (ROOT / "scripts" / "bootstrap-venv.sh").read_text().splitlines()
    assert not [line for line in script if "install-package" in line and not line.startswith("#")], (
        "the bootstrap builds no wheel: install-package.sh builds it, once")


def test_the_runtime_requirements_are_the_projects_and_the_test_extras_expand_its_own() -> None:
    def requirements(*extras: str) -> list[str]:
        return subprocess.run([sys.executable, "scripts/requirements.py", "pyproject.toml", *extras], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.split("\n")

    runtime, test = requirements(), requirements("test")
    assert any(r.startswith("starlette") for r in runtime) and not any(r.startswith("pytest") for r in runtime)
    assert set(runtime) <= set(test) and any(r.startswith("pytest") for r in test)
    assert any(r.startswith("matplotlib") for r in test), "specdecode-exporter[plot,dashboard] expanded"
    assert not any(r.startswith("specdecode-exporter") for r in test)
