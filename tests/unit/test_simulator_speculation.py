"""The simulator's speculation behaviours: TensorRT-LLM's acceptance gate as it works since its #12905 (speculation
off for good once the mean acceptance rate of the last speculation iterations falls below a threshold), vLLM's
dynamic-SD schedule (k by batch size, 0 included, with the proposed scheduled-steps counter), and memory pressure (KV
cache, preemptions, a draft model's share of memory)."""

from __future__ import annotations

import itertools

import httpx
import pytest

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.simulator import ModelSpec, Scenario, Simulator, steady_scenario
from specdecode_exporter.simulator.model import LiveParams, compute_rates, position_fractions, step_k
from specdecode_exporter.simulator.requests import Call
from specdecode_exporter.simulator.scenario import parse_scenario_text
from specdecode_exporter.simulator.server import serve_in_thread
from specdecode_exporter.simulator.simulator import EngineSnapshot, RollingMean
from tests.helpers import Exposition

GATE = {"acceptance_rate_window_size": 1000, "acceptance_rate_threshold": 0.5}


def simulator(**spec: object) -> Simulator:
    return Simulator(steady_scenario(ModelSpec(**spec)), clock=lambda: 0.0, wall_epoch=1.7e9)  # type: ignore[arg-type]


def engine(sim: Simulator) -> EngineSnapshot:
    return sim.snapshot()[0].engines[0]


def test_the_rolling_mean_is_over_the_last_observations_only() -> None:
    mean = RollingMean(10)
    mean.add(6, 3.0)
    assert not mean.full and mean.mean == 3.0
    mean.add(8, 1.0)  # 2 of the first chunk remain
    assert mean.full and mean.mean == pytest.approx((2 * 3.0 + 8 * 1.0) / 10)
    mean.add(100, 2.0)
    assert mean.mean == pytest.approx(2.0) and len(mean.chunks) == 1


def test_the_gate_stops_speculation_for_good_while_generation_goes_on() -> None:
    sim = simulator(acceptance_rate=0.3, **GATE)  # acceptance rate 0.3 < 0.5
    sim.advance(30)
    early = engine(sim)
    assert early.speculating and early.drafts > 0, "a window not yet full never closes the gate"
    # 10 running requests at 0.05 s a step: 20 speculation iterations a second, the 1000th after 50 s
    sim.advance(60)
    stopped = engine(sim)
    assert not stopped.speculating
    sim.advance(60)
    later = engine(sim)
    assert (later.drafts, later.draft_tokens, later.accepted) == (stopped.drafts, stopped.draft_tokens,
                                                                  stopped.accepted)
    assert later.generation_tokens - stopped.generation_tokens == pytest.approx(200 * 60, abs=2)  # 1 token a step
    sim.restart()  # only a restart opens the gate again
    sim.advance(10)
    assert engine(sim).speculating and engine(sim).drafts > 0


def test_the_gate_stays_open_while_acceptance_is_above_its_threshold() -> None:
    sim = simulator(acceptance_rate=0.75, **GATE)
    sim.advance(600)
    assert engine(sim).speculating


def test_served_requests_feed_the_gate_and_stop_drafting_once_it_closed() -> None:
    """Served alone, each verification step of a request is an iteration: 64 tokens at α 0.3 take some 35 of
    them, so the 150-iteration window fills, and the gate closes, with the fourth or fifth request."""
    sim = simulator(acceptance_rate=0.3, drafts_per_second=0.0, acceptance_rate_window_size=150,
                    acceptance_rate_threshold=0.5)
    call = Call(False, "meta-llama/Llama-3.1-8B-Instruct", 64, False, False, 1, 0.0)
    served = 0
    while engine(sim).speculating and served < 10:
        assert sim.serve(call, 10)[0].spec_steps > 0
        served += 1
    assert not engine(sim).speculating and served in (4, 5)
    assert engine(sim).drafts >= 150 > engine(sim).drafts - 45  # closed by the request that filled the window
    (after,) = sim.serve(call, 10)
    assert after.spec_steps == 0 and after.steps == 64 and after.speculative  # the response still says spec metrics


SCHEDULE = ((1, 4, 3), (5, 16, 1), (17, 256, 0))


