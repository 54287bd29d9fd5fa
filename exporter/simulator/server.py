"""Run the simulator's app with uvicorn in a background thread (tests, the demo)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn

from exporter.simulator.app import build_app
from exporter.simulator.simulator import Simulator


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts: a busy port is an OSError here, and port 0 tells us the real port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_for(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    elif host == "0.0.0.0":
        host = "127.0.0.1"
    return f"http://{host}:{port}"


class SimulatorServer:
    """A uvicorn server on its own thread. ``stop()`` (or leaving the ``with`` block) shuts it down."""

    def __init__(self, sim: Simulator, sock: socket.socket, *, log_level: str = "warning") -> None:
        config = uvicorn.Config(build_app(sim), log_level=log_level, lifespan="off", access_log=False,
                                timeout_graceful_shutdown=1)
        self.simulator = sim
        self.base_url = url_for(sock)
        self._server = uvicorn.Server(config)
        self._sock = sock
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="specdecode-simulator", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"simulator server did not start on {self.base_url}")
            time.sleep(0.01)

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> SimulatorServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def serve_in_thread(sim: Simulator, host: str = "127.0.0.1", port: int = 0) -> tuple[SimulatorServer, str]:
    """Start the fake vLLM on host:port (0 = a free port); returns (server, base_url). Call server.stop()."""
    server = SimulatorServer(sim, bind_socket(host, port))
    server.start()
    return server, server.base_url
