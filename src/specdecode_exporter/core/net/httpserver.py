"""uvicorn as its documentation runs it (``uvicorn.Server(uvicorn.Config(...))``) on a socket bound before start
(port 0 = free), with the two bounds uvicorn has no setting for; and a server on a background thread.

The background thread serves the demo and the tests; `specdecode-exporter run` serves on the main thread."""

from __future__ import annotations

import asyncio
import resource
import socket
import threading
import time
from types import TracebackType
from typing import Any, Literal, cast

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol


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


# A connection must deliver a complete request head this long after it opens, and this long after the first byte
# of each next one (keep-alive), or it is closed: uvicorn arms its keep-alive timeout only after a response and
# cancels it on any byte, so a client that never sends a full head (or sends a byte a second) held its descriptor
# for ever. Prometheus sends its whole request at once; 10 s is long for anything but an attack.
REQUEST_HEAD_TIMEOUT = 10.0
# Between a response and the next request's first byte a kept-alive connection may idle this long: longer than a
# minute's scrape interval, so Prometheus (which keeps its scrape connections open) scrapes over one connection,
# not a new one per scrape (uvicorn's own default, 5 s, closed it before each 15 s scrape). MAX_CONNECTIONS bounds
# what idle connections can hold. It is uvicorn's timeout_keep_alive.
IDLE_KEEP_ALIVE = 75
# At most this many connections at once (fewer where the descriptor limit is low: half of it, the rest left to
# the targets, the config and the request tap); a connection past it is answered 503 and closed as it is accepted,
# so that idle connections cannot use up the descriptors every scrape and probe needs.
MAX_CONNECTIONS = 1024
OVER_CAPACITY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                 b"connection: close\r\ncontent-length: 20\r\n\r\ntoo many connections\n")
HEAD_END = b"\r\n\r\n"
HEAD_MAX_BYTES = 64 * 1024  # past h11's own limit on an unfinished head (16 KiB), which it answers 400


def body_length(head: bytes) -> int | None:
    """How many bytes of body follow a request head: its Content-Length (0 without one); None for a chunked body
    or a Content-Length that is not a number (h11 answers the latter 400)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() else None
    return 0


def connection_cap() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(1, min(MAX_CONNECTIONS, soft // 2))


class ConnectionGuard:
    """A server's bounds on its connections: how many may be open, how long a request head may take.

    uvicorn has a setting for neither: its limit_concurrency answers 503 only once a request head has come (a
    connection that sends nothing, or a head a byte at a time, is never refused) and counts idle kept-alive
    connections against requests; its keep-alive timer runs only between a response and the next byte. The
    guard wraps uvicorn's HTTP/1.1 protocol (h11, the implementation of its ``http="h11"``) as Config's ``http``
    protocol class: uvicorn makes one per connection with its own keyword arguments, which reach the h11
    protocol untouched, and the guard talks to it only through asyncio.Protocol's methods (no subclass, no
    attribute of uvicorn's read). It tells where a head ends by the blank line that ends it, and skips the body
    its Content-Length announces; after a chunked body (which no scraper sends) it stops following the
    connection's heads, and uvicorn's own timers alone bound that connection."""

    def __init__(self, head_timeout: float = REQUEST_HEAD_TIMEOUT, max_connections: int | None = None) -> None:
        self.head_timeout = head_timeout
        self.max_connections = connection_cap() if max_connections is None else max_connections
        self.live: set[GuardedConnection] = set()

    def protocol(self) -> type[asyncio.Protocol]:
        """The class for ``uvicorn.Config(http=...)``."""
        guard = self

        class Guarded(GuardedConnection):
            def __init__(self, **server_arguments: Any) -> None:
                super().__init__(guard, server_arguments)

        return Guarded


class GuardedConnection(asyncio.Protocol):
    """One connection under a ConnectionGuard, uvicorn's h11 protocol inside."""

    def __init__(self, guard: ConnectionGuard, server_arguments: dict[str, Any]) -> None:
        self._guard = guard
        self._server_arguments = server_arguments
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None  # set while a request head is coming
        self._head = bytearray()  # the head coming so far
        self._body_left = 0  # bytes of the last head's body still to come (its Content-Length)
        self._following = True  # false once a chunked body came: where it ends is h11's to know

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not subclasses of asyncio's classes, hence the cast).
        stream = self._transport = cast(asyncio.Transport, transport)
        if len(self._guard.live) >= self._guard.max_connections:
            stream.write(OVER_CAPACITY)
            stream.close()
            return
        self._guard.live.add(self)
        inner = self._inner = H11Protocol(**self._server_arguments)
        inner.connection_made(stream)
        self._arm_deadline()

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        self._follow_heads(data)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.live.discard(self)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def _follow_heads(self, data: bytes) -> None:
        """Arm the deadline at the first byte of a head, disarm it at the blank line that ends it; skip its body."""
        while data and self._following:
            if self._body_left:
                taken = min(self._body_left, len(data))
                self._body_left -= taken
                data = data[taken:]
                continue
            if self._deadline is None:
                self._arm_deadline()
            searched_to = max(0, len(self._head) - len(HEAD_END) + 1)
            self._head += data
            end = self._head.find(HEAD_END, searched_to)
            if end < 0:
                if len(self._head) > HEAD_MAX_BYTES:  # h11 refuses such a head: keep only where its end may start
                    del self._head[:-len(HEAD_END)]
                return
            assert self._deadline is not None
            self._deadline.cancel()
            self._deadline = None
            head, data = bytes(self._head[:end]), bytes(self._head[end + len(HEAD_END):])
            self._head.clear()
            length = body_length(head)
            self._following, self._body_left = length is not None, length or 0

    def _arm_deadline(self) -> None:
        self._head.clear()
        self._deadline = asyncio.get_running_loop().call_later(self._guard.head_timeout, self._head_overdue)

    def _head_overdue(self) -> None:
        self._deadline = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()


