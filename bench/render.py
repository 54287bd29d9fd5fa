"""Bench 2: the sidecar's own /metrics — wrk throughput, p99 while collecting (the in-process render: serve.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass

from bench.procs import sidecar, static_server

WRK_LATENCY = re.compile(r"^\s+(50|99)(?:\.000)?%\s+([\d.]+)(us|ms|s)\s*$", re.M)
WRK_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass
class WrkRun:
    rps: float
    p50: float
    p99: float


def wrk(url: str, seconds: int, connections: int = 8, threads: int = 2, headers: tuple[str, ...] = ()) -> WrkRun:
    flags = [arg for header in headers for arg in ("-H", header)]
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", *flags, url],
                         capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    lat = {p: float(v) * _UNIT[u] for p, v, u in WRK_LATENCY.findall(out)}
    rps = WRK_RPS.search(out)
    nan = float("nan")
    return WrkRun(float(rps.group(1)) if rps else nan, lat.get("50", nan), lat.get("99", nan))


@dataclass
class ServeResult:
    healthz: WrkRun
    metrics_idle: WrkRun
    metrics_gzip: WrkRun  # idle, as Prometheus asks: Accept-Encoding: gzip
    metrics_busy: WrkRun
    plain_kib: float  # /metrics body as sent, identity
    gzip_kib: float  # and gzipped
    busy_collect_duty: float  # share of wall time the sidecar spent collecting during the busy run


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def bench_serve(seconds: int, body: bytes) -> ServeResult:
    """The real sidecar over loopback. Idle: interval 1h (one collection, then none during wrk).
    Busy: interval 0.25 s against a ~1 MB exposition, so a collection is running much of the time."""
    with static_server(body) as base:
        url = base + "/metrics"
        with sidecar([url], interval="1h") as (_, side):
            _wait_up(side)
            plain_kib, gzip_kib = _body_kib(side, "identity"), _body_kib(side, "gzip")
            healthz = wrk(side + "/healthz", seconds)
            idle = wrk(side + "/metrics", seconds)
            gzipped = wrk(side + "/metrics", seconds, headers=("Accept-Encoding: gzip",))
        with sidecar([url], interval="250ms") as (_, side):
            _wait_up(side)
            from bench.procs import fetch_stats

            before = len(fetch_stats(base).get("/metrics", []))
            t0 = time.monotonic()
            busy = wrk(side + "/metrics", seconds)
            span = time.monotonic() - t0
            collections = len(fetch_stats(base).get("/metrics", [])) - before
            duration = _collect_duration(side)
    return ServeResult(healthz, idle, gzipped, busy, plain_kib, gzip_kib, min(1.0, collections * duration / span))


def _body_kib(side: str, encoding: str) -> float:
    import httpx

    with httpx.stream("GET", side + "/metrics", headers={"Accept-Encoding": encoding}, timeout=10,
                      trust_env=False) as response:
        return len(b"".join(response.iter_raw())) / 1024


def _wait_up(side: str, timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(side + "/metrics", timeout=5, trust_env=False).text
        if re.search(r"^specdecode_up\{[^}]*\} 1\.0$", text, re.M):
            return
        time.sleep(0.2)
    raise RuntimeError("sidecar never collected its target")


def _collect_duration(side: str) -> float:
    import httpx

    text = httpx.get(side + "/metrics", timeout=5, trust_env=False).text
    m = re.search(r"^specdecode_collect_duration_seconds\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")
