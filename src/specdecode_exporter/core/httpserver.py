"""Run an ASGI app with uvicorn on a background thread, on a socket bound before start (port 0 = free).

Used by the demo and the tests; `specdecode-exporter run` serves on the main thread instead."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from email.utils import formatdate
from types import FrameType, TracebackType
from typing import Literal, cast

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


class QuietServer(uvicorn.Server):
    """uvicorn's server, waking only when asked to stop. uvicorn's loop ticks every 0.1 s to refresh its Date header
    (one-second resolution) and to notice a shutdown; at one tick a second that was still a wakeup of the loop a
    second (~0.15 ms of CPU each: as much as a real vLLM page's fetch). Here the Date header is written as each
    response starts (DateHeader, uvicorn's own off), and a shutdown wakes the loop itself.

    uvicorn has no setting for its tick, so this replaces Server.main_loop, which is not public API: uvicorn is
    pinned to the versions tested (pyproject.toml), and tests/integration/test_httpserver.py fails when uvicorn
    stops running main_loop or changes what on_tick(counter) does."""

    def __init__(self, config: uvicorn.Config) -> None:
        if config.date_header and not isinstance(config.app, str):
            config.app, config.date_header = DateHeader(cast(ASGIApp, config.app)), False
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Future[None] | None = None

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
                 name: str = "http") -> None:
        config = uvicorn.Config(app, log_config=None, lifespan=lifespan, access_log=False,
                                timeout_graceful_shutdown=1)
        self.base_url = url_for(sock)
        self._server = QuietServer(config)
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