def server_config(app: ASGIApp, guard: ConnectionGuard, idle_timeout: int = IDLE_KEEP_ALIVE,
                  **settings: Any) -> uvicorn.Config:
    """uvicorn's Config for an app served with ``guard``: logging through the package's handlers (no access log),
    no WebSocket, kept-alive connections idling up to ``idle_timeout`` seconds."""
    return uvicorn.Config(app, http=guard.protocol(), ws="none", log_config=None, access_log=False,
                          timeout_keep_alive=idle_timeout, **settings)


class LifespanObserved:
    """ASGI middleware: sets ``started`` once the app's lifespan startup completes. For an app without a
    lifespan (``app_lifespan`` false) it answers the lifespan protocol on the app's behalf."""

    def __init__(self, app: ASGIApp, started: threading.Event, app_lifespan: bool) -> None:
        self.app = app
        self.started = started
        self.app_lifespan = app_lifespan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        if self.app_lifespan:
            async def observed(message: Message) -> None:
                await send(message)
                if message["type"] == "lifespan.startup.complete":
                    self.started.set()

            await self.app(scope, receive, observed)
            return
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
            self.started.set()
        await send({"type": "lifespan.shutdown.complete"})


class ThreadedServer:
    """A uvicorn server on its own thread; ``stop()`` (or leaving the ``with`` block) shuts it down."""

    def __init__(self, app: ASGIApp, sock: socket.socket, *, lifespan: Literal["on", "off"] = "on",
                 name: str = "http", head_timeout: float = REQUEST_HEAD_TIMEOUT,
                 max_connections: int | None = None, idle_timeout: int = IDLE_KEEP_ALIVE) -> None:
        self._started = threading.Event()
        config = server_config(LifespanObserved(app, self._started, app_lifespan=lifespan == "on"),
                               ConnectionGuard(head_timeout, max_connections), idle_timeout,
                               lifespan="on", timeout_graceful_shutdown=1)
        self.base_url = url_for(sock)
        self._server = uvicorn.Server(config)
        self._sock = sock
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)

    def start(self, timeout: float = 10.0) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._started.wait(0.01):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start on {self.base_url}")
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True  # how uvicorn is asked to stop gracefully (its release notes, 0.41)
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ThreadedServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
