"""Start and stop the real processes the footprint/scale/render benches measure."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from devtools.procs import running

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
                     "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")  # Prometheus 2.x's header
ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
EXPORTER_BIN = VENV_BIN / "specdecode-exporter"


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECODE_")}
    # The child must import the same exporter package as this process (PYTHONPATH may point at a patched tree).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    return env


@contextlib.contextmanager
def static_server(*bodies: bytes) -> Iterator[str]:
    """Yields the base URL of a static exposition server (every path serves the body; given several, each path
    serves them in turn: a moving target)."""
    with tempfile.TemporaryDirectory(prefix="bench-static-") as tmp:
        files: list[str] = []
        for i, body in enumerate(bodies):
            path = Path(tmp) / f"body{i}.prom"
            path.write_bytes(body)
            files += ["--file", str(path)]
        with running("static-server", lambda port: [
            sys.executable, "-m", "bench.static_server", *files, "--port", str(port),
        ], Path(tmp), "/-/stats", timeout=20, env=child_env()) as proc:
            yield proc.url


def fetch_stats(base: str) -> dict[str, list[float]]:
    stats: dict[str, list[float]] = httpx.get(base + "/-/stats", timeout=30, trust_env=False).json()
    return stats


@contextlib.contextmanager
def sidecar(urls: list[str], interval: str = "5s", windows: str = "1m,5m,15m,1h",
            extra: dict[str, object] | None = None, command: list[str] | None = None,
            ) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The real sidecar process (`specdecode-exporter run --config.file`) on a free port. ``command``: what runs
    `run …` instead of the installed script (a wrapper that takes the same arguments)."""
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
            *(command or [str(EXPORTER_BIN)]), "run", "--config.file", str(path),
            "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "error",
        ], Path(tmp), "/healthz", timeout=20, env=child_env()) as proc:
            yield proc.popen, proc.url


class Scraper:
    """GET /metrics every ``interval`` seconds as Prometheus does, while running."""

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval = url, interval
        self.latencies: list[float] = []
        self.kib = 0.0
        self.failures = 0  # timed out (10 s, Prometheus' default scrape_timeout) or refused
        self.running = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
        # Prometheus keeps its scrape connections open between scrapes; httpx would drop one idle for 5 s.
        with httpx.Client(trust_env=False, timeout=10, limits=httpx.Limits(keepalive_expiry=300)) as client:
            while not self._stop.wait(self.interval):
                if not self.running.is_set():
                    continue
                t0 = time.perf_counter()
                try:
                    with client.stream("GET", self.url, headers=headers) as response:
                        size = sum(len(chunk) for chunk in response.iter_raw())
                except httpx.HTTPError:
                    self.failures += 1
                    continue
                self.latencies.append(time.perf_counter() - t0)
                self.kib = size / 1024

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)
