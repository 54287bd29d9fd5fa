"""Building blocks for end-to-end stacks on loopback: fake vLLMs, a sidecar with a config file, Debian's
Prometheus with given scrape jobs and rules, and a small client for Prometheus' HTTP API.

Each start_* registers the process's stop on the caller's ExitStack, so a stack comes down whatever happens.
devtools.chain builds the alerting chain (with Alertmanager) the same way, from devtools.procs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from devtools.procs import Process, exporter_command, start_process, tail

T = TypeVar("T")
SCRAPE_INTERVAL_S = 1.0


def start_simulator(stack: contextlib.ExitStack, workdir: Path, name: str, *args: str) -> Process:
    """`specdecode-exporter simulate ARGS` on a free port."""
    proc = start_process(name, lambda port: [
        *exporter_command(), "simulate", "--web.listen-address", f"127.0.0.1:{port}", *args], workdir, "/health")
    stack.callback(proc.stop)
    return proc


def start_spec_and_control(stack: contextlib.ExitStack, workdir: Path,
                           scenario: Callable[[bool], Mapping[str, Any]]) -> tuple[Process, Process]:
    """Two simulators of one scenario: ``spec`` with spec decode, ``control`` the same model without it."""
    started = []
    for name, spec_decode in (("spec", True), ("control", False)):
        path = workdir / f"{name}.scenario.yaml"
        path.write_text(yaml.safe_dump(dict(scenario(spec_decode))))
        started.append(start_simulator(stack, workdir, name, "--scenario", str(path)))
    return started[0], started[1]


def start_sidecar(stack: contextlib.ExitStack, workdir: Path, config: Mapping[str, Any],
                  name: str = "sidecar") -> Process:
    """`specdecode-exporter run` with ``config`` as its YAML config file; ready once it answers /healthz."""
    config_file = workdir / f"{name}.yaml"
    config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    proc = start_process(name, lambda port: [
        *exporter_command(), "run", "--config.file", str(config_file), "--web.listen-address", f"127.0.0.1:{port}",
    ], workdir, "/healthz")
    stack.callback(proc.stop)
    return proc


def scrape_job(job: str, targets: Iterable[Process], labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    static: dict[str, Any] = {"targets": [t.url.removeprefix("http://") for t in targets]}
    if labels:
        static["labels"] = dict(labels)
    return {"job_name": job, "static_configs": [static]}


def start_prometheus(stack: contextlib.ExitStack, workdir: Path, binary: str, jobs: Sequence[Mapping[str, Any]],
                     rules: Path | None = None) -> Prometheus:
    """Prometheus scraping ``jobs`` and evaluating ``rules`` every second."""
    interval = f"{SCRAPE_INTERVAL_S:g}s"
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": "900ms"},
        "scrape_configs": [dict(job) for job in jobs],
    }
    if rules is not None:
        config["rule_files"] = [str(rules)]
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = start_process("prometheus", lambda port: [
        binary, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ], workdir, "/-/ready")
    stack.callback(proc.stop)
    prometheus = Prometheus(proc)
    stack.callback(prometheus.client.close)
    return prometheus


@dataclass
class Prometheus:
    """The HTTP API of one Prometheus process."""

    process: Process
    client: httpx.Client = field(default_factory=lambda: httpx.Client(trust_env=False, timeout=10))

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result (vector or matrix entries); ``at`` is a Unix time, default now."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        resp = self.client.get(self.process.url + "/api/v1/query", params=params)
        assert resp.status_code == 200, f"{expr}\n-> {resp.status_code} {resp.text[:300]}"
        body = resp.json()
        assert body.get("status") == "success", f"{expr}\n-> {body}"
        return list(body["data"]["result"])

    def values(self, expr: str, at: float | None = None) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant vector as {sorted labels: value}."""
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in self.query(expr, at)}

    def alerts(self, alertname: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        """Alerts as the rule manager has them now (pending and firing)."""
        body = self.client.get(self.process.url + "/api/v1/alerts").json()
        return [a for a in body["data"]["alerts"]
                if (alertname is None or a["labels"].get("alertname") == alertname)
                and (state is None or a["state"] == state)]


def wait_until(condition: Callable[[], T | None], timeout: float, what: str, processes: Sequence[Process],
               poll: float = 0.5) -> T:
    """condition()'s first truthy result; fails naming ``what`` (with the processes' log tails) after
    ``timeout`` seconds, or at once when one of the processes has exited."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in processes:
            assert proc.alive(), f"{proc.name} exited with {proc.popen.returncode}:\n{tail(proc.log)}"
        with contextlib.suppress(httpx.HTTPError):
            result = condition()
            if result:
                return result
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name} ({p.url}):\n{tail(p.log, 8)}" for p in processes)
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{logs}")
        time.sleep(poll)
