"""Start and stop the real processes the footprint/scale/render benches measure."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.common import free_port

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
EXPORTER_BIN = VENV_BIN / "specdecode-exporter"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The child must import the same exporter package as this process (PYTHONPATH may point at a patched tree).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    return env


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=1.0, trust_env=False)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def static_server(body: bytes) -> Iterator[str]:
    """Yields the base URL of a static exposition server (every path serves ``body``)."""
    with tempfile.NamedTemporaryFile(prefix="bench-body-", suffix=".prom", delete=False) as f:
        f.write(body)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.static_server", "--file", f.name, "--port", str(port)],
                            env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/-/stats")
        yield base
    finally:
        stop(proc)
        os.unlink(f.name)


def fetch_stats(base: str) -> dict[str, list[float]]:
    return httpx.get(base + "/-/stats", timeout=30, trust_env=False).json()


@contextlib.contextmanager
def sidecar(urls: list[str], interval: str = "5s", windows: str = "1m,5m,15m,1h",
            extra: dict[str, object] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The real sidecar process (`specdecode-exporter run --config.file`) on a free port."""
    port = free_port()
    collect: dict[str, object] = {"interval": interval, **(extra or {})}
    config = {
        "collect": collect,
        "windows": windows.split(","),
        "targets": [{"name": f"t{i}", "url": u, "timeout": "3s"} for i, u in enumerate(urls)],
    }
    with tempfile.NamedTemporaryFile("w", prefix="bench-sidecar-", suffix=".yaml", delete=False) as f:
        json.dump(config, f)  # JSON is YAML
    proc = subprocess.Popen([str(EXPORTER_BIN), "run", "--config.file", f.name,
                             "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "error"],
                            env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(base + "/healthz")
        except RuntimeError:
            stop(proc)
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"sidecar did not start: {err}") from None
        yield proc, base
    finally:
        stop(proc)
        os.unlink(f.name)
