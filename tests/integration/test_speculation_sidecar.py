"""The sidecar against simulated vLLM pods over real loopback HTTP: it sees an acceptance gate stop speculation
(share 0 while generation goes on, said in words), a batch-size schedule at k = 0 (on purpose, from the scheduled
steps), advises a schedule by batch size with its evidence, and measures what spec decode costs against a control
pod (KV cache, preemptions, throughput) — and the verdict takes those costs into account."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import pytest

from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.sidecar.collection import Exporter, TargetView
from specdecode_exporter.sidecar.config import BaselineConfig, CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.sidecar.series import CONFIGURED_CUT_OFF, UNEXPLAINED_STOP
from specdecode_exporter.sidecar.web import build_app
from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.clock import ManualClock
from specdecode_exporter.simulator.server import serve_in_thread
from tests.helpers import Exposition, Harness, start_harness

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def series_status(status: dict[str, Any], target: str = "vllm") -> dict[str, Any]:
    (found,) = [t for t in status["targets"] if t["name"] == target]
    return found["series"][0]  # type: ignore[no-any-return]


class Collected(NamedTuple):
    """What one collection showed: the counters on /metrics, and what the status API and the verdict said."""

    drafted: float
    generated: float
    state: str
    reason: str
    verdict: str
    verdict_reason: str
    exported: str  # specdecode_verdict's verdict label


def collected(harness: Harness) -> Collected:
    metrics, series = harness.metrics(), series_status(harness.status())
    (labels,) = metrics.all("specdecode_verdict")
    drafted = metrics.get("specdecode_draft_tokens_total")
    generated = metrics.get("specdecode_generated_tokens_total", spec_decode="true")
    assert drafted is not None and generated is not None
    return Collected(drafted, generated, series["speculation"]["state"], series["speculation"]["reason"],
                     series["verdict"], series["verdict_reason"], dict(labels)["verdict"])


def test_a_gate_that_stops_speculation_is_said_within_three_collections_for_as_long_as_it_lasts() -> None:
    """The gate closes about 65 s in (α 0.3, below the gate's 0.5, once its window of 1300 iterations is full at 20 a
    second). The stop is said from the drafted-token counter's standstill while generation goes on, not
    from the 1m window emptying (a minute later): within three collections of the last drafted token, and at every
    collection after it, by the speculation state, the verdict and specdecode_verdict. The restart (vLLM restarted:
    the gate opens again) is said as fast."""
    harness = start_harness(steady_scenario(ModelSpec(acceptance_rate=0.3, acceptance_rate_window_size=1300,
                                                      acceptance_rate_threshold=0.5)))
    try:
        harness.collect()
        seen = []
        for _ in range(36):  # 180 s
            harness.step(5)
            seen.append(collected(harness))
        last_drafting = max(i for i in range(1, len(seen)) if seen[i].drafted > seen[i - 1].drafted)
        assert 6 < last_drafting < len(seen) - 20, last_drafting
        assert all(c.generated > b.generated for b, c in itertools.pairwise(seen))  # generation goes on
        assert {c.state for c in seen[1:last_drafting + 1]} == {"speculating"}
        first_stopped = next(i for i, c in enumerate(seen) if c.state == "stopped")
        assert last_drafting < first_stopped <= last_drafting + 3
        for c in seen[first_stopped:]:
            assert c.state == "stopped" and c.verdict == c.exported == "not speculating", c
            assert c.reason.startswith("stopped speculating since ") and "acceptance gate" in c.reason
            assert c.verdict_reason.startswith("since ") and "P99" not in c.verdict_reason
        # the minute after the stop: the 1m window still counted drafts, which used to keep "speculating"
        assert seen[first_stopped].reason.endswith("though it drafted before; " + UNEXPLAINED_STOP)
        page = httpx.get(harness.sidecar_url + "/", timeout=5).text
        assert "stopped speculating since" in page and "not speculating<br><small>since " in page
        # α by window: the 1m window says why it has no α (it used to drop out, leaving the 5m α in its place)
        five = series_status(harness.status())["windows"]["5m"]["acceptance_ratio"]
        assert f"1m – <small>(nothing drafted (speculation stopped))</small> · 5m {five:.2f}" in page

        harness.simulator.restart()  # vLLM restarted: the gate is open again
        again = []
        for _ in range(4):
            harness.step(5)
            again.append(collected(harness))
        first_speculating = next(i for i, c in enumerate(again) if c.state == "speculating")
        assert first_speculating <= 2, again
        assert again[first_speculating].reason.startswith("speculating again since ")
        assert all(c.verdict != "not speculating" and c.exported == c.verdict for c in again[first_speculating:])
    finally:
        harness.stop()


SCHEDULE = ((1, 4, 3), (5, 16, 1), (17, 256, 0))


def test_a_schedule_at_k_0_is_said_to_be_on_purpose() -> None:
    spec = ModelSpec(drafts_per_second=200.0, num_speculative_tokens_per_batch_size=SCHEDULE,
                     spec_decode_scheduled_steps=True)
    harness = start_harness(steady_scenario(spec))
    try:
        harness.collect()
        for _ in range(3):
            harness.step(5)
        metrics = harness.metrics()
        steps = metrics.all("specdecode_scheduled_steps_total")
        assert {dict(labels)["num_speculative_tokens"] for labels in steps} == {"0", "1", "2", "3"}
        assert metrics.get("specdecode_scheduled_steps_total", num_speculative_tokens="1") > 0
        assert metrics.get("specdecode_scheduled_steps_total", num_speculative_tokens="3") == 0
        harness.simulator.set_override(drafts_per_second=3000.0)  # busy: the schedule drafts nothing
        for _ in range(3):
            harness.step(5)
        series = series_status(harness.status())
        stopped = series["speculation"]
        assert stopped["state"] == "stopped" and stopped["configured"] is True
        assert "the batch-size schedule chose k = 0 for 100% of the scheduler steps" in stopped["reason"]
        assert series["verdict"] == "not speculating"
        assert "vLLM's num_speculative_tokens_per_batch_size, configured at this batch size" in series["verdict_reason"]
    finally:
        harness.stop()


def test_a_stop_at_a_batch_size_cut_off_is_named_as_configured() -> None:
    """Without the scheduled-steps counter (vLLM today) the engine's page still shows a configured cut-off by batch
    size (--speculative-disable-by-batch-size, or a schedule at k = 0): drafting stopped when the running batch rose
    above every batch it drafted at."""
    spec = ModelSpec(drafts_per_second=200.0, num_speculative_tokens_per_batch_size=SCHEDULE)
    harness = start_harness(steady_scenario(spec))
    try:
        harness.collect()
        for _ in range(3):
            harness.step(5)
        harness.simulator.set_override(drafts_per_second=3000.0)  # about 60 requests run: above 16, k = 0
        for _ in range(3):
            harness.step(5)
        series = series_status(harness.status())
        stopped = series["speculation"]
        assert stopped["state"] == "stopped" and stopped["configured"] is True, stopped
        assert re.search(r"it stopped drafting when the running batch rose to \d+ requests \(it drafted at up to "
                         r"\d+\): " + re.escape(CONFIGURED_CUT_OFF), stopped["reason"]), stopped["reason"]
        assert series["verdict"] == "not speculating" and CONFIGURED_CUT_OFF in series["verdict_reason"]
        harness.simulator.set_override(drafts_per_second=200.0)  # the batch comes down: it drafts again
        states = []
        for _ in range(6):
            harness.step(5)
            states.append(series_status(harness.status())["speculation"]["state"])
        assert states[-1] == "speculating", states
    finally:
        harness.stop()


def test_the_schedule_advice_is_exported_with_its_evidence_and_pastes() -> None:
    # 200 steps/s: about 10 requests running, all the time in the 5-16 range
    harness = start_harness(steady_scenario(ModelSpec(acceptance_rate=0.8, drafts_per_second=200.0)),
                            windows="1m,5m")
    try:
        harness.clock.advance(5)  # a simulator starts idle: the first interval would count at batch size 1
        harness.collect()
        for _ in range(12):
            harness.step(5)
        schedule = series_status(harness.status())["schedule"]
        assert schedule["window"] == "5m" and schedule["num_speculative_tokens"] == 3
        seen = {r["batch_size"]: r["observed_seconds"] for r in schedule["ranges"]}
        assert seen["5-16"] == pytest.approx(60.0) and sum(seen.values()) == pytest.approx(60.0)
        metrics = harness.metrics()
        by_range = {dict(labels)["batch_size"]: value for labels, value in
                    metrics.all("specdecode_recommended_num_speculative_tokens_by_batch_size", window="5m").items()}
        assert list(by_range) == ["1-4", "5-16", "17-64", "65-256", "257-1024"]
        assert list(by_range.values()) == sorted(by_range.values(), reverse=True)
        assert by_range == {r["batch_size"]: r["recommended_num_speculative_tokens"] for r in schedule["ranges"]}
        gain = metrics.get("specdecode_batch_size_schedule_expected_gain", window="5m")
        middle = next(r for r in schedule["ranges"] if r["batch_size"] == "5-16")
        # all the time was spent in 5-16: the gain is that range's alone
        assert gain == pytest.approx(middle["expected_speedup_recommended"] / middle["expected_speedup_fixed"],
                                     rel=1e-3)
        pasted = json.loads(schedule["vllm"].removeprefix("--speculative-config '").removesuffix("'"))
        assert pasted["num_speculative_tokens_per_batch_size"][0][0] == 1 and pasted["num_speculative_tokens"] == 3
        assert schedule["trtllm"].startswith("speculative_config: {max_draft_len: ")
        assert "Batch-size schedule" in httpx.get(harness.sidecar_url + "/", timeout=5).text
    finally:
        harness.stop()


class Pods:
    """A spec-decode pod and its control pod (spec decode off), one sidecar collecting both on one fake clock."""

    def __init__(self, spec: ModelSpec, control: ModelSpec) -> None:
        self.clock = ManualClock()
        self._servers: list[Any] = []
        urls = []
        for model in (spec, control):
            server, url = serve_in_thread(Simulator(steady_scenario(model), clock=self.clock))
            self._servers.append(server)
            urls.append(url)
        config = Config(targets=(
            TargetConfig(name="vllm", url=urls[0] + "/metrics", baseline=BaselineConfig(target="control")),
            TargetConfig(name="control", url=urls[1] + "/metrics", spec_decode=False),
        ), windows=parse_windows("1m,5m", "windows"), collect=CollectSection(interval=5.0))
        self.exporter = Exporter(config, clock=self.clock)
        sidecar = ThreadedServer(build_app(self.exporter, run_collection=False), bind_socket(), name="sidecar")
        self._servers.append(sidecar.start())
        self.url = sidecar.base_url

    def step(self, seconds: float) -> list[TargetView]:
        self.clock.advance(seconds)

        async def once() -> None:
            async with httpx.AsyncClient(trust_env=False) as client:
                await self.exporter.collect_all_once(client)

        # Not asyncio.run's result: Python 3.11 writes the repr of its task (with the views in it) when it puts
        # the SIGINT handler back, and a repr reads every part of a view.
        asyncio.run(once())
        return self.exporter.views()

    def stop_control(self) -> None:
        self._servers.pop(1).stop()

    def stop(self) -> None:
        for server in self._servers:
            server.stop()


@pytest.fixture
def starved() -> Iterator[Pods]:
    # The same demand of tokens on both pods; the draft model takes half the spec pod's KV cache, so it runs
    # about 23 requests where 30 want to, queues and preempts; the control pod fits its 39.
    spec = ModelSpec(draft_memory_share=0.5, kv_cache_capacity_tokens=30_000, drafts_per_second=600.0)
    control = ModelSpec(spec_decode=False, kv_cache_capacity_tokens=30_000, drafts_per_second=600.0 * 3.25)
    pods = Pods(spec, control)
    try:
        yield pods
    finally:
        pods.stop()


def metrics_verdict(pods: Pods) -> tuple[str, str]:
    metrics = Exposition.parse(httpx.get(pods.url + "/metrics", timeout=5).text)
    (labels,) = metrics.all("specdecode_verdict", target="vllm")
    return dict(labels)["verdict"], dict(labels)["basis"]


def test_what_spec_decode_costs_against_its_control_pod(starved: Pods) -> None:
    for _ in range(14):
        starved.step(5)
    status = httpx.get(starved.url + "/api/v1/status", timeout=5).json()
    window = series_status(status)["windows"]["1m"]
    versus = window["against_control"]
    assert versus["control"] == 'the control target "control"'
    assert versus["kv_cache_usage"] == pytest.approx(1.0) and versus["control_kv_cache_usage"] < 0.9
    assert versus["preemptions_per_request_increase"] > 0.05
    assert versus["throughput_ratio"] < 0.9  # queued, and serving fewer tokens than the control
    assert window["capacity"]["requests_waiting"] >= 1.0
    verdict = series_status(status)  # faster tokens (observed 1.30×), but it preempts: not paying off
    assert verdict["verdict"] == "marginal"
    assert verdict["verdict_reason"].startswith('observed 1.30× against the control target "control"')
    assert "more preemptions per request than the control (bound 0.05)" in verdict["verdict_reason"]
    assert metrics_verdict(starved) == ("marginal", "observed")
    metrics = Exposition.parse(httpx.get(starved.url + "/metrics", timeout=5).text)
    assert metrics.get("specdecode_preemptions_total", target="vllm", spec_decode="true") > 0
    assert metrics.get("specdecode_preemptions_total", target="control", spec_decode="false") == 0
    assert metrics.get("specdecode_kv_cache_usage_ratio", target="control", spec_decode="false") < 0.9
    page = httpx.get(starved.url + "/", timeout=5).text
    assert "Against the control target &quot;control&quot;:" in page and "preemptions per request" in page
    # The control pod's row counts what it served (it said "no traffic")
    control = series_status(status, "control")
    served = {name: window["latency"]["requests"] for name, window in control["windows"].items()}
    assert served["1m"] > 0 and "no traffic" not in page
    assert (f"spec decode off; requests finished: 1m {served['1m']:.0f} · 5m {served['5m']:.0f}; "
            f"{control['totals']['generated_tokens']:.0f} tokens generated since start") in page
    # One break-even, said with its basis in words
    assert verdict["cost_basis"] == "calibrated"
    assert verdict["cost_basis_words"].startswith("calibrated: the cost per drafted token at which")
    assert f"{verdict['break_even_acceptance_ratio']:.2f}<br><small>calibrated: the cost per drafted" in page


def rounded(parts: tuple[object, ...] | None) -> tuple[object, ...] | None:
    return None if parts is None else tuple(round(x, 9) if isinstance(x, float) else x for x in parts)


def test_a_window_read_later_compares_with_the_control_as_it_was_at_the_collection() -> None:
    """A window's parts are worked out at their first read (a scrape's render, the status API): the control
    target's view it compares with is the one published when its own collection published, not a newer one."""
    spec = ModelSpec(draft_memory_share=0.5, kv_cache_capacity_tokens=30_000, drafts_per_second=600.0)
    control = ModelSpec(spec_decode=False, kv_cache_capacity_tokens=30_000, drafts_per_second=600.0 * 3.25)
    read_at_once, read_later = Pods(spec, control), Pods(spec, control)
    try:
        for _ in range(13):
            at_once, later = read_at_once.step(5), read_later.step(5)
        at_once_windows = at_once[0].series[0].windows
        for window in at_once_windows:
            window.parts()  # read as soon as it was published
        read_later.stop_control()
        for _ in range(24):  # the control target publishes newer views meanwhile: down for 2 minutes
            read_later.step(5)
        assert read_later.exporter.views()[1].up is False
        later_windows = later[0].series[0].windows
        # Two pods' simulations agree to the last digits only: equal to 9 decimals
        assert [rounded(w.against_control) for w in at_once_windows] == [
            rounded(w.against_control) for w in later_windows]
        assert [rounded(w.observed) for w in at_once_windows] == [rounded(w.observed) for w in later_windows]
        assert all(w.observed is not None and w.against_control is not None for w in later_windows)
    finally:
        read_at_once.stop()
        read_later.stop()


