"""Start and stop the real processes the footprint/scale/render benches measure."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx

from devtools.procs import running

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
EXPORTER_BIN = VENV_BIN / "specdecode-exporter"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECODE_")}
    # The child must import the same exporter package as this process (PYTHONPATH may point at a patched tree).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    return env


@contextlib.contextmanager
def static_server(*bodies: bytes) -> Iterator[str]:
    """Yields the base URL of a static exposition server (every path serves the body; given several, each fetch
    the next, the last one once they are used up)."""
    with tempfile.TemporaryDirectory(prefix="bench-static-") as tmp:
        files = []
        for i, body in enumerate(bodies):
            path = Path(tmp) / f"body{i}.prom"
            path.write_bytes(body)
            files += ["--file", str(path)]
        with running("static-server", lambda port: [
            sys.executable, "-m", "bench.static_server", *files, "--port", str(port),
        ], Path(tmp), "/-/stats", timeout=20, env=_env()) as proc:
            yield proc.url


def fetch_stats(base: str) -> dict[str, list[float]]:
    stats: dict[str, list[float]] = httpx.get(base + "/-/stats", timeout=30, trust_env=False).json()
    return stats


@contextlib.contextmanager
def sidecar(urls: list[str], interval: str = "5s", windows: str = "1m,5m,15m,1h",
            extra: dict[str, object] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The real sidecar process (`specdecode-exporter run --config.file`) on a free port."""
    collect: dict[str, object] = {"interval": interval, **(extra or {})}
    config = {
        "collect": collect,
        "windows": windows.split(","),
        "targets": [{"name": f"t{i}", "url": u, "timeout": "3s"} for i, u in enumerate(urls)],
    }
    with tempfile.TemporaryDirectory(prefix="bench-sidecar-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        with running("sidecar", lambda port: [
            str(EXPORTER_BIN), "run", "--config.file", str(path), "--web.listen-address", f"127.0.0.1:{port}",
            "--log.level", "error",
        ], Path(tmp), "/healthz", timeout=20, env=_env()) as proc:
            yield proc.popen, proc.url
