"""Every overlay renders with kustomize; built-in kinds pass kubernetes-validate --strict; the
prometheus-operator kinds pass the operator's CRD schemas (cloudcoil models, generated from the CRDs)."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import OVERLAYS, missing, render, require_tool

# Oldest Kubernetes minor still commonly run, and the newest kubernetes-validate knows.
K8S_VERSIONS = ["1.29.0", "1.37.0"]
CRD_GROUP = "monitoring.coreos.com"


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_renders_expected_kinds(overlay: str) -> None:
    docs = render(overlay)
    kinds = {d["kind"] for d in docs}
    assert kinds == OVERLAYS[overlay], f"{overlay}: rendered {sorted(kinds)}"
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), f"{overlay}: duplicate objects {names}"
    for doc in docs:
        assert "namespace" not in doc["metadata"], "namespace is the user's choice (kubectl apply -n)"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_builtin_kinds_validate_strict(overlay: str, version: str, tmp_path: Path) -> None:
    validator = require_tool("kubernetes-validate")
    builtin = [d for d in render(overlay) if not d["apiVersion"].startswith(CRD_GROUP)]
    assert builtin
    manifest = tmp_path / "builtin.yaml"
    manifest.write_text(yaml.safe_dump_all(builtin), encoding="utf-8")
    proc = subprocess.run(
        [validator, "--strict", "-k", version, str(manifest)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"kubernetes-validate --strict -k {version} {overlay}:\n{proc.stdout}{proc.stderr}"
    assert proc.stdout.count(" passed for resource ") == len(builtin), proc.stdout


def _crd_models() -> Any:
    try:
        from cloudcoil.models.prometheus_operator import v1
    except ImportError:
        missing("cloudcoil-models-prometheus-operator (prometheus-operator CRD models)")
    return v1


def _unknown_fields(sent: Any, kept: Any, path: str = "") -> list[str]:
    """Paths present in the manifest but dropped by the model: unknown fields (what the API server's
    pruning would silently remove and `kubectl apply --validate=strict` rejects)."""
    if isinstance(sent, dict) and isinstance(kept, dict):
        out = [f"{path}.{k}" for k in sent if k not in kept]
        for k in sent.keys() & kept.keys():
            out += _unknown_fields(sent[k], kept[k], f"{path}.{k}")
        return out
    if isinstance(sent, list) and isinstance(kept, list):
        return [
            p for i, (a, b) in enumerate(zip(sent, kept, strict=False)) for p in _unknown_fields(a, b, f"{path}[{i}]")
        ]
    return [] if sent == kept else [f"{path} (value changed: {sent!r} -> {kept!r})"]


def validate_crd_object(doc: dict[str, Any]) -> None:
    models = _crd_models()
    assert doc["apiVersion"] == f"{CRD_GROUP}/v1", doc["apiVersion"]
    model = getattr(models, doc["kind"])
    obj = model.model_validate(doc)  # types, enums, patterns, required fields from the CRD schema
    kept = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
    unknown = _unknown_fields(doc, kept)
    assert not unknown, f"{doc['kind']}/{doc['metadata']['name']}: fields not in the CRD schema: {unknown}"


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_prometheus_operator_kinds_validate_against_crds(overlay: str) -> None:
    crds = [d for d in render(overlay) if d["apiVersion"].startswith(CRD_GROUP)]
    assert crds
    for doc in crds:
        validate_crd_object(doc)


def test_crd_validation_catches_mistakes() -> None:
    """The CRD check is not a no-op: a misspelt field and a malformed duration both fail."""
    pod_monitor = next(d for d in render("deploy/base") if d["kind"] == "PodMonitor")
    typo = copy.deepcopy(pod_monitor)
    typo["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    with pytest.raises(AssertionError, match="intervall"):
        validate_crd_object(typo)
    bad_duration = copy.deepcopy(pod_monitor)
    bad_duration["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(Exception, match="interval"):
        validate_crd_object(bad_duration)


def test_strict_validation_catches_mistakes(tmp_path: Path) -> None:
    validator = require_tool("kubernetes-validate")
    deployment = next(d for d in render("deploy/examples/vllm") if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(deployment), encoding="utf-8")
    proc = subprocess.run(
        [validator, "--strict", str(manifest)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode != 0, proc.stdout