def test_tensorrt_llms_gate_is_seen_from_its_generation_and_drafted_tokens() -> None:
    """TensorRT-LLM's own dialect counts no drafts (so no emitted tokens and no share): a stop is generation without
    a drafted token."""
    spec = ModelSpec(acceptance_rate=0.3, method="mtp", acceptance_rate_window_size=1300, acceptance_rate_threshold=0.5)
    harness = start_harness(steady_scenario(spec, fmt="trtllm"), url_path="/prometheus/metrics", windows="30s,1m")
    try:
        harness.collect()
        harness.step(5)
        # its draft counters appear with the first drafting iteration: no window counts them at both ends yet
        assert series_status(harness.status())["speculation"] is None
        for _ in range(7):
            harness.step(5)
        assert series_status(harness.status())["speculation"]["state"] == "speculating"
        for _ in range(24):  # the gate closes after 65 s
            harness.step(5)
        metrics = harness.metrics()
        assert metrics.get("specdecode_generated_tokens_total", spec_decode="true") > 0
        assert metrics.get("specdecode_speculative_token_share", window="30s") is None  # no emitted tokens to count
        stopped = series_status(harness.status())["speculation"]
        assert stopped["state"] == "stopped" and stopped["share"] == 0.0, stopped
    finally:
        harness.stop()
