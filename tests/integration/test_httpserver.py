"""The sockets the sidecar and the simulator serve on."""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from specdecode_exporter.core.httpserver import DateHeader, QuietServer, ThreadedServer, bind_socket


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


def test_quiet_server_serves_a_date_and_stops_without_a_tick() -> None:
    server = ThreadedServer(_app(), bind_socket(), lifespan="off", name="quiet-stop").start()
    response = httpx.get(server.base_url + "/")
    assert response.text == "ok" and response.headers.get_list("date") == [response.headers["date"]]
    served = email.utils.parsedate_to_datetime(response.headers["date"])
    assert abs(served.timestamp() - time.time()) < 5 and response.headers["date"].endswith("GMT")
    time.sleep(1.1)  # the Date moves with the clock, no tick needed
    later = email.utils.parsedate_to_datetime(httpx.get(server.base_url + "/").headers["date"])
    assert later > served
    started = time.monotonic()
    server.stop(timeout=10.0)
    assert time.monotonic() - started < 5, "the stop waited for something instead of waking the loop"
    assert "quiet-stop" not in {thread.name for thread in threading.enumerate()}


def test_date_header_formats_once_a_second() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:  # never called here
        raise AssertionError

    dated = DateHeader(app)
    first = dated.now()
    assert dated.now() is first  # the same second: the bytes already formatted
    assert email.utils.parsedate_to_datetime(first.decode()).tzinfo is not None


# QuietServer replaces uvicorn's Server.main_loop, which is not public API (uvicorn is pinned in pyproject.toml).
# These fail when a uvicorn release no longer runs main_loop or changes what on_tick(counter) does: then check
# the new main_loop before raising the pin.

def _app() -> Starlette:
    async def root(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/", root)])


def test_uvicorn_runs_the_quiet_main_loop_which_ticks_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks: list[int] = []

    async def on_tick(self: uvicorn.Server, counter: int) -> bool:
        ticks.append(counter)
        return await uvicorn.Server.on_tick(self, counter)

    monkeypatch.setattr(QuietServer, "on_tick", on_tick)
    server = ThreadedServer(_app(), bind_socket(), lifespan="off").start()
    try:
        deadline = time.monotonic() + 30
        while not ticks and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # uvicorn's own loop would have ticked 5 times more by now
        assert httpx.get(server.base_url + "/").headers["date"].endswith("GMT")
        assert ticks == [0], f"uvicorn no longer runs QuietServer.main_loop (ticks {ticks[:5]})"
    finally:
        server.stop(timeout=10.0)
    assert ticks[:1] == [0], "uvicorn never ticked: does Server.serve still await self.main_loop()?"


def test_uvicorn_on_tick_sets_the_headers_at_counter_zero_and_reports_exit() -> None:
    assert list(inspect.signature(uvicorn.Server.main_loop).parameters) == ["self"]
    assert list(inspect.signature(uvicorn.Server.on_tick).parameters) == ["self", "counter"]
    assert inspect.iscoroutinefunction(uvicorn.Server.on_tick)
    config = uvicorn.Config(_app(), log_config=None)
    server = QuietServer(config)
    config.load()
    assert isinstance(config.app, DateHeader) and not config.date_header  # uvicorn's Date off: ours instead

    async def tick(counter: int) -> tuple[bool, list[bytes]]:
        stop = await server.on_tick(counter)
        return stop, [name for name, _ in server.server_state.default_headers]

    assert asyncio.run(tick(0)) == (False, [b"server"])  # counter 0 sets the headers, with no Date of uvicorn's
    server.request_exit()
    assert asyncio.run(tick(0))[0] is True
