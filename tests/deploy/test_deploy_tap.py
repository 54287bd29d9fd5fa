"""The request tap on Kubernetes (deploy/tap, a kustomize Component; deploy/examples/vllm-tap): the sidecar listens
where the Service sends clients, forwards to the vLLM in its pod, vLLM runs with the flags that fill the responses'
per-request metrics, and nothing else about the sidecar changes. Rendering and schema validation of the example
run with every other overlay (test_deploy_manifests.py: deploy_helpers.OVERLAYS includes it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import DEPLOY, ROOT, SIDECAR, find, kubectl, render, sidecar_container
from packaging.version import Version

from specdecode_exporter.sidecar.config import split_listen_address

TAP_EXAMPLE = "deploy/examples/vllm-tap"
PLAIN_EXAMPLE = "deploy/examples/vllm"
TAP_FLAG = "--tap.listen-address="
TAP_PORT_NAME = "specdecode-tap"
VLLM_FLAGS = ("--per-request-spec-decode-metrics=summary", "--enable-per-request-metrics")
FIRST_VLLM_WITH_PER_REQUEST_METRICS = Version("0.29")  # docs/architecture.md §3
# bench/tap.py: up to ~25 µs of CPU per forwarded chunk on the project's machine; the limit must not throttle the
# data path below 20,000 chunks/s (100 streams at 200 steps/s).
TAP_CPU_SECONDS_PER_CHUNK = 25e-6
MIN_CHUNKS_PER_SECOND = 20_000


def _cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _flag_value(args: list[str], flag: str) -> str:
    [value] = [a.removeprefix(flag) for a in args if a.startswith(flag)]
    return value


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "Deployment")["spec"]["template"]


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return container


def _named_port(pod: dict[str, Any], name: str) -> tuple[str, int]:
    """(container, containerPort) of the pod's port called ``name``: what a Service's named targetPort reaches."""
    found = [(c["name"], p["containerPort"]) for c in pod["spec"]["containers"] for p in c.get("ports", [])
             if p.get("name") == name]
    assert len(found) == 1, f"port {name!r}: {found}"
    return found[0]


def test_service_tap_port_reaches_the_port_the_sidecar_listens_on() -> None:
    docs = render(TAP_EXAMPLE)
    pod = _pod(docs)
    service = find(docs, "Service", "vllm")
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), "the Service selects the pod"
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    tap = ports["tap"]
    container, container_port = _named_port(pod, tap["targetPort"])
    assert container == SIDECAR and tap["targetPort"] == TAP_PORT_NAME
    host, listen_port = split_listen_address(_flag_value(sidecar_container(find(docs, "Deployment"))["args"],
                                                         TAP_FLAG))
    assert host == "0.0.0.0", "the tap must listen on the pod's address, not only on loopback"
    assert listen_port == container_port == tap["port"] == 8001
    # The Service's own port still goes to vLLM directly (clients move to the tap port when they choose to).
    assert _named_port(pod, ports["http"]["targetPort"]) == ("vllm", 8000)


def test_the_tap_forwards_to_the_vllm_in_the_pod() -> None:
    """The sidecar's real CLI, given the container's args (the mounted files mapped to the repository's), turns the
    tap on and forwards to the port vLLM serves on."""
    from specdecode_exporter.cli import build_parser, config_from_args

    pod = _pod(render(TAP_EXAMPLE))
    vllm = _container(pod, "vllm")
    vllm_port = int(_flag_value(vllm["args"], "--port="))
    assert _named_port(pod, "http") == ("vllm", vllm_port)
    mounted = str(DEPLOY / "base") + "/"
    args = [a.replace("/etc/specdecode-exporter/", mounted) for a in _container(pod, SIDECAR)["args"]]
    config = config_from_args(build_parser().parse_args(
        [*args, f"--monitoring.config-file={DEPLOY / 'base' / 'monitoring.yaml'}"]))
    assert config.tap is not None, "the tap is off"
    assert config.tap.upstream == f"http://127.0.0.1:{vllm_port}"
    assert split_listen_address(config.tap.listen_address)[1] == _named_port(pod, TAP_PORT_NAME)[1]
    assert config.tap.target == config.targets[0].name


def test_vllm_runs_with_the_flags_the_tap_needs() -> None:
    vllm = _container(_pod(render(TAP_EXAMPLE)), "vllm")
    for flag in VLLM_FLAGS:
        assert vllm["args"].count(flag) == 1, f"vLLM lacks {flag}: {vllm['args']}"
    # vLLM refuses --per-request-spec-decode-metrics without a speculative config, and older vLLMs refuse the flag.
    assert any(a.startswith("--speculative-config=") for a in vllm["args"])
    assert Version(vllm["image"].rsplit(":", 1)[1].lstrip("v")) >= FIRST_VLLM_WITH_PER_REQUEST_METRICS


def test_the_component_changes_only_args_ports_and_resources() -> None:
    """The tap example's sidecar is the plain example's plus the tap's arg and port, with room for the data path."""
    plain = sidecar_container(find(render(PLAIN_EXAMPLE), "Deployment"))
    tapped = sidecar_container(find(render(TAP_EXAMPLE), "Deployment"))
    assert tapped["args"] == [*plain["args"], f"{TAP_FLAG}:8001"]
    assert tapped["ports"] == [*plain["ports"], {"name": TAP_PORT_NAME, "containerPort": 8001, "protocol": "TCP"}]
    unchanged = {k: v for k, v in tapped.items() if k not in ("args", "ports", "resources")}
    assert unchanged == {k: v for k, v in plain.items() if k not in ("args", "ports", "resources")}
    limit = _cores(tapped["resources"]["limits"]["cpu"])
    assert limit >= MIN_CHUNKS_PER_SECOND * TAP_CPU_SECONDS_PER_CHUNK > _cores(plain["resources"]["limits"]["cpu"])
    assert [c["name"] for c in find(render(TAP_EXAMPLE), "Deployment")["spec"]["template"]["spec"]["containers"]] \
        == ["vllm", SIDECAR], "vLLM stays the pod's first container"


def _user_kustomization(tmp_path: Path, containers: list[str], name: str = "vllm") -> subprocess.CompletedProcess[str]:
    """A user's own kustomization: their Deployment and Service called ``name`` with ``containers``, the base, the
    sidecar and the tap (a copy of deploy/ whose components are retargeted at ``name``)."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    shutil.copytree(DEPLOY.parent / "grafana", tmp_path / "grafana")  # deploy/base takes the dashboard from there
    for component in ("sidecar", "tap"):
        path = tmp_path / "deploy" / component / "kustomization.yaml"
        path.write_text(path.read_text(encoding="utf-8").replace("name: vllm", f"name: {name}"), "utf-8")
    user = tmp_path / "user"
    user.mkdir()
    labels = {"app": name}
    objects = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
         "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
             "containers": [{"name": c, "image": f"example/{c}:1", "ports": [{"name": "http", "containerPort": 8000}]
                             if c == "server" else []} for c in containers]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}},
    ]
    (user / "objects.yaml").write_text(yaml.safe_dump_all(objects), encoding="utf-8")
    (user / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["objects.yaml", "../deploy/base"], "components": ["../deploy/sidecar", "../deploy/tap"]}),
        encoding="utf-8")
    return subprocess.run([kubectl(), "kustomize", str(user)], capture_output=True, text=True, timeout=120,
                          check=False)


def test_component_retargeted_at_a_users_deployment_and_service(tmp_path: Path) -> None:
    proc = _user_kustomization(tmp_path, ["server"], name="my-llm")
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    pod = _pod(docs)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["server", SIDECAR]
    assert TAP_FLAG + ":8001" in _container(pod, SIDECAR)["args"]
    ports = {p["name"]: p for p in find(docs, "Service", "my-llm")["spec"]["ports"]}
    assert ports["http"]["port"] == 80, "the user's own port is untouched"
    assert _named_port(pod, ports["tap"]["targetPort"]) == (SIDECAR, ports["tap"]["port"])


def test_a_pod_where_the_sidecar_is_not_second_fails_the_build(tmp_path: Path) -> None:
    """The container patch addresses the sidecar by index; its `test` op stops the build rather than patch another
    container (here a log shipper that sits second)."""
    proc = _user_kustomization(tmp_path, ["server", "log-shipper"])
    assert proc.returncode != 0, "the tap's patch was applied to the wrong container"
    assert "/spec/template/spec/containers/1/name failed: test failed" in proc.stderr, proc.stderr


def _kubectl_patch(manifest: Path, patch_type: str, patch_file: Path, out: Path) -> dict[str, Any]:
    """`kubectl patch --local`: the patch applied by the same code the API server uses, no cluster needed."""
    proc = subprocess.run([kubectl(), "patch", "--local", "-f", str(manifest), "--type", patch_type, "--patch-file",
                           str(patch_file), "-o", "yaml"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out.write_text(proc.stdout, encoding="utf-8")
    result: dict[str, Any] = yaml.safe_load(proc.stdout)
    return result


@pytest.mark.parametrize("patch", ["sidecar/sidecar-patch.yaml", "tap/tap-patch.yaml"])
def test_the_kubectl_patch_files_name_no_deployment(patch: str) -> None:
    """`kubectl patch deployment <name> --patch-file …`: the API server compares a name in the patch with the
    Deployment the command names and refuses any other ("the name of the object (vllm) does not match the name on
    the URL"); `kubectl patch --local` below does not check it, so this does."""
    document = yaml.safe_load((DEPLOY / patch).read_text(encoding="utf-8"))
    assert "metadata" not in document, document.get("metadata")
    assert document["kind"] == "Deployment" and document["spec"]["template"]


def test_kubectl_patch_path_gives_the_components_result(tmp_path: Path) -> None:
    """The README's path without kustomize (the sidecar's strategic patch, then the tap's) makes the same sidecar
    container and the same Service ports as the Component does."""
    example = DEPLOY / "examples" / "vllm"
    _kubectl_patch(example / "vllm-deployment.yaml", "strategic", DEPLOY / "sidecar" / "sidecar-patch.yaml",
                   tmp_path / "with-sidecar.yaml")
    patched = _kubectl_patch(tmp_path / "with-sidecar.yaml", "strategic", DEPLOY / "tap" / "tap-patch.yaml",
                             tmp_path / "with-tap.yaml")
    by_kubectl = sidecar_container(patched)
    by_kustomize = sidecar_container(find(render(TAP_EXAMPLE), "Deployment"))
    # kubectl puts a merged port first, kustomize's JSON patch appends it: the order of ports means nothing.
    for container in (by_kubectl, by_kustomize):
        container["ports"] = sorted(container["ports"], key=lambda p: p["containerPort"])
    assert by_kubectl == by_kustomize
    vllm = _container(patched["spec"]["template"], "vllm")
    assert vllm == _container(find(render(PLAIN_EXAMPLE), "Deployment")["spec"]["template"], "vllm")
    service = _kubectl_patch(example / "vllm-service.yaml", "json", DEPLOY / "tap" / "service-patch.yaml",
                             tmp_path / "service.yaml")
    assert service["spec"]["ports"] == find(render(TAP_EXAMPLE), "Service", "vllm")["spec"]["ports"]


def test_readme_names_the_vllm_flags_and_the_tap_port() -> None:
    readme = " ".join((ROOT / "deploy" / "README.md").read_text(encoding="utf-8").split())
    for needle in ("deploy/tap", "--per-request-spec-decode-metrics summary", "--enable-per-request-metrics",
                   "8001", "deploy/examples/vllm-tap", "bench/results.md"):
        assert needle in readme, needle
