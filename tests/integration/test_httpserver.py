"""The sidecar's HTTP server as a client meets it, over real sockets to the `run` process: its bounds on
connections (a deadline for a request head, a cap on open connections, kept-alive connections idle between
scrapes), FastAPI's extras kept off, and TCP_NODELAY on accepted connections."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from devtools.procs import Process, exporter_command, running
from specdecode_exporter.core.net.httpserver import REQUEST_HEAD_TIMEOUT, ThreadedServer, bind_socket
from tests.faults.hostile import HostileServer, scripted, serve, v1_body
from tests.helpers import read_response

LATE = 5.0  # past the head deadline, how long a cut-off may take on a loaded machine before the test calls it kept


@pytest.fixture(scope="module")
def target() -> Iterator[HostileServer]:
    server = serve(scripted(lambda: v1_body(300, 200)))
    yield server
    server.stop()


@contextlib.contextmanager
def _run(target: HostileServer, workdir: Path, open_files: int | None = None) -> Iterator[Process]:
    """`specdecode-exporter run` collecting ``target``; with ``open_files``, under that descriptor limit."""
    def command(port: int) -> list[str]:
        run = [*exporter_command(), "run", "--target", target.url, "--web.listen-address", f"127.0.0.1:{port}"]
        return run if open_files is None else ["sh", "-c", f'ulimit -n {open_files}; exec "$@"', "sh", *run]

    with running("sidecar", command, workdir, "/healthz") as sidecar:
        yield sidecar


@pytest.fixture(scope="module")
def sidecar(target: HostileServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with _run(target, tmp_path_factory.mktemp("sidecar")) as running_sidecar:
        yield running_sidecar


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _get(conn: socket.socket) -> bytes:
    """GET /healthz on a kept-alive connection: the whole response, head and body."""
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.settimeout(5)
    return read_response(conn)


def test_silent_and_byte_a_second_heads_are_cut_off_while_a_kept_alive_connection_stays(sidecar: Process) -> None:
    """A client that opens a connection and sends nothing, and one that sends a head a byte a second (slowloris),
    each held a descriptor for ever on uvicorn's own timers (its keep-alive timer runs only after a response, and
    any byte cancels it). The sidecar closes both at the head deadline; scrapes are served meanwhile, and a
    kept-alive connection idle since its response outlives the deadline (its bound is the 75 s idle one)."""
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60
    with _connect(sidecar.url) as silent, _connect(sidecar.url) as slow, _connect(sidecar.url) as kept, \
            httpx.Client(timeout=5) as client:
        assert _get(kept).startswith(b"HTTP/1.1 200")
        opened, cut = time.monotonic(), {}
        sent = 0
        while len(cut) < 2 and time.monotonic() - opened < REQUEST_HEAD_TIMEOUT + LATE:
            if "slow" not in cut:
                try:
                    slow.sendall(head[sent:sent + 1])
                    sent += 1
                except (BrokenPipeError, ConnectionResetError):
                    cut["slow"] = time.monotonic() - opened
            for name, sock in (("silent", silent), ("slow", slow)):
                if name not in cut and _closed_by_server(sock, 0.01):
                    cut[name] = time.monotonic() - opened
            assert client.get(sidecar.url + "/healthz").text == "ok\n"
            time.sleep(1.0)
        assert sorted(cut) == ["silent", "slow"], f"still open after {time.monotonic() - opened:.0f}s: {cut}"
        assert all(seconds >= REQUEST_HEAD_TIMEOUT - 0.5 for seconds in cut.values()), cut  # not before the bound
        assert sent < len(head)  # cut off before its head was complete
        assert _get(kept).startswith(b"HTTP/1.1 200")  # the same kept-alive connection, served again


def test_connections_past_the_cap_are_answered_503_as_they_open(target: HostileServer, tmp_path: Path) -> None:
    """Under a descriptor limit of 64 the sidecar holds at most 32 connections; the next one is answered 503 and
    closed at once (uvicorn's limit_concurrency would answer only once a head came, so a flood of silent
    connections would take every descriptor); a place freed is used again."""
    with _run(target, tmp_path, open_files=64) as sidecar:
        held = [_connect(sidecar.url) for _ in range(32)]
        try:
            for conn in held:  # each one accepted and served
                assert _get(conn).startswith(b"HTTP/1.1 200")
            with _connect(sidecar.url) as extra:
                extra.settimeout(5)
                answer = extra.recv(4096)
                assert answer.startswith(b"HTTP/1.1 503") and answer.endswith(b"too many connections\n")
                assert _closed_by_server(extra, 5)
            held.pop().close()
            deadline = time.monotonic() + 10
            while True:  # the sidecar sees the close a moment later
                with _connect(sidecar.url) as again:
                    answer = _get(again)
                if answer.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert answer.startswith(b"HTTP/1.1 200")
        finally:
            for conn in held:
                conn.close()


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect", "/metrics/"])
def test_no_api_documentation_and_no_trailing_slash_redirect(sidecar: Process, path: str) -> None:
    """FastAPI serves /docs, /redoc and /openapi.json unless told not to, and redirects /metrics/ to a Location
    built from the client's Host header; the sidecar does neither, and answers a 404 in plain text."""
    response = httpx.get(sidecar.url + path, headers={"Host": "evil.example"}, timeout=5)
    assert response.status_code == 404 and "location" not in response.headers
    assert response.text == "Not Found" and response.headers["content-type"].startswith("text/plain")


def test_the_endpoints_answer_get_and_head_with_a_date(sidecar: Process) -> None:
    with httpx.Client(timeout=5) as client:
        for path in ("/healthz", "/metrics", "/api/v1/status", "/"):
            assert client.head(sidecar.url + path).status_code == 200, path
        response = client.get(sidecar.url + "/healthz")
        assert client.get(sidecar.url + "/-/reload").status_code == 405  # reload is a POST
    served = email.utils.parsedate_to_datetime(response.headers["date"])
    assert response.headers["date"].endswith("GMT") and abs(served.timestamp() - time.time()) < 60


def test_accepted_connections_have_nodelay() -> None:
    """asyncio (and so uvicorn) sets TCP_NODELAY only on sockets created with proto=TCP. Without it each
    response on a kept-alive connection, headers and body written separately, waited ~40 ms for the
    client's delayed ACK: every Prometheus scrape and every probe."""
    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        listener = bind_socket()
        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        async with server:
            host, port = listener.getsockname()[:2]
            _, writer = await asyncio.open_connection(host, port)
            try:
                return await asyncio.wait_for(accepted, 5)
            finally:
                writer.close()

    with bind_socket() as sock:
        assert sock.proto == socket.IPPROTO_TCP
    assert asyncio.run(main()) != 0


def test_a_threaded_server_without_a_lifespan_starts_serves_and_stops() -> None:
    """The demo's and the tests' server: start() returns once it serves, stop() ends its thread."""
    async def root(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    server = ThreadedServer(Starlette(routes=[Route("/", root)]), bind_socket(), lifespan="off",
                            name="threaded-stop").start()
    try:
        assert httpx.get(server.base_url + "/", timeout=5).text == "ok"
    finally:
        server.stop(timeout=10.0)
    assert "threaded-stop" not in {thread.name for thread in threading.enumerate()}
