"""Shared test helpers: a fake clock, a parsed view of an exposition, a simulator + sidecar harness."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.procs import in_ci
from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.sidecar.collection import Exporter, TargetView
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.sidecar.web import build_app
from specdecode_exporter.simulator import ModelSpec, Scenario, Simulator, steady_scenario
from specdecode_exporter.simulator.clock import ManualClock
from specdecode_exporter.simulator.server import serve_in_thread

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


FakeClock = ManualClock


Key = tuple[str, frozenset[tuple[str, str]]]


def require_tool(path: str | None, what: str, install: str = "scripts/install-tools.sh") -> str:
    """The tool's path. Without it the test is skipped here and fails in CI, where `make test` installs it."""
    if path is None:
        message = f"{what} not found: run {install}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path

@dataclass
class Exposition:
    """Samples parsed with prometheus_client's own parser (independent of ours)."""

    samples: dict[Key, float] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Exposition:
        result = cls()
        for family in text_string_to_metric_families(text):
            result.types[family.name] = family.type
            result.helps[family.name] = family.documentation
            for sample in family.samples:
                result.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return result

    def get(self, name: str, **labels: str) -> float | None:
        """The one sample of ``name`` whose labels include ``labels``; None if absent, error if ambiguous."""
        found = self.all(name, **labels)
        assert len(found) <= 1, f"{name}{labels} is ambiguous: {found}"
        return next(iter(found.values()), None)

    def all(self, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
        wanted = set(labels.items())
        return {lbl: v for (n, lbl), v in self.samples.items() if n == name and wanted <= lbl}


@dataclass
class Harness:
    """A simulator and a sidecar, both over real loopback HTTP, sharing one fake clock.

    The test drives collection explicitly (``step``), so timing is exact and the test is fast.
    """

    simulator: Simulator
    exporter: Exporter
    clock: FakeClock
    simulator_url: str
    sidecar_url: str
    _stops: list[object]

    def collect(self) -> TargetView:
        async def once() -> TargetView:
            async with httpx.AsyncClient(trust_env=False) as client:
                (view,) = await self.exporter.collect_all_once(client)
            return view

        return asyncio.run(once())

    def step(self, seconds: float) -> TargetView:
        self.clock.advance(seconds)
        return self.collect()

    def metrics(self) -> Exposition:
        response = httpx.get(self.sidecar_url + "/metrics", timeout=5)
        response.raise_for_status()
        return Exposition.parse(response.text)

    def status(self) -> dict[str, object]:
        return httpx.get(self.sidecar_url + "/api/v1/status", timeout=5).json()

    def stop_simulator(self) -> None:
        """The simulated vLLM goes away; the sidecar keeps serving."""
        self._stops.pop().stop()  # type: ignore[attr-defined]  # started last

    def stop(self) -> None:
        for server in self._stops:
            server.stop()  # type: ignore[attr-defined]


def start_harness(scenario: Scenario | None = None, *, windows: str = "1m,5m", interval: float = 5.0,
                  target: TargetConfig | None = None, url_path: str = "/metrics", hang_seconds: float = 600.0,
                  **config: object) -> Harness:
    clock = FakeClock()
    simulator = Simulator(scenario or steady_scenario(ModelSpec()), clock=clock, hang_seconds=hang_seconds)
    sim_server, sim_url = serve_in_thread(simulator)
    target = target or TargetConfig(name="vllm", url=sim_url + url_path, timeout=2.0)
    collect = {key: config.pop(key) for key in list(config) if key in {f.name for f in fields(CollectSection)}}
    cfg = Config(targets=(target,), windows=parse_windows(windows, "windows"),
                 collect=CollectSection(interval=interval, **collect),  # type: ignore[arg-type]
                 **config)  # type: ignore[arg-type]
    exporter = Exporter(cfg, clock=clock)
    sidecar = ThreadedServer(build_app(exporter, run_collection=False), bind_socket(), name="sidecar").start()
    return Harness(simulator, exporter, clock, sim_url, sidecar.base_url, [sidecar, sim_server])


def harness_fixture(harness: Harness) -> Iterator[Harness]:
    try:
        yield harness
    finally:
        harness.stop()


HELP_MAX_CHARS = 120
# A sentence ends at '.', '!' or '?' followed by a space and a character that is not lower case; "i.i.d. per-token"
# and "e.g. k" do not end one.
AFTER_A_STOP = re.compile(r"[.!?] +(\S)")


def help_text_problems(text: str) -> list[str]:
    """Why a HELP text (what follows the metric name) is not one sentence of at most HELP_MAX_CHARS characters: it
    must end with a full stop, hold no sentence end before that, and no ';' (two sentences joined). Empty if it is."""
    problems = []
    if len(text) > HELP_MAX_CHARS:
        problems.append(f"{len(text)} characters, over {HELP_MAX_CHARS}")
    if not text.endswith("."):
        problems.append("does not end with a full stop")
    if ";" in text:
        problems.append("';' joins two sentences")
    problems.extend(f"a second sentence: {text[match.start(1):match.start(1) + 24]!r}…"
                    for match in AFTER_A_STOP.finditer(text) if not match.group(1).islower())
    return problems


def read_response(conn: socket.socket) -> bytes:
    """One whole HTTP/1.1 response from a kept-alive connection: the head and its Content-Length body, which may come
    in a later segment (reading only the head would leave the body to be taken for the next response)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"closed before the response head, after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
               if line.lower().startswith(b"content-length:")]
    while lengths and len(body) < lengths[0]:
        chunk = conn.recv(65536)
        assert chunk, "closed within the body"
        body += chunk
    return data[:len(head) + 4] + body


@contextlib.contextmanager
def exposition_server(answer: Callable[[], bytes]) -> Iterator[str]:
    """A vLLM-like /metrics on loopback, each GET answered with ``answer()`` (called on the request's own thread, so
    it may block); yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = answer()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