@pytest.mark.parametrize(("steps_per_second", "k"), [(40.0, 3), (200.0, 1), (2000.0, 0)])
def test_the_schedule_picks_k_by_the_batch_the_load_makes(steps_per_second: float, k: int) -> None:
    spec = ModelSpec(num_speculative_tokens_per_batch_size=SCHEDULE)
    assert step_k(spec, steps_per_second) == k
    rates = compute_rates(spec, LiveParams(0.75, steps_per_second), position_fractions(0.75, 3), k)
    assert rates.k == k and len(rates.per_pos) == k
    assert rates.draft_tokens == pytest.approx(rates.drafts * k)
    assert rates.generation_tokens == pytest.approx(rates.steps * (1 + sum(position_fractions(0.75, 3)[:k])))


def test_a_step_at_k_0_generates_without_drafts_and_is_counted() -> None:
    sim = simulator(drafts_per_second=2000.0, num_speculative_tokens_per_batch_size=SCHEDULE,
                    spec_decode_scheduled_steps=True)
    sim.advance(60)
    e = engine(sim)
    assert (e.drafts, e.draft_tokens) == (0, 0) and e.generation_tokens > 100_000
    assert e.scheduled_steps[0] > 0 and sum(e.scheduled_steps[1:]) == 0


def test_k_token_drafts_count_exactly_k_tokens_each_after_a_stretch_of_shorter_ones() -> None:
    """The sidecar calls a window's drafts shorter than k when its tokens per draft are below k by one part in a
    million: a schedule's stretch of short drafts must leave no fractional tokens behind that a later window of
    k-token drafts reads as a varying length. Both counters only grow, however often they are looked at."""
    sim = Simulator(parse_scenario_text(
        "models: [{name: m, num_speculative_tokens_per_batch_size: [[1, 16, 3], [17, 256, 2]]}]\n"
        "phases: [{name: light, duration: 30s}, {name: busy, duration: 30s, drafts_per_second: 613.77},"
        " {name: light-again, duration: 60s}]\n", "s.yaml"), clock=lambda: 0.0)
    seen: list[EngineSnapshot] = []
    for _ in range(int(120 / 0.37)):  # observed at an odd interval, mid-step
        sim.advance(0.37)
        seen.append(engine(sim))
    assert all(b.drafts >= a.drafts and b.draft_tokens >= a.draft_tokens for a, b in itertools.pairwise(seen))
    at = {round(0.37 * (i + 1), 2): e for i, e in enumerate(seen)}

    def length(start: float, end: float) -> float:
        a, b = at[start], at[end]
        return (b.draft_tokens - a.draft_tokens) / (b.drafts - a.drafts)

    assert length(0.37, 29.6) == 3.0  # light: 200 drafts/s, 10 running
    assert length(31.08, 59.57) == 2.0  # busy: about 25 running, k = 2 above 16
    assert length(61.05, 119.88) == 3.0  # exactly 3 again, not 3 less a token's fraction
    assert 2.0 < length(0.37, 119.88) < 3.0
    busy_a, busy_b = at[31.08], at[59.57]
    assert busy_b.per_pos[2] == busy_a.per_pos[2], "no draft reached the third position"


def served_metrics(sim: Simulator) -> Exposition:
    server, url = serve_in_thread(sim)
    try:
        return Exposition.parse(httpx.get(url + "/metrics", timeout=5).text)
    finally:
        server.stop()


def test_the_scheduled_steps_family_is_served_only_when_asked_like_the_proposed_counter() -> None:
    sim = simulator(drafts_per_second=200.0, num_speculative_tokens_per_batch_size=SCHEDULE,
                    spec_decode_scheduled_steps=True)
    sim.advance(60)
    served = served_metrics(sim)
    by_k = served.all("vllm:spec_decode_scheduled_steps_total")
    assert {dict(labels)["num_spec_tokens"] for labels in by_k} == {"0", "1", "2", "3"}  # every k, 0 included
    assert served.get("vllm:spec_decode_scheduled_steps_total", num_spec_tokens="1") > 0
    drafts = served.get("vllm:spec_decode_num_drafts_total")
    assert served.get("vllm:spec_decode_num_draft_tokens_total") == drafts  # k = 1 at this load
    plain = simulator(drafts_per_second=200.0)
    plain.advance(10)
    assert not served_metrics(plain).all("vllm:spec_decode_scheduled_steps_total")


