"""The request tap in the sidecar: its process (tap/process.py), started with the tap's settings as the config
validated them (tap/settings.py), and that process' lifecycle beside the sidecar's event loop. The tap relays in a
process of its own; the sidecar reads its counters per scrape."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from specdecode_exporter.core.net.httpserver import bind_socket
from specdecode_exporter.core.stats import dispersion
from specdecode_exporter.core.stats.dispersion import MomentsHistory, WindowVariance
from specdecode_exporter.sidecar.collection import TargetView
from specdecode_exporter.sidecar.config import Config, split_listen_address
from specdecode_exporter.sidecar.expose import Labels
from specdecode_exporter.tap.request_stats import ADAPTIVE_VERIFICATION_WITHHELD, RequestsView
from specdecode_exporter.tap.route import RoutesView
from specdecode_exporter.tap.settings import TapSettings

if TYPE_CHECKING:  # the tap's process and relay load only when the tap is on (TapRuntime.__post_init__)
    from specdecode_exporter.tap.process import BreakEvens, TapProcess
    from specdecode_exporter.tap.relay import TapStats

Views = Callable[[], list[TargetView]]
HISTORY_KEEP_SECONDS = 3600.0  # the tap's sums are kept this long at least (the config's longest window, if longer)
SNAPSHOT_TIMEOUT = 1.0  # how long a scrape waits for the tap's counters before it serves the last ones it had
BREAK_EVEN_PUSH_SECONDS = 1.0  # the tap process hears the break-even in force after each collection and at least
# this often (a reload changes it without a collection); a frame is sent only when it changed
MOMENTS_SAMPLE_SECONDS = 5.0  # how often the sidecar samples the tap's sums for the windows of the measured variance


def break_evens_of(views: list[TargetView], target: str) -> BreakEvens:
    """The break-even α in force for each spec-decode series of ``target``: calibrated where a baseline gives
    one, else configured (SeriesView.break_even)."""
    view = next((v for v in views if v.config.name == target), None)
    if view is None:
        return ()
    return tuple((s.key.model_name or "", s.break_even) for s in view.series
                 if s.spec_decode and s.break_even is not None)


@dataclass
class TapRuntime:
    """The tap of one sidecar: configured at start (a bound socket), started and stopped with the app."""

    config: TapSettings
    labels: Labels  # the tapped target's name and static labels
    sock: socket.socket
    views: Views = list  # the collection's latest: the router's break-even comes from the tapped target's
    log: tuple[str, str] = ("info", "logfmt")  # level and format
    current: Callable[[], Config] | None = None  # the config in force (reloads change windows and statistics)
    clock: Callable[[], float] = time.monotonic
    withheld: str | None = None  # why vLLM's per-request draft counts are not read (the target's adaptive
    # verification: RequestRecorder.withheld); fixed at start, as the tap's settings are
    process: TapProcess = field(init=False)
    history: MomentsHistory = field(init=False)
    _pushing: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        from specdecode_exporter.tap.process import TapProcess, TapProcessSettings

        self.history = MomentsHistory(HISTORY_KEEP_SECONDS).recorded(self.clock(), {})
        self.process = TapProcess(TapProcessSettings(self.config, self.withheld, *self.log), self.sock)

    async def start(self) -> None:
        """Start the tap process; RuntimeError when it does not start."""
        self.push_break_evens()
        await self.process.start()
        self._pushing = asyncio.create_task(self._keep_pushing(), name="tap break-even")

    async def _keep_pushing(self) -> None:
        sampled = self.clock()
        while True:
            await asyncio.sleep(BREAK_EVEN_PUSH_SECONDS)
            self.push_break_evens()
            if self.clock() - sampled >= MOMENTS_SAMPLE_SECONDS:
                sampled = self.clock()
                await self.refresh()

    def push_break_evens(self) -> None:
        """Tell the tap process the break-even in force now (a frame only when it changed). After a collection: a
        block of requests that ends within a second of it is judged against what it found, not against nothing."""
        self.process.set_break_evens(break_evens_of(self.views(), self.config.target))

    async def stop(self) -> None:
        if self._pushing is not None:
            self._pushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pushing
        await self.process.stop(self.config.drain_timeout)

    async def refresh(self) -> None:
        """Fetch the tap's counters now (a scrape or the status page is about to read them); their sums join the
        history the measured variance's windows are differences of."""
        await self.process.snapshot(SNAPSHOT_TIMEOUT)
        config = self.current() if self.current is not None else None
        keep = max(HISTORY_KEEP_SECONDS, config.longest_window if config is not None else 0.0)
        self.history = replace(self.history, keep_s=keep).recorded(self.clock(), self.view().moments)

    def variances(self) -> list[WindowVariance]:
        """The page's variance per drafted token per model and window of the config in force: measured from the
        tap's requests, else the configured bound."""
        if self.current is None:
            return []
        config = self.current()
        stats = config.statistics
        return dispersion.window_variances(
            self.history, self.clock(), [(w.name, w.seconds) for w in config.windows], stats.min_requests,
            lambda sums: dispersion.assumed_variance(stats.dispersion, sums))

    def view(self) -> RequestsView:
        return self.process.latest.requests

    def routes(self) -> RoutesView | None:
        return self.process.latest.routes

    def stats(self) -> TapStats | None:
        return self.process.latest.stats


def tap_runtime(config: Config, views: Views = list, current: Callable[[], Config] | None = None
                ) -> TapRuntime | None:
    """The tap for ``config``, its socket bound now (OSError when the address is taken); None when it is off.
    ``views`` are the collection's latest: the router's break-even comes from the tapped target's; ``current`` the
    config in force (else ``config``), whose windows and statistics the measured variance reads."""
    tap = config.tap
    if tap is None:
        return None
    target = next(t for t in config.targets if t.name == tap.target)
    host, port = split_listen_address(tap.listen_address)
    return TapRuntime(tap, {"target": target.name, **dict(target.labels)}, bind_socket(host, port), views,
                      (config.log.level, config.log.format), current or (lambda: config),
                      withheld=ADAPTIVE_VERIFICATION_WITHHELD if target.adaptive_verification else None)
