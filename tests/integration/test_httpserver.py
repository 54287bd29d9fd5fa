"""The sockets the sidecar and the simulator serve on."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from specdecode_exporter.core.httpserver import QuietServer, ThreadedServer, bind_socket


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


def test_quiet_server_serves_a_date_and_stops_without_waiting_for_its_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(QuietServer, "TICK_SECONDS", 600.0)  # a stop that waited for the tick would never end
    app = FastAPI()

    @app.get("/")
    def root() -> PlainTextResponse:
        return PlainTextResponse("ok")

    server = ThreadedServer(app, bind_socket(), lifespan="off").start()
    response = httpx.get(server.base_url + "/")
    assert response.text == "ok" and response.headers["date"].endswith("GMT")
    server.stop(timeout=10.0)
    assert not server._thread.is_alive()
