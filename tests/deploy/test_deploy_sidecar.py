"""The sidecar as users get it: security context, probes, resources, wiring between the objects."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import DEPLOY, SIDECAR, find, kubectl, render, sidecar_container

PORT = 9877
PORT_NAME = "specdecode"
CONFIG_DIR = "/etc/specdecode-exporter"
SCRAPE_LABEL = ("specdecode-exporter/scrape", "true")
WITH_SIDECAR = ["deploy/examples/vllm", "deploy/examples/vllm-servicemonitor", "deploy/examples/vllm-tap"]


def _quantity(value: str) -> float:
    """Kubernetes quantity -> float (CPU in cores, memory in bytes); just the suffixes used here."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def _deployment(overlay: str) -> dict[str, Any]:
    return find(render(overlay), "Deployment")


def _raw_patch_container() -> dict[str, Any]:
    patch = yaml.safe_load((DEPLOY / "sidecar" / "sidecar-patch.yaml").read_text(encoding="utf-8"))
    return patch["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("overlay", WITH_SIDECAR)
def test_restricted_security_context(overlay: str) -> None:
    ctx = sidecar_container(_deployment(overlay))["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert isinstance(ctx["runAsUser"], int) and ctx["runAsUser"] > 0
    assert isinstance(ctx["runAsGroup"], int) and ctx["runAsGroup"] > 0
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx.get("privileged", False) is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize("overlay", WITH_SIDECAR)
def test_patch_leaves_the_vllm_container_and_pod_alone(overlay: str) -> None:
    deployment = _deployment(overlay)
    pod = deployment["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    # vLLM stays first: it is the default container of `kubectl logs` and `kubectl exec`.
    assert names == ["vllm", SIDECAR]
    assert "securityContext" not in pod, "the sidecar must not change the pod-level security context"
    vllm = pod["containers"][0]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    assert any("--speculative-config=" in a for a in vllm["args"]), "the example must have spec decode on"
    assert deployment["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm"}


@pytest.mark.parametrize("overlay", WITH_SIDECAR)
def test_probes_use_healthz_never_readyz(overlay: str) -> None:
    container = sidecar_container(_deployment(overlay))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        # /readyz would make the whole vLLM pod NotReady (out of its Service) when vLLM's /metrics hiccups.
        assert get["path"] == "/healthz", f"{probe} must use /healthz, not {get['path']}"
        assert get["port"] == PORT_NAME
    # The metrics port first; the request tap (deploy/tap) adds its own after it (tests/deploy/test_deploy_tap.py).
    assert container["ports"][0] == {"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}
    assert len(container["ports"]) == (2 if overlay.endswith("-tap") else 1)


@pytest.mark.parametrize("overlay", WITH_SIDECAR)
def test_resources_requests_within_limits(overlay: str) -> None:
    resources = sidecar_container(_deployment(overlay))["resources"]
    for key in ("cpu", "memory"):
        request, limit = _quantity(resources["requests"][key]), _quantity(resources["limits"][key])
        assert 0 < request <= limit, f"{key}: request {request} limit {limit}"
    # Idle RSS of the Python runtime is ~48 MiB: a request below that would be a scheduling lie.
    assert _quantity(resources["requests"]["memory"]) >= 48 * 2**20
    assert _quantity(resources["limits"]["memory"]) <= 256 * 2**20


@pytest.mark.parametrize("overlay", WITH_SIDECAR)
def test_config_mount_and_writable_tmp(overlay: str) -> None:
    docs = render(overlay)
    deployment = find(docs, "Deployment")
    container = sidecar_container(deployment)
    assert f"--config.file={CONFIG_DIR}/config.yaml" in container["args"]
    assert container["args"][0] == "run"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[CONFIG_DIR]["readOnly"] is True
    assert "/tmp" in mounts, "a read-only root filesystem needs an emptyDir for any temporary file"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    config_map = volumes[mounts[CONFIG_DIR]["name"]]["configMap"]["name"]
    cm = find(docs, "ConfigMap", config_map)
    assert {"config.yaml", "monitoring.yaml"} <= set(cm["data"])
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def test_sidecar_config_shape() -> None:
    config = yaml.safe_load((DEPLOY / "base" / "config.yaml").read_text(encoding="utf-8"))
    assert set(config) <= {"collect", "windows", "targets", "monitoring"}
    assert config["monitoring"] == {"config_file": f"{CONFIG_DIR}/monitoring.yaml"}
    [target] = config["targets"]
    assert target["url"] == "http://127.0.0.1:8000/metrics", "a sidecar watches the vLLM in its own pod"
    assert set(target) <= {"name", "url", "timeout", "labels", "method", "num_speculative_tokens", "cost_model"}
    assert set(target["cost_model"]) == {"c_draft", "c_verify"}


@pytest.mark.parametrize("overlay", WITH_SIDECAR)
def test_scrape_objects_select_the_sidecar(overlay: str) -> None:
    docs = render(overlay)
    pod_labels = find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[SCRAPE_LABEL[0]] == SCRAPE_LABEL[1]
    kinds = {d["kind"] for d in docs}
    if "PodMonitor" in kinds:
        spec = find(docs, "PodMonitor")["spec"]
        assert spec["selector"]["matchLabels"] == dict([SCRAPE_LABEL])
        assert [e["port"] for e in spec["podMetricsEndpoints"]] == [PORT_NAME]
    else:
        service = find(docs, "Service", SIDECAR)
        assert service["spec"]["selector"] == dict([SCRAPE_LABEL])
        assert service["spec"]["ports"][0]["targetPort"] == PORT_NAME
        monitor = find(docs, "ServiceMonitor")["spec"]
        assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert [e["port"] for e in monitor["endpoints"]] == [service["spec"]["ports"][0]["name"]]


def test_kubectl_patch_file_matches_the_component() -> None:
    """`kubectl patch --patch-file deploy/sidecar/sidecar-patch.yaml` and the kustomize component give the
    same container (the component's patches are generated from that file)."""
    rendered = sidecar_container(_deployment("deploy/examples/vllm"))
    assert rendered == _raw_patch_container()


def test_sidecar_config_loads_in_the_exporter() -> None:
    """The ConfigMap's config is accepted by the exporter's own loader (one clear error per bad key)."""
    from specdecode_exporter.sidecar.config import load_config_file

    # The ConfigMap mounts config.yaml and monitoring.yaml side by side; here the flag points at the latter.
    config = load_config_file(str(DEPLOY / "base" / "config.yaml"),
                              monitoring_file=str(DEPLOY / "base" / "monitoring.yaml"))
    [target] = config.targets
    assert target.name == "vllm"


def test_component_retargeted_at_a_users_deployment(tmp_path: Path) -> None:
    """The README's GitOps path: a copy of deploy/sidecar pointed at another Deployment name adds the sidecar
    to that Deployment only, after the user's container, and leaves other Deployments alone."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    shutil.copytree(DEPLOY.parent / "grafana", tmp_path / "grafana")  # deploy/base takes the dashboard from there
    component = tmp_path / "deploy" / "sidecar" / "kustomization.yaml"
    component.write_text(component.read_text(encoding="utf-8").replace("name: vllm", "name: my-llm"), "utf-8")
    user = tmp_path / "user"
    user.mkdir()
    deployments = []
    for name in ("my-llm", "other"):
        deployments.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai:v0.11.0"}]},
                    },
                },
            }
        )
    (user / "deployments.yaml").write_text(yaml.safe_dump_all(deployments), encoding="utf-8")
    (user / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["deployments.yaml", "../deploy/base"],
                "components": ["../deploy/sidecar"],
                "images": [{"name": "specdecode-exporter", "newName": "registry.example/specdecode-exporter"}],
            }
        ),
        encoding="utf-8",
    )
    proc = subprocess.run([kubectl(), "kustomize", str(user)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    mine = find(docs, "Deployment", "my-llm")
    assert [c["name"] for c in mine["spec"]["template"]["spec"]["containers"]] == ["server", SIDECAR]
    assert sidecar_container(mine)["image"] == "registry.example/specdecode-exporter:0.1.0"
    other = find(docs, "Deployment", "other")
    assert [c["name"] for c in other["spec"]["template"]["spec"]["containers"]] == ["server"]
