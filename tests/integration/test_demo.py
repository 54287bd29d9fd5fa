"""`make demo` runs `specdecode-exporter demo`: within a minute its status page must show what the product is
for — α, the speedup measured against the control pod, and per-request α by workload and temperature band from
the traffic it sends through the tap — and Ctrl-C or SIGTERM must stop all of it cleanly, however it was started."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from typing import Any

import httpx
import pytest

from devtools.procs import child_env, exporter_command, free_port, ignoring_sigint

pytestmark = pytest.mark.timeout(120)


def ready(status: dict[str, Any]) -> bool:
    spec = next(t for t in status["targets"] if t["name"] == "simulated-vllm")
    series = spec["series"][0] if spec["series"] else {}
    window = series.get("windows", {}).get("1m", {})
    requests = spec.get("requests") or {"bands": []}
    return bool(window.get("observed_speedup") and len({(b["workload"], b["temperature"]) for b in requests["bands"]})
                == 6)


def start_demo(port: int) -> subprocess.Popen[str]:
    """As `make demo &` would: a background job of a shell, SIGINT ignored (inherited)."""
    return subprocess.Popen(ignoring_sigint([*exporter_command(), "demo", "--web.listen-address",
                                             f"127.0.0.1:{port}", "--duration", "5m"]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())


def tapped(status: dict[str, Any]) -> bool:
    spec = next(t for t in status["targets"] if t["name"] == "simulated-vllm")
    return bool((spec.get("requests") or {"bands": []})["bands"])


def test_the_demo_shows_alpha_observed_speedup_and_request_bands() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_demo(port)
    try:
        deadline, status = time.monotonic() + 60, {}  # the README's promise: in a minute
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                status = httpx.get(f"{base}/api/v1/status", timeout=5).json()
                if ready(status):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert ready(status), status
        page = httpx.get(f"{base}/", timeout=5).text
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    spec = next(t for t in status["targets"] if t["name"] == "simulated-vllm")
    control = next(t for t in status["targets"] if t["name"] == "control")
    assert spec["up"] and control["up"] and control["spec_decode"] is False
    series = spec["series"][0]
    assert series["verdict_basis"] == "observed"
    assert 'against the control target "control"' in series["verdict_reason"], series["verdict_reason"]
    assert 0.3 < series["windows"]["1m"]["acceptance_ratio"] < 0.95
    bands = {(b["workload"], b["temperature"]): b["acceptance_ratio"] for b in spec["requests"]["bands"]}
    # As docs/demo.md says: two workloads, each at temperatures 0, 0.5 and 1 (one per default band).
    assert set(bands) == {(w, t) for w in ("chat", "code") for t in ("0-0.3", "0.3-0.7", "0.7+")}
    assert bands[("code", "0-0.3")] > bands[("code", "0.7+")], "hotter requests accept less in the simulator"
    assert "request tap" in out and "Traceback" not in out
    for text in ("observed", "code", "0.7+", "counted since the sidecar started", "α since start"):
        assert text in page, text
    # Both speedups, labelled (the page was fetched after the status: a collection may have come in between).
    assert re.search(r"\d\.\d\d× observed<br>\d\.\d\d× modelled", page), page


def test_sigterm_stops_the_demo_as_ctrl_c_does() -> None:
    """What Kubernetes, systemd or `kill` send: the same clean stop, exit 0, every server closed."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_demo(port)
    try:
        assert proc.stdout is not None
        urls = {}
        for line in proc.stdout:  # the demo prints its URLs once everything listens
            name, _, url = line.strip().partition("  ")
            if url.strip().startswith("http://"):
                urls[name] = url.split()[0]
            if "request tap" in urls:
                break
        while not tapped(httpx.get(f"{base}/api/v1/status", timeout=5).json()):
            time.sleep(0.2)  # until requests went through the tap
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "request tap stopped" in out and "Traceback" not in out
    for url in (base, *urls.values()):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url, timeout=5)
