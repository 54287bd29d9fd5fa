"""Run an ASGI app with uvicorn on a background thread, on a socket bound before start (port 0 = free).

Used by the demo and the tests; `specdecode-exporter run` serves on the main thread instead."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import threading
import time
from email.utils import formatdate
from types import FrameType, TracebackType
from typing import Any, Literal, cast

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets that do, and without it every response on a
    # kept-alive connection (headers and body are two writes) waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_for(sock: socket.socket) -> str:
    """A URL a local client can use for the bound socket (a wildcard bind is reached via loopback)."""
    host, port = sock.getsockname()[:2]
    if ":" in host:
        return f"http://[{'::1' if host == '::' else host}]:{port}"
    return f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"


def _wake_up(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class DateHeader:
    """ASGI middleware: the Date header (RFC 9110 §6.6.1, one-second resolution) on every HTTP response, formatted
    when a response starts (once a second at most), instead of by a timer whether or not anyone asks."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second, self._value = second, formatdate(second, usegmt=True).encode()
        return self._value

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def dated(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(b"date", self.now()), *message.get("headers", ())]}
            await send(message)

        await self.app(scope, receive, dated)


# A connection must deliver a complete request head this long after it opens, and this long after the first byte
# of each next one (keep-alive), or it is closed: uvicorn arms its keep-alive timeout only after a response and
# cancels it on any byte, so a client that never sends a full head (or sends a byte a second) held its descriptor
# for ever. Prometheus sends its whole request at once; 10 s is long for anything but an attack.
REQUEST_HEAD_TIMEOUT = 10.0
# Between a response and the next request's first byte a kept-alive connection may idle this long: longer than a
# minute's scrape interval, so Prometheus (which keeps its scrape connections open) scrapes over one connection,
# not a new one per scrape (uvicorn's own default, 5 s, closed it before each 15 s scrape). MAX_CONNECTIONS bounds
# what idle connections can hold. The sidecar passes it as uvicorn's timeout_keep_alive.
IDLE_KEEP_ALIVE = 75
# At most this many connections at once (fewer where the descriptor limit is low: half of it, the rest left to
# the targets, the config and the request tap); a connection past it is answered 503 and closed as it is accepted,
# so that idle connections cannot use up the descriptors every scrape and probe needs.
MAX_CONNECTIONS = 1024
_OVER_CAPACITY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                  b"connection: close\r\ncontent-length: 20\r\n\r\ntoo many connections\n")


def connection_cap() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(1, min(MAX_CONNECTIONS, soft // 2))


def bounded_protocol(base: type[asyncio.Protocol], head_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (h11 or httptools), with a deadline for each request head and a cap on open
    connections; a kept-alive connection's idle time between a response and the next request's first byte is
    uvicorn's own timeout_keep_alive. It relies on what both of uvicorn's HTTP/1.1 protocols share: ``transport``,
    ``data_received``, ``on_response_complete`` (called as a response finishes, where uvicorn arms its keep-alive
    timer) and ``cycle.response_complete`` (false while a request is being served)."""
    parent: Any = base
    live: set[asyncio.Protocol] = set()

    class Bounded(parent):  # type: ignore[misc]  # a subclass of whichever class uvicorn resolved
        _head_deadline: asyncio.TimerHandle | None = None
        _idle = False  # a response has finished and no byte of the next request has come

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            if len(live) >= max_connections:
                transport.write(_OVER_CAPACITY)  # type: ignore[attr-defined]
                transport.close()
                return
            live.add(self)
            self._arm_head_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            live.discard(self)
            if self._head_deadline is not None:
                self._head_deadline.cancel()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._idle:  # the next request's head, measured from its first byte; later bytes do not reset it
                self._idle = False
                self._arm_head_deadline()
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()  # uvicorn's keep-alive timer bounds the idle time from here
            self._idle = True
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _arm_head_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
            self._head_deadline = asyncio.get_running_loop().call_later(head_timeout, self._head_overdue)

        def _head_overdue(self) -> None:
            self._head_deadline = None
            cycle = getattr(self, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                return  # a request is being served: the next head's first byte arms the deadline again
            if not self.transport.is_closing():
                self.transport.close()

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{base.__name__}"
    return cast(type[asyncio.Protocol], Bounded)


class QuietServer(uvicorn.Server):
    """uvicorn's server, waking only when asked to stop. uvicorn's loop ticks every 0.1 s to refresh its Date header
    (one-second resolution) and to notice a shutdown; at one tick a second that was still a wakeup of the loop a
    second (~0.15 ms of CPU each: as much as a real vLLM page's fetch). Here the Date header is written as each
    response starts (DateHeader, uvicorn's own off), and a shutdown wakes the loop itself.

    uvicorn has no setting for its tick, so this replaces Server.main_loop, which is not public API: uvicorn is
    pinned to the versions tested (pyproject.toml), and tests/integration/test_httpserver.py fails when uvicorn
    stops running main_loop or changes what on_tick(counter) does.

    Each connection also gets a deadline for its request heads and a cap on their number (bounded_protocol)."""

    def __init__(self, config: uvicorn.Config, *, head_timeout: float = REQUEST_HEAD_TIMEOUT,
                 max_connections: int | None = None) -> None:
        if config.date_header and not isinstance(config.app, str):
            config.app, config.date_header = DateHeader(cast(ASGIApp, config.app)), False
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Future[None] | None = None
        self._head_timeout = head_timeout
        self._max_connections = max_connections

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # The config is loaded by now (the protocol class resolved); every connection is made from it after this.
        self.config.http_protocol_class = bounded_protocol(
            self.config.http_protocol_class, self._head_timeout,
            connection_cap() if self._max_connections is None else self._max_connections)
        await super().startup(sockets)

    async def main_loop(self) -> None:
        # One tick (counter 0: the default headers set, an exit asked before it seen), then nothing until a
        # shutdown wakes it: no timer.
        loop = self._loop = asyncio.get_running_loop()
        while not await self.on_tick(0):
            wake = self._wake = loop.create_future()
            if self.should_exit:  # asked to stop before this future existed
                break
            await wake

    def request_exit(self) -> None:
        """Shut down gracefully; callable from any thread and from a signal handler."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(_wake_up, wake)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.request_exit()


class ThreadedServer:
    """A uvicorn server on its own thread; ``stop()`` (or leaving the ``with`` block) shuts it down."""

    def __init__(self, app: ASGIApp, sock: socket.socket, *, lifespan: Literal["auto", "on", "off"] = "on",
                 name: str = "http", head_timeout: float = REQUEST_HEAD_TIMEOUT,
                 max_connections: int | None = None, idle_timeout: int = IDLE_KEEP_ALIVE) -> None:
        config = uvicorn.Config(app, log_config=None, lifespan=lifespan, access_log=False,
                                timeout_graceful_shutdown=1, timeout_keep_alive=idle_timeout)
        self.base_url = url_for(sock)
        self._server = QuietServer(config, head_timeout=head_timeout, max_connections=max_connections)
        self._sock = sock
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)

    def start(self, timeout: float = 10.0) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start on {self.base_url}")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._server.request_exit()
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ThreadedServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
