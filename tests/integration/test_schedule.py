"""The collection schedule with many targets: everyone is collected at start, then target i of N runs i/N
of an interval later, so N targets are spread over the interval instead of queueing in one burst."""

from __future__ import annotations

import time
from collections.abc import Callable

from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.sidecar.collection import Exporter
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.sidecar.web import build_app
from tests.faults.hostile import scripted, serve, v1_body

INTERVAL = 1.0
TARGETS = 4


def _recording(times: list[float]) -> Callable[[], bytes]:
    def body() -> bytes:
        times.append(time.monotonic())
        return v1_body(300, 200)
    return body


def test_targets_are_spread_over_the_interval_after_the_first_collection() -> None:
    times: list[list[float]] = [[] for _ in range(TARGETS)]
    servers = [serve(scripted(_recording(times[i]))).start() for i in range(TARGETS)]
    try:
        config = Config(targets=tuple(TargetConfig(f"t{i}", s.url) for i, s in enumerate(servers)),
                        windows=parse_windows("1m", "windows"), collect=CollectSection(interval=INTERVAL))
        with ThreadedServer(build_app(Exporter(config), run_collection=True), bind_socket(), name="sidecar").start():
            deadline = time.monotonic() + 6 * INTERVAL  # three rounds take 2.75 intervals; a loaded machine, more
            while not all(len(t) >= 3 for t in times) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        for server in servers:
            server.stop()
    assert all(len(t) >= 3 for t in times), times
    first_round = min(t[0] for t in times)
    assert max(t[0] for t in times) - first_round < 0.3 * INTERVAL, "every target is collected at start"
    # Target i's second fetch comes (1 + i/N) intervals after its first: slots 0.25 apart, so within 0.2 of its
    # own slot is in no neighbour's (a stall of the loaded machine is not taken for a schedule).
    for i, fetched in enumerate(times):
        expected = INTERVAL * (1 + i / TARGETS)
        assert abs((fetched[1] - fetched[0]) - expected) < 0.2 * INTERVAL, (i, fetched[1] - fetched[0], expected)
        assert abs((fetched[2] - fetched[1]) - INTERVAL) < 0.2 * INTERVAL, "then the plain interval"
