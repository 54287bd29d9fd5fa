"""A fleet on VictoriaMetrics, on loopback: simulated pods (the simulator and a real sidecar each) → two vmagent
shards (-promscrape.cluster.*) → single-node victoria-metrics ← vmalert with the generated rules (e2e profile) →
Alertmanager (the example routing tree) → a local webhook.

The shipped recording groups, which the dashboard reads, run in a second vmalert against a second victoria-metrics
that the shards also write to. The two rule sets record the same names (the short stage above all) at different
intervals; in one store each would add its samples to the other's series and both windows would be wrong.

Used by tests/e2e/test_victoriametrics.py. The binaries are Debian's `victoria-metrics` package
(scripts/install-tools.sh): victoria-metrics, vmagent, vmalert; override with $VICTORIA_METRICS, $VMAGENT, $VMALERT.
Every process is started and stopped by devtools.procs, like the Prometheus chain (devtools.chain).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from devtools.chain import (
    JOB,
    NAMESPACE,
    Webhook,
    fmt_duration,
    rules_settings,
    seconds,
    start_alertmanager,
    write_rules,
    write_shipped_rules,
)
from devtools.procs import (
    Process,
    StartError,
    alertmanager_binary,
    exporter_command,
    find_tool,
    free_port,
    start_process,
    tail,
)
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig

SHARDS = 2
SCRAPE_INTERVAL_S = 1.0
EVALUATION_INTERVAL_S = 1.0  # vmalert's default for the groups without their own interval
# Above the delay from a scrape to a queryable sample (vmagent's 1s flush, then victoria-metrics' own buffering):
# each stage record is `x - x offset 1s`, and a query that cannot see a pod's newest sample yet reads the same
# sample at both instants and records 0 for that pod. At 1s a loaded machine lost whole pods that way (the paged
# model's stage read 0 for minutes; the healthy model's α read 1.5 when one record lost a pod the other kept).
LATENCY_OFFSET_S = 5.0
COLLECT_INTERVAL_S = 1.0
DRAFTS_PER_SECOND = 200.0
SHARD_ATTEMPTS = 12  # a split with an empty shard has chance 2/2^targets; each attempt draws new pod names
VLLM_JOB = "vllm"


def victoria_metrics_binary() -> str | None:
    return find_tool("VICTORIA_METRICS", "victoria-metrics", "victoria-metrics-prod")


def vmagent_binary() -> str | None:
    return find_tool("VMAGENT", "vmagent", "vmagent-prod")


def vmalert_binary() -> str | None:
    return find_tool("VMALERT", "vmalert", "vmalert-prod")


@dataclass(frozen=True)
class PodSpec:
    """One simulated vLLM pod: its served model and steady acceptance rate."""

    role: str  # the pod name's stem, e.g. "paged" (its pods are <role>-<suffix>-<i>)
    model: str
    acceptance_rate: float


@dataclass
class Pod:
    spec: PodSpec
    simulator: Process
    sidecar: Process

    @property
    def address(self) -> str:
        """The sidecar's host:port: the target vmagent scrapes (its `instance` label)."""
        return self.sidecar.url.removeprefix("http://")


