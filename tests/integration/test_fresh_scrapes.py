"""A scrape never reads a page older than the last completed collection, whoever scrapes and whenever: a second
Prometheus replica (an HA pair, 5 s apart at a 5 s collection interval, here ten times faster), an irregular
scraper (curl, a user debugging), and the first scrape after the first collection. The sidecar runs its own
collection over real loopback HTTP against the simulator; /api/v1/status, asked just before each scrape, says which
collection has completed by then, and the scrape must show that one or a later one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest

from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.sidecar.collection import Exporter
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.sidecar.web import build_app
from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.server import serve_in_thread
from tests.helpers import Exposition

INTERVAL = 0.5  # the collection interval: 5 s in production, ten times faster here
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;"
                     "q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")  # what Prometheus 2.x sends
PROMETHEUS = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}


@dataclass
class Sidecar:
    url: str

    def completed(self) -> float:
        """Draft tokens as of the last completed collection, from /api/v1/status (0 before the first)."""
        (target,) = httpx.get(self.url + "/api/v1/status", timeout=5).json()["targets"]
        series = target["series"]
        return float(series[0]["totals"]["draft_tokens"]) if series else 0.0

    def scrape(self, headers: dict[str, str] | None = None) -> float:
        """A scrape's draft tokens (0 when the page has no series yet)."""
        response = httpx.get(self.url + "/metrics", headers=headers or PROMETHEUS, timeout=5)
        response.raise_for_status()
        value = Exposition.parse(response.text).get("specdecode_draft_tokens_total")
        return 0.0 if value is None else value

    def check(self, headers: dict[str, str] | None = None) -> tuple[float, float]:
        """(completed before the scrape, what the scrape showed)."""
        before = self.completed()
        return before, self.scrape(headers)

    def next_collection(self, seen: float, within: float = 5.0) -> float:
        """Wait (polling the status) until a collection after the one that showed ``seen`` completes."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            now = self.completed()
            if now != seen:
                return now
            time.sleep(0.002)
        raise AssertionError("no collection completed")


@contextmanager
def sidecar(first_fetch_delay: float = 0.0) -> Iterator[Sidecar]:
    """The sidecar collecting the simulator every INTERVAL on its own; the simulator's first answer can be held
    ``first_fetch_delay`` seconds (a scrape then comes before the first collection has completed)."""
    simulator = Simulator(steady_scenario(ModelSpec(drafts_per_second=200.0)))
    server, url = serve_in_thread(simulator)
    held = threading.Event()
    if first_fetch_delay:
        snapshot: Callable[[], object] = simulator.snapshot

        def slow_first() -> object:  # on the simulator's own thread: only its first answer waits
            if not held.is_set():
                held.set()
                time.sleep(first_fetch_delay)
            return snapshot()

        simulator.snapshot = slow_first  # type: ignore[assignment,method-assign]
    config = Config(targets=(TargetConfig(name="vllm", url=url + "/metrics", timeout=5.0),),
                    windows=parse_windows("1m", "windows"), collect=CollectSection(interval=INTERVAL))
    try:
        with ThreadedServer(build_app(Exporter(config), run_collection=True), bind_socket(),
                            name="sidecar").start() as running:
            yield Sidecar(running.base_url)
    finally:
        server.stop()


def test_both_replicas_of_an_ha_pair_read_the_last_collection() -> None:
    """Two Prometheus replicas scrape every 3 intervals, the second one interval after the first: the sidecar
    expects the next scrape one gap after the last, and the replica it does not expect got the previous page."""
    with sidecar() as car:
        car.next_collection(car.completed())
        start = time.monotonic() + INTERVAL / 2  # between collections (they come at whole intervals)
        results = []
        for round_ in range(4):
            for offset in (0.0, INTERVAL):  # replica A, then replica B
                time.sleep(max(0.0, start + 3 * INTERVAL * round_ + offset - time.monotonic()))
                results.append(car.check())
    assert all(before > 0 for before, _ in results), results
    stale = [(before, scraped) for before, scraped in results if scraped < before]
    assert not stale, f"{len(stale)} of {len(results)} scrapes older than the last completed collection: {stale}"


def test_an_irregular_scraper_reads_the_last_collection() -> None:
    """Scrapes at no cadence at all, some right after a collection completes, in either format, gzipped or not."""
    text = {"Accept": "text/plain"}
    with sidecar() as car:
        seen = car.next_collection(car.completed())
        results = []
        for pause, headers in ((0.13, PROMETHEUS), (0.9, text), (0.31, PROMETHEUS), (1.7, text), (0.05, PROMETHEUS),
                               (0.6, PROMETHEUS), (1.1, text)):
            time.sleep(pause)
            results.append(car.check(headers))
            seen = car.next_collection(seen)  # and one as soon as a collection has completed
            results.append((seen, car.scrape(headers)))
    stale = [(before, scraped) for before, scraped in results if scraped < before]
    assert not stale, f"{len(stale)} of {len(results)} scrapes older than the last completed collection: {stale}"


@pytest.mark.parametrize("start", range(3))  # three sidecars: each has one first collection
def test_the_first_scrape_after_the_first_collection_shows_it(start: int) -> None:
    """A scrape before the first collection has completed (the simulator holds its first answer) gets the page
    that says so; the first scrape after it completes shows it, though the sidecar has nothing rendered ahead."""
    with sidecar(first_fetch_delay=0.6) as car:
        time.sleep(0.2)
        assert car.check() == (0.0, 0.0)
        first = car.next_collection(0.0)
        assert first > 0
        assert car.scrape() >= first
