"""The verdict changes only on a real change (core/contract/verdict.py's hold, evaluated at every collection): the
packaged demo scenario and its control pod, simulated over real loopback HTTP on one fake clock, collected every 2 s
with the demo's own config (verdict over 1m), a whole loop long. specdecode_verdict on /metrics, read after every
collection, never flips back within two minutes in the demo's steady phases (healthy, recovered, busy) — it did
within seconds, while the observed P99 sat at 1.00× the control's — and the status page says since when
the verdict is in force."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Iterator
from typing import NamedTuple

import httpx
import pytest

from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.demo import DEMO_INTERVAL_SECONDS, demo_config
from specdecode_exporter.sidecar.collection import Exporter
from specdecode_exporter.sidecar.web import build_app
from specdecode_exporter.simulator import ModelSpec, Simulator, default_scenario, steady_scenario
from specdecode_exporter.simulator.clock import ManualClock
from specdecode_exporter.simulator.server import serve_in_thread
from tests.helpers import Exposition

FLIP_BACK_SECONDS = 120.0


class Demo(NamedTuple):
    clock: ManualClock
    exporter: Exporter
    sidecar: str
    phases: tuple[tuple[str, float], ...]  # (name, start in seconds), one loop


@pytest.fixture
def demo() -> Iterator[Demo]:
    clock = ManualClock()
    scenario = default_scenario()
    model = scenario.models[0]
    stops = []
    try:
        spec, spec_url = serve_in_thread(Simulator(scenario, clock=clock))
        stops.append(spec)
        control_spec = ModelSpec(name=model.name, spec_decode=False, drafts_per_second=model.drafts_per_second)
        control, control_url = serve_in_thread(Simulator(steady_scenario(control_spec), clock=clock))
        stops.append(control)
        exporter = Exporter(demo_config("127.0.0.1:0", spec_url, control_url), clock=clock)
        sidecar = ThreadedServer(build_app(exporter, run_collection=False), bind_socket(), name="sidecar").start()
        stops.append(sidecar)
        starts = itertools.accumulate((phase.duration for phase in scenario.phases), initial=0.0)
        yield Demo(clock, exporter, sidecar.base_url, tuple(zip((p.name for p in scenario.phases), starts,
                                                                strict=False)))
    finally:
        for server in reversed(stops):
            server.stop()


def exported_verdict(sidecar: str) -> str:
    metrics = Exposition.parse(httpx.get(sidecar + "/metrics", timeout=5).text)
    (labels,) = metrics.all("specdecode_verdict", target="simulated-vllm")
    return dict(labels)["verdict"]


def changes(demo: Demo, seconds: float) -> list[tuple[float, str]]:
    """The exported verdict each time it changed: (seconds into the scenario, verdict)."""

    async def run() -> list[tuple[float, str]]:
        seen: list[tuple[float, str]] = []
        async with httpx.AsyncClient(trust_env=False) as client:
            for step in range(int(seconds / DEMO_INTERVAL_SECONDS)):
                await demo.exporter.collect_all_once(client)
                verdict = await asyncio.to_thread(exported_verdict, demo.sidecar)
                if not seen or seen[-1][1] != verdict:
                    seen.append((step * DEMO_INTERVAL_SECONDS, verdict))
                demo.clock.advance(DEMO_INTERVAL_SECONDS)
        return seen

    return asyncio.run(run())


def test_the_verdict_does_not_flip_back_within_two_minutes_in_the_demos_steady_phases(demo: Demo) -> None:
    loop = demo.phases[-1][1]
    seen = changes(demo, loop)
    starts = [start for _, start in demo.phases]
    window = 60.0  # the demo's verdict window: a phase's change shows in the verdict up to a window later
    for (_, first), (t2, _), (t3, back) in zip(seen, seen[1:], seen[2:], strict=False):
        # first → (at t2) → back (at t3): a flip back unless a phase began within a verdict window of either change
        caused_by_a_phase = any(t2 - window < start <= t3 for start in starts)
        assert not (back == first and t3 - t2 < FLIP_BACK_SECONDS and not caused_by_a_phase), seen
    verdicts = [verdict for _, verdict in seen]
    assert "paying off" in verdicts and "not speculating" in verdicts and "hurting" in verdicts, seen
    assert len(seen) <= 10, seen  # a few real changes in a loop of 8 minutes, not dozens

    status = httpx.get(demo.sidecar + "/api/v1/status", timeout=5).json()
    series = status["targets"][0]["series"][0]
    assert status["verdict_bands"]["hold_seconds"] == 60.0 and status["verdict_bands"]["margin"] == 0.05
    assert series["verdict_since"] is not None and series["verdict_seconds"] >= 0
    page = httpx.get(demo.sidecar + "/", timeout=5).text
    assert re.search(r"<small class='since'>in force since \d\d:\d\d:\d\d UTC, [0-9]+ (s|min) ago</small>", page), page
