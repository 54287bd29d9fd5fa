"""The sidecar from a bare install: a virtual environment with only the wheel and [project].dependencies
(scripts/runtime-venv.sh, run by `make test`), started as users start it, from a directory outside the checkout.

It must collect, serve α, the status page and the request tap, and import nothing outside its dependencies:
no simulator, probe, build-time generator, nor any test-only or build-time package."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.procs import Process, child_env, free_port, start_process, tail
from devtools.stack import start_simulator, wait_until
from tests.helpers import require_tool

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_VENV = Path(os.environ.get("RUNTIME_VENV", ROOT / ".venv-runtime"))
PACKAGE = "specdecode_exporter"
# Never imported by `specdecode-exporter run`: the tools, and the packages only their extras bring.
NOT_AT_RUN_TIME = (f"{PACKAGE}.simulator", f"{PACKAGE}.probe", f"{PACKAGE}.monitoring", f"{PACKAGE}.demo",
                   f"{PACKAGE}.check", "grafana_foundation_sdk", "matplotlib", "_jsonnet", "hypothesis", "pytest")


def runtime_bin(name: str) -> Path:
    path = RUNTIME_VENV / "bin" / name
    require_tool(str(path) if path.exists() else None, f"the bare install {RUNTIME_VENV}", "scripts/runtime-venv.sh")
    return path


def imported_modules(importtime_log: str) -> set[str]:
    """Module names from `python -X importtime` lines: 'import time: self | cumulative | name'."""
    names = set()
    for line in importtime_log.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+\d+ \| (\s*)(\S+)", line)
        if match:
            names.add(match.group(2))
    return names


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as exits:
        yield exits


def start_bare_sidecar(stack: contextlib.ExitStack, workdir: Path, target: str, tap_port: int) -> Process:
    exe = runtime_bin("specdecode-exporter")
    proc = start_process("bare-sidecar", lambda port: [
        str(exe), "run", "--target", target, "--collect.interval", "0.5s",
        "--web.listen-address", f"127.0.0.1:{port}", "--tap.listen-address", f"127.0.0.1:{tap_port}",
    ], workdir, "/healthz", env=child_env({"PYTHONPROFILEIMPORTTIME": "1"}, drop=("PYTHONPATH",)))
    stack.callback(proc.stop)
    return proc


def test_the_sidecar_from_a_bare_install_serves_alpha_the_status_page_and_the_tap(
        stack: contextlib.ExitStack, tmp_path: Path) -> None:
    sim = start_simulator(stack, tmp_path, "simulator", "--acceptance-rate", "0.7", "--num-speculative-tokens", "3",
                          "--model-name", "tiny")
    tap_port = free_port()
    sidecar = start_bare_sidecar(stack, tmp_path / "elsewhere", sim.url + "/metrics", tap_port)
    with httpx.Client(trust_env=False, timeout=10) as client:
        def with_alpha() -> str | None:
            text = client.get(sidecar.url + "/metrics").text
            return text if re.search(r"^specdecode_acceptance_ratio\{", text, re.M) else None

        metrics = wait_until(with_alpha, 30, "a windowed α from the bare install", [sim, sidecar])
        assert re.search(r"^specdecode_up\{.*\} 1\.0$", metrics, re.M), metrics[:2000]
        page = client.get(sidecar.url + "/")
        assert page.status_code == 200 and "α" in page.text
        tap = f"http://127.0.0.1:{tap_port}"
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 8, "temperature": 0.0}
        direct = client.post(sim.url + "/v1/completions", json=body)
        tapped = client.post(tap + "/v1/completions", json=body, headers={"x-workload": "chat"})
        assert tapped.status_code == direct.status_code == 200
        assert tapped.json().keys() == direct.json().keys()
        wait_until(lambda: re.search(r'^specdecode_requests_total\{.*workload="chat".*\} 1\.0$',
                                     client.get(sidecar.url + "/metrics").text, re.M),
                   10, "the tapped request counted", [sim, sidecar])
    sidecar.stop()
    loaded = imported_modules(sidecar.log.read_text(errors="replace"))
    assert f"{PACKAGE}.sidecar.web" in loaded, tail(sidecar.log)
    wrong = sorted(name for name in loaded if name.startswith(NOT_AT_RUN_TIME))
    assert not wrong, f"`specdecode-exporter run` imported {wrong}"


def test_the_build_without_the_dashboard_extra_says_which_extra_in_one_line(tmp_path: Path) -> None:
    python = runtime_bin("python")
    rules = subprocess.run([str(python), "-m", f"{PACKAGE}.monitoring.build", "--rules-out", "-"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, env=child_env(drop=("PYTHONPATH",)))
    assert rules.returncode == 0, rules.stderr
    assert "SpecDecodeAcceptanceRateLow" in rules.stdout
    everything = subprocess.run([str(python), "-m", f"{PACKAGE}.monitoring.build", "--root", str(tmp_path)],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                env=child_env(drop=("PYTHONPATH",)))
    assert everything.returncode == 2
    assert len(everything.stderr.strip().splitlines()) == 1, everything.stderr
    assert "specdecode-exporter[dashboard]" in everything.stderr


def test_the_bare_install_is_the_tested_one() -> None:
    """The bare install and the test venv hold the same build of the package."""
    python = runtime_bin("python")
    code = "import specdecode_exporter.core.contract.metrics as m, pathlib; print(pathlib.Path(m.__file__).read_text())"
    bare = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True,
                          env=child_env(drop=("PYTHONPATH",)), cwd="/")
    ours = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=child_env(drop=("PYTHONPATH",)), cwd="/")
    assert bare.stdout == ours.stdout
