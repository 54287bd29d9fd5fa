"""The request tap in the sidecar: its recorder (the Observer) and its lifecycle on the sidecar's event loop."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from specdecode_exporter.core.httpserver import bind_socket
from specdecode_exporter.sidecar.config import Config, ProxyConfig, split_listen_address
from specdecode_exporter.sidecar.expose import Labels
from specdecode_exporter.tap import Tap, TapStats, start_tap
from specdecode_exporter.tap.request_stats import RequestRecorder, RequestsView, TapSettings


@dataclass
class TapRuntime:
    """The tap of one sidecar: configured at start (a bound socket), started and stopped with the app."""

    config: ProxyConfig
    labels: Labels  # the tapped target's name and static labels
    sock: socket.socket
    recorder: RequestRecorder = field(init=False)
    tap: Tap | None = None

    def __post_init__(self) -> None:
        self.recorder = RequestRecorder(TapSettings(temperature_edges=self.config.temperature_bands,
                                                    max_workloads=self.config.max_workloads))

    async def start(self) -> None:
        host, port = split_listen_address(self.config.listen_address)
        self.tap = await start_tap(host, port, self.config.upstream, self.recorder,
                                   workload_header=self.config.workload_header,
                                   connect_timeout=self.config.connect_timeout, sock=self.sock)

    async def stop(self) -> None:
        if self.tap is not None:
            await self.tap.close(self.config.drain_timeout)
            self.tap = None

    def view(self) -> RequestsView:
        return self.recorder.view()

    def stats(self) -> TapStats | None:
        return self.tap.stats() if self.tap is not None else None


def tap_runtime(config: Config) -> TapRuntime | None:
    """The tap for ``config``, its socket bound now (OSError when the address is taken); None when it is off."""
    proxy = config.proxy
    if proxy is None:
        return None
    target = next(t for t in config.targets if t.name == proxy.target)
    host, port = split_listen_address(proxy.listen_address)
    return TapRuntime(proxy, {"target": target.name, **dict(target.labels)}, bind_socket(host, port))
