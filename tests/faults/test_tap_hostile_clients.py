"""Hostile clients of the request tap, against the real sidecar process and a real uvicorn upstream (the
simulator's vLLM API): garbage, an endless head, a body cut short, a connection flood. Each gets what vLLM's own
server would answer (a 400) or a closed connection; the sidecar neither crashes nor leaks connections, and
the next honest client is served and counted."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from devtools.procs import Process, exporter_command, free_port, running, tail
from tests.helpers import Exposition

pytestmark = pytest.mark.timeout(120)


class Tapped:
    def __init__(self, sidecar: Process, tap_port: int) -> None:
        self.sidecar = sidecar
        self.tap_port = tap_port

    def raw(self, data: bytes, read: bool = True) -> bytes:
        """Send bytes on a fresh connection; the reply until the tap closes it or 3 s pass."""
        with socket.create_connection(("127.0.0.1", self.tap_port), timeout=3) as conn:
            conn.sendall(data)
            if not read:
                return b""
            reply = b""  # no half-close: like uvicorn, the tap takes a client's EOF for a disconnect
            with contextlib.suppress(TimeoutError, ConnectionError):
                while chunk := conn.recv(65536):
                    reply += chunk
            return reply

    def metrics(self) -> Exposition:
        return Exposition.parse(httpx.get(f"{self.sidecar.url}/metrics", timeout=5).text)

    def total(self, name: str, **labels: str) -> float:
        return sum(self.metrics().all(name, **labels).values())

    def honest_request(self) -> dict[str, object]:
        body = {"prompt": "hello", "max_tokens": 8}
        response = httpx.post(f"http://127.0.0.1:{self.tap_port}/v1/completions", json=body, timeout=10)
        response.raise_for_status()
        result: dict[str, object] = response.json()
        return result


@pytest.fixture(scope="module")
def tapped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tapped]:
    tmp = tmp_path_factory.mktemp("hostile-tap")
    cli, tap_port = exporter_command(), free_port()
    with running("simulator", lambda p: [*cli, "simulate", "--web.listen-address", f"127.0.0.1:{p}",
                                         "--acceptance-rate", "0.7", "--pace", "false"], tmp, "/health") as sim, \
            running("sidecar", lambda p: [*cli, "run", "--target", f"{sim.url}/metrics", "--web.listen-address",
                                          f"127.0.0.1:{p}", "--tap.listen-address", f"127.0.0.1:{tap_port}"],
                    tmp, "/healthz") as sidecar:
        yield Tapped(sidecar, tap_port)
        assert sidecar.alive(), tail(sidecar.log)
        assert "Traceback" not in sidecar.log.read_text(), tail(sidecar.log, 40)


def test_garbage_gets_the_upstreams_400(tapped: Tapped) -> None:
    reply = tapped.raw(b"\x00\xff\xfeNOT HTTP AT ALL\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]


def test_an_endless_head_is_cut_by_the_upstream_not_buffered_by_the_tap(tapped: Tapped) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nhost: a\r\n" + b"x-pad: " + b"a" * (256 * 1024)
    reply = tapped.raw(head)
    assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply[:200]


def test_a_body_cut_short_is_not_a_request(tapped: Tapped) -> None:
    """The tap holds an inspected body until it is whole: cut short, nothing of it reached vLLM, so nothing is
    counted, and its connection is gone."""
    before = tapped.metrics().samples
    head = b"POST /v1/completions HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n"
    tapped.raw(head + b'{"prompt": "a", "max_tokens"', read=False)
    deadline = time.monotonic() + 5
    while tapped.total("specdecode_tap_connections") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    after = tapped.metrics()
    assert tapped.total("specdecode_tap_connections") == 0
    for name in ("specdecode_requests_total", "specdecode_requests_without_spec_metrics_total"):
        assert after.all(name) == {lbl: v for (n, lbl), v in before.items() if n == name}


def test_a_connection_flood_leaves_no_connection_behind(tapped: Tapped) -> None:
    sockets = [socket.create_connection(("127.0.0.1", tapped.tap_port), timeout=3) for _ in range(200)]
    for i, conn in enumerate(sockets):
        if i % 2:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: a\r\n")  # half a head, then gone
        conn.close()
    deadline = time.monotonic() + 10
    while (tapped.total("specdecode_tap_connections")) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tapped.total("specdecode_tap_connections") == 0


def test_an_honest_client_is_served_and_counted_after_all_that(tapped: Tapped) -> None:
    before = tapped.total("specdecode_requests_total")
    answer = tapped.honest_request()
    assert answer["object"] == "text_completion"
    deadline = time.monotonic() + 5
    while (tapped.total("specdecode_requests_total")) <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tapped.total("specdecode_requests_total") == before + 1


def test_the_sidecar_log_names_no_client_bytes(tapped: Tapped) -> None:
    """Headers and bodies are never logged: nothing the hostile clients sent shows up in the sidecar's log."""
    log = tapped.sidecar.log.read_text()
    assert "NOT HTTP AT ALL" not in log and "x-pad" not in log and "max_tokens" not in log
