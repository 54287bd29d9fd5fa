"""The status page's history (sidecar/collection.py): one point kept a step, always the newest, its values those of
the series' shortest window with figures. Every collection makes a newest point, but works out its values only when
it is kept or read: a collection of a real-size page does not solve the acceptance model for a chart nobody reads."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import httpx
import pytest

from specdecode_exporter.pipeline import derive
from specdecode_exporter.pipeline.derive import span_stats
from specdecode_exporter.sidecar import series as series_module
from specdecode_exporter.sidecar.collection import HISTORY_SECONDS, HISTORY_STEP_SECONDS, HistoryPoint, TargetView
from specdecode_exporter.simulator import ModelSpec, steady_scenario
from tests.helpers import Harness, harness_fixture, start_harness

INTERVAL = 5.0


@pytest.fixture
def harness() -> Iterator[Harness]:
    yield from harness_fixture(start_harness(steady_scenario(ModelSpec(engines=2)), windows="1m,5m",
                                             interval=INTERVAL))


def test_history_keeps_a_point_a_step_and_the_newest_worked_out_only_when_read(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    solved: list[float] = []

    def counted(*args: object, **kwargs: object) -> derive.WindowStats | None:
        solved.append(1.0)
        return span_stats(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(series_module, "span_stats", counted)
    # One loop for all the collections, as the sidecar runs them (asyncio.run's SIGINT handling in Python 3.11
    # writes the repr of the last task's result, a TargetView, which works out every window).
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(trust_env=False)

    def step() -> TargetView:
        harness.clock.advance(INTERVAL)
        (view,) = loop.run_until_complete(harness.exporter.collect_all_once(client))
        return view

    step()
    steps = int(2 * HISTORY_STEP_SECONDS / INTERVAL) + 3
    worked_out = []
    for _ in range(steps):
        solved.clear()
        view = step()
        worked_out.append(len(solved))
    loop.run_until_complete(client.aclose())
    loop.close()
    # Most collections work out one window's acceptance per series, the verdict's (its hysteresis counts every
    # collection's judgement), and no other: only those whose previous newest point is kept work out its window too.
    engines = 2
    assert worked_out.count(engines) >= steps - 4, worked_out
    series = next(s for s in view.series if s.spec_decode)
    key = series.key
    points = view.history[key]
    now = harness.clock()
    assert points[-1].at == now, "the charts reach up to now"
    window = next(w for w in series.windows if w.has_acceptance or w.has_latency)
    acceptance = window.acceptance
    assert acceptance is not None
    assert points[-1] == HistoryPoint(now, acceptance.acceptance_ratio,
                                      window.latency.tpot_mean if window.latency else None,
                                      window.observed.mean if window.observed else None,
                                      acceptance.expected_speedup)
    gaps = [b.at - a.at for a, b in itertools.pairwise(points[:-1])]
    assert len(points) >= 3 and min(gaps) >= HISTORY_STEP_SECONDS - INTERVAL
    assert now - points[0].at <= HISTORY_SECONDS
    assert all(isinstance(p, HistoryPoint) and p.acceptance_ratio is not None for p in points)
    assert view.history[key] is points  # read once, kept
