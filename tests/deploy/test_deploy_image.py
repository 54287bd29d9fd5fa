"""The Dockerfile: hadolint-clean, multi-stage, non-root numeric user, HEALTHCHECK on /healthz, pinned deps.
(The image itself is built and run by scripts/build-image.sh --local-base --smoke, which `make test` runs.)"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib

from deploy_helpers import DEPLOY, ROOT, require_tool
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DOCKERFILE = ROOT / "Dockerfile"
REQUIREMENTS = DEPLOY / "image" / "requirements.txt"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def test_hadolint_clean() -> None:
    hadolint = require_tool("hadolint")
    proc = subprocess.run(
        [hadolint, "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    findings = json.loads(proc.stdout or "[]")
    assert proc.returncode == 0 and not findings, findings or proc.stderr


def test_multi_stage_from_a_slim_python() -> None:
    froms = [rest for word, rest in _instructions() if word == "FROM"]
    assert len(froms) == 2 and " AS build" in froms[0]
    base = next(rest for word, rest in _instructions() if word == "ARG" and rest.startswith("PYTHON_BASE="))
    assert re.fullmatch(r"PYTHON_BASE=docker\.io/library/python:3\.\d+-slim-\w+", base), base


def test_final_stage_runs_as_numeric_non_root_and_exposes_the_port() -> None:
    final = _final_stage()
    [user] = [rest for word, rest in final if word == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0, "numeric, so runAsNonRoot can check it"
    assert ("EXPOSE", "9877") in final
    assert ("ENTRYPOINT", '["specdecode-exporter"]') in final
    assert not [rest for word, rest in final if word == "RUN"], "nothing (no compiler, no apt) runs in the final stage"
    env = " ".join(rest for word, rest in final if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "a read-only root filesystem: never try to write .pyc files"


def test_healthcheck_probes_healthz() -> None:
    [check] = [rest for word, rest in _final_stage() if word == "HEALTHCHECK"]
    assert "CMD" in check and "/healthz" in check and "/readyz" not in check
    assert "curl" not in check and "wget" not in check, "the slim base has neither"


def test_dependencies_pinned_with_their_closure() -> None:
    pins: dict[str, str] = {}
    for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            [spec] = list(req.specifier)
            assert spec.operator == "==", f"{line}: pin with =="
            pins[canonicalize_name(req.name)] = spec.version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for dep in project["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} (pyproject.toml) is not pinned in {REQUIREMENTS.relative_to(ROOT)}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} violates {dep}"
    runs = " ".join(rest for word, rest in _instructions() if word == "RUN")
    assert "--no-deps" in runs and "--only-binary=:all:" in runs and "pip check" in runs


def test_dockerignore_lets_in_what_the_dockerfile_copies() -> None:
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    }
    for word, rest in _instructions():
        if word == "COPY" and "--from=" not in rest:
            *sources, _dest = shlex.split(rest)
            for src in sources:
                assert src.rstrip("/") in allowed, f"COPY {src}: excluded by .dockerignore"
                assert (ROOT / src).exists() or src == "README.md", f"COPY {src}: no such file"
