"""The request tap in the sidecar: its recorder (the Observer), its router when routing is on, and its lifecycle on
the sidecar's event loop."""

from __future__ import annotations

import socket
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from specdecode_exporter.core.httpserver import bind_socket
from specdecode_exporter.sidecar.collection import TargetView
from specdecode_exporter.sidecar.config import Config, ProxyConfig, split_listen_address
from specdecode_exporter.sidecar.expose import Labels
from specdecode_exporter.tap import Tap, TapRequest, TapResult, TapStats, start_tap
from specdecode_exporter.tap.request_stats import RequestRecorder, RequestsView, TapSettings
from specdecode_exporter.tap.route import ClassRouter, RoutesView

Views = Callable[[], list[TargetView]]


def break_even_of(views: Views, target: str) -> Callable[[str], float | None]:
    """The break-even α in force for a model served by ``target``: calibrated where a baseline gives one, else
    configured (SeriesView.break_even), averaged over the model's engines. A target serving one model answers for
    it whatever name the clients use. None before the first collection with draft counters."""
    def lookup(model: str) -> float | None:
        view = next((v for v in views() if v.config.name == target), None)
        if view is None:
            return None
        series = [s for s in view.series if s.spec_decode and s.break_even is not None]
        if len({s.key.model_name for s in series}) > 1:
            series = [s for s in series if s.key.model_name == model]
        values = [s.break_even for s in series if s.break_even is not None]
        return statistics.fmean(values) if values else None

    return lookup


@dataclass(frozen=True)
class _Observers:
    """The tap's one observer: the request figures, then the router."""

    recorder: RequestRecorder
    router: ClassRouter

    def observe(self, request: TapRequest, result: TapResult) -> None:
        self.recorder.observe(request, result)
        self.router.observe(request, result)


@dataclass
class TapRuntime:
    """The tap of one sidecar: configured at start (a bound socket), started and stopped with the app."""

    config: ProxyConfig
    labels: Labels  # the tapped target's name and static labels
    sock: socket.socket
    break_even: Callable[[str], float | None] = lambda model: None  # per model, for the router
    recorder: RequestRecorder = field(init=False)
    router: ClassRouter | None = field(init=False)
    tap: Tap | None = None

    def __post_init__(self) -> None:
        self.recorder = RequestRecorder(TapSettings(temperature_edges=self.config.temperature_bands,
                                                    max_workloads=self.config.max_workloads))
        route = self.config.route
        self.router = ClassRouter(route, self.recorder.band_key, self.break_even) if route is not None else None

    async def start(self) -> None:
        host, port = split_listen_address(self.config.listen_address)
        router = self.router
        self.tap = await start_tap(host, port, self.config.upstream,
                                   self.recorder if router is None else _Observers(self.recorder, router),
                                   workload_header=self.config.workload_header,
                                   connect_timeout=self.config.connect_timeout, sock=self.sock, router=router,
                                   fallback_upstream=router.settings.fallback_upstream if router else None)

    async def stop(self) -> None:
        if self.tap is not None:
            await self.tap.close(self.config.drain_timeout)
            self.tap = None

    def view(self) -> RequestsView:
        return self.recorder.view()

    def routes(self) -> RoutesView | None:
        return self.router.view() if self.router is not None else None

    def stats(self) -> TapStats | None:
        return self.tap.stats() if self.tap is not None else None


def tap_runtime(config: Config, views: Views = list) -> TapRuntime | None:
    """The tap for ``config``, its socket bound now (OSError when the address is taken); None when it is off.
    ``views`` are the collection's latest: the router's break-even comes from the tapped target's."""
    proxy = config.proxy
    if proxy is None:
        return None
    target = next(t for t in config.targets if t.name == proxy.target)
    host, port = split_listen_address(proxy.listen_address)
    return TapRuntime(proxy, {"target": target.name, **dict(target.labels)}, bind_socket(host, port),
                      break_even_of(views, target.name))