def test_a_draft_models_memory_makes_the_spec_pod_preempt_and_queue_where_the_control_pod_does_not() -> None:
    # the spec pod runs at most 30000 × 0.6 / (512 + 128 + 3) ≈ 28 requests, the control pod 30000 / 640 ≈ 47
    spec = ModelSpec(draft_memory_share=0.4, kv_cache_capacity_tokens=30_000)
    control = ModelSpec(spec_decode=False, kv_cache_capacity_tokens=30_000)
    fractions = position_fractions(0.75, 3)
    spec_rates = compute_rates(spec, LiveParams(0.75, 600.0), fractions)
    control_rates = compute_rates(control, LiveParams(0.75, 600.0 * 3.25), (0.0,) * 3)  # the same tokens wanted
    assert 600.0 * 0.05 > 28 and 600.0 * 3.25 * 0.02 < 47  # in flight: spec 30, control 39
    assert spec_rates.kv_cache_usage == pytest.approx(1.0) and spec_rates.preemptions > 0
    assert spec_rates.waiting > 0 and spec_rates.steps < 600.0  # it serves only what fits
    assert control_rates.preemptions == 0 and control_rates.waiting == 0 and control_rates.kv_cache_usage < 1.0
    assert spec_rates.generation_tokens < control_rates.generation_tokens  # the throughput cut


def test_light_load_fits_and_nothing_changes() -> None:
    rates = compute_rates(ModelSpec(), LiveParams(0.75, 200.0), position_fractions(0.75, 3))
    assert rates.steps == rates.drafts == 200.0 and rates.preemptions == 0 and rates.waiting == 0


def test_preemptions_and_kv_usage_are_served_as_vllm_names_them() -> None:
    sim = simulator(kv_cache_capacity_tokens=20_000, draft_memory_share=0.4, drafts_per_second=600.0)
    sim.advance(60)
    served = served_metrics(sim)
    assert served.get("vllm:num_preemptions_total", engine="0") > 0
    assert served.get("vllm:kv_cache_usage_perc", engine="0") == 1.0


@pytest.mark.parametrize(("text", "error"), [
    ("models: [{name: m, acceptance_rate_window_size: 10}]\n",
     "s.yaml: models[0].acceptance_rate_window_size: acceptance_rate_window_size and acceptance_rate_threshold go "
     "together"),
    ("models: [{name: m, acceptance_rate_window_size: 10, acceptance_rate_threshold: 2.4}]\n",
     "s.yaml: models[0].acceptance_rate_threshold: expected a number between 0 and 1"),
    ("models: [{name: m, acceptance_window: 300, acceptance_length_threshold: 2.4}]\n",
     "s.yaml: models[0].acceptance_window: TensorRT-LLM's gate is acceptance-rate based since its #12905: use "
     "acceptance_rate_window_size (older releases' acceptance_window averaged the acceptance length"),
    ("models: [{name: m, num_speculative_tokens_per_batch_size: [[2, 4, 3]]}]\n",
     "s.yaml: models[0].num_speculative_tokens_per_batch_size[0]: ranges must start at 1"),
    ("models: [{name: m, num_speculative_tokens_per_batch_size: [[1, 8, 3], [4, 16, 1]]}]\n",
     "s.yaml: models[0].num_speculative_tokens_per_batch_size[1]: ranges must start at 1 and be sorted"),
    ("models: [{name: m, num_speculative_tokens_per_batch_size: [[1, 8]]}]\n",
     "s.yaml: models[0].num_speculative_tokens_per_batch_size[0]: expected [low, high, k]"),
    ("models: [{name: m, num_speculative_tokens_per_batch_size: [[1, 8, -1]]}]\n",
     "s.yaml: models[0].num_speculative_tokens_per_batch_size[0]: expected 0 < low <= high and k >= 0"),
    ("models: [{name: m, draft_memory_share: 1.5}]\n", "s.yaml: models[0].draft_memory_share: expected a number"),
])
def test_bad_speculation_keys_are_one_line_errors(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_scenario_text(text, "s.yaml")
    assert str(caught.value).startswith(error), str(caught.value)


def test_the_keys_read_from_a_scenario() -> None:
    scenario = parse_scenario_text(
        "models: [{name: m, acceptance_rate_window_size: 50, acceptance_rate_threshold: 0.55, "
        "spec_decode_scheduled_steps: true, num_speculative_tokens_per_batch_size: [[1, 8, 3], [9, 64, 1]], "
        "draft_memory_share: 0.3}]\n", "s.yaml")
    (model,) = scenario.models
    assert (model.acceptance_rate_window_size, model.acceptance_rate_threshold) == (50, 0.55)
    assert model.num_speculative_tokens_per_batch_size == ((1, 8, 3), (9, 64, 1))
    assert model.spec_decode_scheduled_steps and model.draft_memory_share == 0.3
    assert isinstance(Simulator(Scenario(models=(model,)), clock=lambda: 0.0), Simulator)