@dataclass
class Fleet:
    workdir: Path
    settings: MonitoringConfig
    webhook: Webhook
    pods: list[Pod]
    pod_names: dict[str, str]  # sidecar address -> the pod label its scrape target carries
    victoria: Process
    shards: list[Process]
    vmalert: Process
    recordings: Process  # a second victoria-metrics: the same scrapes, the shipped recording groups' records
    recorder: Process  # a second vmalert: the shipped recording groups (default config), for the dashboard
    alertmanager: Process
    client: httpx.Client = field(default_factory=lambda: httpx.Client(trust_env=False, timeout=10))

    @property
    def processes(self) -> list[Process]:
        sidecars = [proc for pod in self.pods for proc in (pod.simulator, pod.sidecar)]
        return [*sidecars, self.victoria, self.recordings, *self.shards, self.vmalert, self.recorder,
                self.alertmanager]

    def query(self, expr: str, store: Process | None = None) -> list[dict[str, Any]]:
        """An instant query on victoria-metrics (by default the store the page's vmalert reads)."""
        resp = self.client.get((store or self.victoria).url + "/api/v1/query", params={"query": expr})
        assert resp.status_code == 200, f"{expr}\n-> {resp.status_code} {resp.text[:300]}"
        body = resp.json()
        assert body.get("status") == "success", f"{expr}\n-> {body}"
        return list(body["data"]["result"])

    def values(self, expr: str, label: str) -> dict[str, float]:
        """An instant vector as {the value of ``label``: sample value}."""
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(expr)}

    def query_range(self, expr: str, start: float, end: float, step: str) -> httpx.Response:
        """A range query on the store of the shipped recordings (what the dashboard reads)."""
        return self.client.get(self.recordings.url + "/api/v1/query_range",
                               params={"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step})

    def shard_targets(self, shard: Process) -> set[str]:
        """The scrape targets (addresses) one vmagent shard has taken."""
        body = self.client.get(shard.url + "/api/v1/targets").json()
        return {t["labels"]["instance"] for t in body["data"]["activeTargets"]}

    def rule_alerts(self, alertname: str) -> list[dict[str, Any]]:
        """vmalert's active alerts (pending and firing) of that name."""
        body = self.client.get(self.vmalert.url + "/api/v1/alerts").json()
        active = body["data"]["alerts"] or []  # vmalert answers "alerts": null, not [], while none is active
        return [a for a in active if a.get("name", a.get("labels", {}).get("alertname")) == alertname]

    def rule_errors(self, ruler: Process) -> list[str]:
        """Every rule of a vmalert not yet evaluated, or whose last evaluation failed (with its error)."""
        body = self.client.get(ruler.url + "/api/v1/rules").json()
        rules = [(group["name"], rule) for group in body["data"]["groups"] for rule in group["rules"]]
        assert rules, f"{ruler.name} has no rules"
        return [f"{group}: {rule['name']}: {rule['lastError'] or 'never evaluated'}" for group, rule in rules
                if rule["lastError"] or rule["lastEvaluation"].startswith("0001-")]

    def check_alive(self) -> None:
        for proc in self.processes:
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{tail(proc.log)}")

    def diagnostics(self) -> str:
        lines = [f"webhook got {len(self.webhook.all())} notification(s)"]
        for proc in (self.victoria, self.recordings, *self.shards, self.vmalert, self.recorder, self.alertmanager):
            lines.append(f"--- {proc.name} ({proc.url}) log tail:\n{tail(proc.log, 10)}")
        return "\n".join(lines)


def _binaries() -> tuple[str, str, str, str]:
    found = {"victoria-metrics": victoria_metrics_binary(), "vmagent": vmagent_binary(),
             "vmalert": vmalert_binary(), "alertmanager": alertmanager_binary()}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise StartError(f"{', '.join(missing)} not found: run scripts/install-tools.sh (Debian packages "
                         "victoria-metrics, prometheus-alertmanager)")
    return (str(found["victoria-metrics"]), str(found["vmagent"]), str(found["vmalert"]),
            str(found["alertmanager"]))


def _start_pod(stack: contextlib.ExitStack, workdir: Path, spec: PodSpec, index: int,
               settings: MonitoringConfig) -> Pod:
    exporter = exporter_command()
    name = f"{spec.role}-{index}"
    simulator = start_process(f"simulator-{name}", lambda port: [
        *exporter, "simulate", "--web.listen-address", f"127.0.0.1:{port}", "--model-name", spec.model,
        "--acceptance-rate", str(spec.acceptance_rate), "--drafts-per-second", f"{DRAFTS_PER_SECOND:g}",
        "--seed", str(index),
    ], workdir, "/health")
    stack.callback(simulator.stop)
    windows = sorted({settings.short_window, settings.sidecar_alert_window, "5m"}, key=seconds)
    sidecar = start_process(f"sidecar-{name}", lambda port: [
        *exporter, "run", "--target", f"{simulator.url}/metrics", "--web.listen-address", f"127.0.0.1:{port}",
        "--collect.interval", fmt_duration(COLLECT_INTERVAL_S), "--collect.windows", ",".join(windows),
    ], workdir, "/readyz")
    stack.callback(sidecar.stop)
    return Pod(spec, simulator, sidecar)


def pod_names(pods: Sequence[Pod], suffix: str) -> dict[str, str]:
    """Pod labels as a ReplicaSet names its pods: <role>-<template hash>-<index among the role's pods>."""
    names: dict[str, str] = {}
    for pod in pods:
        index = sum(1 for other in names.values() if other.startswith(f"{pod.spec.role}-"))
        names[pod.address] = f"{pod.spec.role}-{suffix}-{index}"
    return names


def scrape_config(pods: Sequence[Pod], names: dict[str, str]) -> dict[str, Any]:
    """The sidecars' job, each target with the labels a Kubernetes scrape adds (namespace, pod), and vLLM's own
    /metrics (the simulators) as the dashboard's vLLM panels read it."""
    def targets(address: Callable[[Pod], str]) -> list[dict[str, Any]]:
        return [{"targets": [address(pod)], "labels": {"namespace": NAMESPACE, "pod": names[pod.address]}}
                for pod in pods]

    return {
        "global": {"scrape_interval": fmt_duration(SCRAPE_INTERVAL_S),
                   "scrape_timeout": fmt_duration(SCRAPE_INTERVAL_S)},
        "scrape_configs": [
            {"job_name": JOB, "static_configs": targets(lambda pod: pod.address)},
            {"job_name": VLLM_JOB, "static_configs": targets(lambda pod: pod.simulator.url.removeprefix("http://"))},
        ],
    }


def _start_shard(workdir: Path, binary: str, member: int, config: Path, write_urls: Sequence[str],
                 tag: str) -> Process:
    """One vmagent shard; it writes every sample it scrapes to each of ``write_urls``."""
    data = workdir / f"vmagent-{tag}-{member}"
    return start_process(f"vmagent-{tag}-{member}", lambda port: [
        binary, f"-promscrape.config={config}", f"-promscrape.cluster.membersCount={SHARDS}",
        f"-promscrape.cluster.memberNum={member}", *(f"-remoteWrite.url={url}" for url in write_urls),
        f"-remoteWrite.tmpDataPath={data}", "-remoteWrite.flushInterval=1s", f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN",
    ], workdir, "/health")


def _shard_split(workdir: Path, binary: str, config: Path, client: httpx.Client, targets: int) -> list[set[str]]:
    """The targets each shard takes with this config, from shards that write nowhere (a closed loopback port)."""
    nowhere = f"http://127.0.0.1:{free_port()}/api/v1/write"
    with contextlib.ExitStack() as probes:
        shards = []
        for member in range(SHARDS):
            shard = _start_shard(workdir, binary, member, config, [nowhere], "probe")
            probes.callback(shard.stop)
            shards.append(shard)
        deadline = time.monotonic() + 30
        while True:  # the scrapers start a moment after /health answers
            split = [{t["labels"]["instance"] for t in client.get(s.url + "/api/v1/targets").json()["data"]
                      ["activeTargets"]} for s in shards]
            if sum(map(len, split)) >= targets or time.monotonic() > deadline:
                return split
            time.sleep(0.2)


def _names_that_split(workdir: Path, binary: str, pods: Sequence[Pod], client: httpx.Client) -> dict[str, str]:
    """Pod names under which every shard takes some of the sidecars. vmagent shards by a hash of a target's labels,
    its random loopback port among them, so a draw can leave a shard empty: draw the ReplicaSet's hash again."""
    config = workdir / "vmagent.yml"
    names: dict[str, str] = {}
    for attempt in range(SHARD_ATTEMPTS):
        names = pod_names(pods, f"{attempt:05x}")
        config.write_text(yaml.safe_dump(scrape_config(pods, names), sort_keys=False))
        split = _shard_split(workdir, binary, config, client, 2 * len(pods))
        if all(shard & names.keys() for shard in split):
            break
    return names


def _start_store(stack: contextlib.ExitStack, workdir: Path, binary: str, name: str) -> Process:
    store = start_process(name, lambda port: [
        binary, f"-storageDataPath={workdir / (name + '-data')}", f"-httpListenAddr=127.0.0.1:{port}",
        # Queries see the store as of LATENCY_OFFSET ago (the default 30s would make a test of minutes wait), and no
        # response cache.
        f"-search.latencyOffset={fmt_duration(LATENCY_OFFSET_S)}", "-search.disableCache", "-loggerLevel=WARN",
    ], workdir, "/health")
    stack.callback(store.stop)
    return store


def _vmalert_command(binary: str, rules: Path, victoria: str, port: int, alertmanager: str | None) -> list[str]:
    """vmalert against a remote store: it reads from victoria-metrics, writes its records and ALERTS back there,
    restores alert state from it, and notifies Alertmanager (where it has alerts)."""
    notify = [f"-notifier.url={alertmanager}"] if alertmanager else []
    return [
        binary, f"-rule={rules}", f"-datasource.url={victoria}", f"-remoteWrite.url={victoria}",
        f"-remoteRead.url={victoria}", *notify, f"-evaluationInterval={fmt_duration(EVALUATION_INTERVAL_S)}",
        "-remoteWrite.flushInterval=1s", f"-httpListenAddr=127.0.0.1:{port}", f"-external.url=http://127.0.0.1:{port}",
        "-loggerLevel=WARN",
    ]


@contextlib.contextmanager
def running_fleet(workdir: Path, specs: Sequence[PodSpec]) -> Iterator[Fleet]:
    """Start the pods and the VictoriaMetrics stack; stop all of it on exit, whatever happened."""
    victoria_bin, vmagent_bin, vmalert_bin, alertmanager_bin = _binaries()
    settings = rules_settings()
    with contextlib.ExitStack() as stack:
        client = httpx.Client(trust_env=False, timeout=10)
        stack.callback(client.close)
        webhook = Webhook()
        stack.callback(webhook.close)
        pods = [_start_pod(stack, workdir, spec, i, settings) for i, spec in enumerate(specs)]
        names = _names_that_split(workdir, vmagent_bin, pods, client)

        victoria = _start_store(stack, workdir, victoria_bin, "victoria-metrics")
        recordings = _start_store(stack, workdir, victoria_bin, "victoria-metrics-recordings")
        shards = []
        for member in range(SHARDS):
            shard = _start_shard(workdir, vmagent_bin, member, workdir / "vmagent.yml",
                                 [store.url + "/api/v1/write" for store in (victoria, recordings)], "shard")
            stack.callback(shard.stop)
            shards.append(shard)

        alertmanager = start_alertmanager(stack, workdir, alertmanager_bin, webhook.url)

        rules = workdir / "specdecode.e2e.rules.yaml"
        write_rules(rules)
        vmalert = start_process("vmalert", lambda port: _vmalert_command(
            vmalert_bin, rules, victoria.url, port, alertmanager.url), workdir, "/health")
        stack.callback(vmalert.stop)
        shipped = workdir / "specdecode.shipped-recordings.yaml"
        write_shipped_rules(shipped, recordings_only=True)
        recorder = start_process("vmalert-recordings", lambda port: _vmalert_command(
            vmalert_bin, shipped, recordings.url, port, None), workdir, "/health")
        stack.callback(recorder.stop)
        yield Fleet(workdir, settings, webhook, pods, names, victoria, shards, vmalert, recordings, recorder,
                    alertmanager, client)
