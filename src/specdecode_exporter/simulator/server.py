"""Run the simulator's app with uvicorn in a background thread (tests, the demo)."""

from __future__ import annotations

from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket, url_for
from specdecode_exporter.simulator.app import build_app
from specdecode_exporter.simulator.simulator import Simulator

__all__ = ["SimulatorServer", "bind_socket", "serve_in_thread", "url_for"]


class SimulatorServer(ThreadedServer):
    """A ThreadedServer that keeps a handle on the simulator it serves."""

    def __init__(self, sim: Simulator, sock_host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(build_app(sim), bind_socket(sock_host, port), lifespan="off", name="specdecode-simulator")
        self.simulator = sim


def serve_in_thread(sim: Simulator, host: str = "127.0.0.1", port: int = 0) -> tuple[SimulatorServer, str]:
    """Start the fake vLLM on host:port (0 = a free port); returns (server, base_url). Call server.stop()."""
    server = SimulatorServer(sim, host, port)
    server.start()
    return server, server.base_url
