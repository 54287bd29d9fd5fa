"""The tap's old names on the `run` process (the simulator behind it, real loopback HTTP): a config that still says
proxy (its file section, a --proxy.* flag, a SPECDECODE_PROXY_* variable) runs the tap as tap.* would, and logs one
warning line per old name, naming the new one, at the start and again at each reload, never in between."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.procs import Process, exporter_command, free_port, running
from tests.helpers import Exposition

WARNINGS = {  # the old name → the new one its line must name
    "the config file's section proxy": "call it tap",
    "--proxy.listen-address": "use --tap.listen-address",
    "SPECDECODE_PROXY_CLASS_HISTOGRAMS": "use SPECDECODE_TAP_CLASS_HISTOGRAMS",
}


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[Process]:
    with running("simulator", lambda p: [*exporter_command(), "simulate", "--web.listen-address",
                                         f"127.0.0.1:{p}", "--acceptance-rate", "0.7", "--pace", "false"],
                 tmp_path, "/health") as sim:
        yield sim


def deprecation_lines(sidecar: Process) -> list[str]:
    return [line for line in sidecar.log.read_text().splitlines() if "deprecated setting name" in line]


def test_the_old_names_run_the_tap_and_warn_once_per_start_and_reload(simulator: Process, tmp_path: Path) -> None:
    tap_port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(f"targets: [{{name: vllm, url: '{simulator.url}/metrics'}}]\n"
                      "proxy: {workload_header: x-team}\n")
    command = [*exporter_command(), "run", "--config.file", str(config), "--proxy.listen-address",
               f"127.0.0.1:{tap_port}"]
    env = {"SPECDECODE_PROXY_CLASS_HISTOGRAMS": "true"}
    with running("sidecar", lambda port: [*command, "--web.listen-address", f"127.0.0.1:{port}"], tmp_path,
                 "/healthz", env=env) as sidecar:
        started = deprecation_lines(sidecar)
        httpx.post(f"http://127.0.0.1:{tap_port}/v1/completions", headers={"x-team": "search"}, timeout=10,
                   json={"prompt": "hello", "max_tokens": 8}).raise_for_status()
        page = Exposition.parse(httpx.get(f"{sidecar.url}/metrics", timeout=5).text)
        # The three old names took effect: the tap listens where --proxy.listen-address says, labels by the file's
        # proxy.workload_header, and its histograms are by class as SPECDECODE_PROXY_CLASS_HISTOGRAMS asks.
        assert sum(page.all("specdecode_requests_total", workload="search").values()) == 1
        assert page.all("specdecode_request_acceptance_ratio_count", workload="search")
        assert deprecation_lines(sidecar) == started  # nothing more while it runs
        reload = httpx.post(f"{sidecar.url}/-/reload", timeout=10)
        assert reload.status_code == 200, reload.text
        reloaded = deprecation_lines(sidecar)[len(started):]
    for lines in (started, reloaded):
        assert len(lines) == len(WARNINGS), lines
        for old, new in WARNINGS.items():
            (line,) = [line for line in lines if old in line]
            assert new in line and "level=warn" in line
