"""Connections that never finish a request head, too many connections, and uvicorn's messages in the log."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from devtools.procs import exporter_command, running
from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.core.process.log import setup_logging
from tests.helpers import read_response

BOUND = 0.6  # the request-head deadline these tests run with (10 s in the sidecar)


def _app() -> Starlette:
    async def root(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def slow_echo(request: Request) -> PlainTextResponse:
        body = await request.body()
        await asyncio.sleep(2 * BOUND)
        return PlainTextResponse(body.decode())

    return Starlette(routes=[Route("/", root), Route("/slow", slow_echo, methods=["POST"])])


def _connect(server: ThreadedServer) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def server() -> Iterator[ThreadedServer]:
    with ThreadedServer(_app(), bind_socket(), lifespan="off", name="bounds", head_timeout=BOUND).start() as running:
        yield running


def test_a_silent_connection_is_closed_within_the_bound_while_scrapes_answer(server: ThreadedServer) -> None:
    """Without the deadline uvicorn kept a connection that sent nothing open for ever."""
    started = time.monotonic()
    with _connect(server) as idle, httpx.Client() as client:
        assert client.get(server.base_url + "/").text == "ok"  # another connection is served meanwhile
        assert _closed_by_server(idle, BOUND + 2)
        assert time.monotonic() - started < BOUND + 1.5
        assert client.get(server.base_url + "/").text == "ok"


def test_a_byte_every_fifth_of_a_second_does_not_reset_the_deadline(server: ThreadedServer) -> None:
    """uvicorn cancels its keep-alive timeout on the first byte: a slowloris client stayed for ever."""
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    started, closed = time.monotonic(), False
    with _connect(server) as slow, httpx.Client() as client:
        for byte in head:
            try:
                slow.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if _closed_by_server(slow, 0.2):
                closed = True
                break
            assert client.get(server.base_url + "/").text == "ok"
            if time.monotonic() - started > BOUND + 3:
                break
    assert closed and time.monotonic() - started < BOUND + 1.5


def test_the_deadline_runs_again_from_the_first_byte_of_each_next_head(server: ThreadedServer) -> None:
    with _connect(server) as conn:
        for _ in range(2):  # a kept-alive connection is served as long as each head comes in time
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(conn).startswith(b"HTTP/1.1 200")
            time.sleep(BOUND / 3)
        begun = time.monotonic()
        conn.sendall(b"GET / HTTP/1.1\r\n")  # then half a head, and nothing more
        assert _closed_by_server(conn, BOUND + 2)
        assert BOUND - 0.1 < time.monotonic() - begun < BOUND + 1.5


def test_a_request_body_is_not_taken_for_the_next_head(server: ThreadedServer) -> None:
    """The body a head's Content-Length announces is skipped, not timed as the next head: a POST whose body
    comes in two writes and whose answer takes longer than the head bound is answered, and the connection
    then idles past the bound and is served again."""
    with _connect(server) as conn:
        conn.sendall(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello")
        time.sleep(BOUND / 3)
        conn.sendall(b" world")
        answer = read_response(conn)
        assert answer.startswith(b"HTTP/1.1 200")
        time.sleep(2 * BOUND)
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(conn).startswith(b"HTTP/1.1 200")


def test_a_kept_alive_connection_idles_past_the_head_bound_until_the_idle_bound() -> None:
    """Prometheus scrapes a pod every 15-60 s over one kept-alive connection: between a response and the next
    request the connection may idle longer than a head may take (uvicorn's 5 s closed it before every scrape)."""
    idle = 2  # seconds: uvicorn's timeout_keep_alive is a whole number
    with ThreadedServer(_app(), bind_socket(), lifespan="off", name="idle", head_timeout=BOUND,
                        idle_timeout=idle).start() as server, _connect(server) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(conn).startswith(b"HTTP/1.1 200")
        time.sleep(2 * BOUND)  # longer than a head may take (1.2 s), shorter than the idle bound
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(conn).startswith(b"HTTP/1.1 200")  # served on the same connection
        answered = time.monotonic()
        assert _closed_by_server(conn, idle + 2)  # and closed once idle for the idle bound
        assert idle - 0.1 < time.monotonic() - answered < idle + 1.5


def test_the_sidecar_serves_scrapes_15_s_apart_over_one_connection(tmp_path: Path) -> None:
    """The real process, as Prometheus scrapes it: one connection, a scrape, 15 s idle (a common scrape interval,
    past the 10 s head bound and uvicorn's 5 s), a scrape on the same connection."""
    with running("simulator", lambda p: [*exporter_command(), "simulate", "--web.listen-address",
                                         f"127.0.0.1:{p}"], tmp_path, "/health") as simulator, \
            running("sidecar", lambda p: [*exporter_command(), "run", "--target", f"{simulator.url}/metrics",
                                          "--web.listen-address", f"127.0.0.1:{p}"], tmp_path, "/healthz") as sidecar:
        host, port = sidecar.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            for pause in (15.0, 0.0):
                conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
                assert read_response(conn).startswith(b"HTTP/1.1 200")
                time.sleep(pause)


def test_connections_past_the_cap_are_turned_away_at_accept() -> None:
    with ThreadedServer(_app(), bind_socket(), lifespan="off", name="cap", head_timeout=BOUND,
                        max_connections=2).start() as server:
        held = [_connect(server), _connect(server)]
        time.sleep(0.2)  # both accepted
        with _connect(server) as extra:
            extra.settimeout(2)
            assert extra.recv(4096).startswith(b"HTTP/1.1 503")
            assert _closed_by_server(extra, 2)
        for sock in held:
            sock.close()
        time.sleep(0.2)
        assert httpx.get(server.base_url + "/").text == "ok"  # a freed place is used again


def test_an_invalid_request_is_logged_once(server: ThreadedServer, capsys: pytest.CaptureFixture[str]) -> None:
    """A handler on both "uvicorn" and "uvicorn.error" (which propagates to it) printed each message twice."""
    names = ("specdecode_exporter", "uvicorn", "uvicorn.error")
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level) for name in names}
    try:
        setup_logging("info", "logfmt")
        with _connect(server) as conn:
            conn.sendall(b"garbage\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 400")
        time.sleep(0.2)
        err = capsys.readouterr().err
    finally:
        for name, (handlers, level) in saved.items():
            logging.getLogger(name).handlers[:] = handlers
            logging.getLogger(name).setLevel(level)
    assert err.count("Invalid HTTP request received.") == 1, err
