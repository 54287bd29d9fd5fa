"""Run an ASGI app with uvicorn on a background thread, on a socket bound before start (port 0 = free).

Used by the demo and the tests; `specdecode-exporter run` serves on the main thread instead."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI


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


class ThreadedServer:
    """A uvicorn server on its own thread; ``stop()`` (or leaving the ``with`` block) shuts it down."""

    def __init__(self, app: FastAPI, sock: socket.socket, *, lifespan: str = "on", name: str = "http") -> None:
        config = uvicorn.Config(app, log_config=None, lifespan=lifespan, access_log=False,
                                timeout_graceful_shutdown=1)
        self.base_url = url_for(sock)
        self._server = uvicorn.Server(config)
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
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ThreadedServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
