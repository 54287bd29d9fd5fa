"""Simulator core: counters, α exactness, phases, restarts, V0 sum-of-sums, clock and time scale."""

from __future__ import annotations

import dataclasses

import pytest

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.simulator import ModelSpec, Phase, Scenario, Simulator, default_scenario
from specdecode_exporter.simulator.requests import Call
from specdecode_exporter.simulator.simulator import EngineSnapshot


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def steady(fmt: str = "v1", **kw: object) -> Simulator:
    spec = ModelSpec(**kw)  # type: ignore[arg-type]
    return Simulator(Scenario(models=(spec,), format=fmt), clock=lambda: 0.0, wall_epoch=1.7e9)


def engine(sim: Simulator, model: int = 0, index: int = 0) -> EngineSnapshot:
    return sim.snapshot()[model].engines[index]


@pytest.mark.parametrize(("alpha", "k", "dps", "fill"), [
    (0.75, 3, 200.0, 1.0), (0.35, 5, 37.3, 1.0), (0.62, 4, 1234.5, 0.55), (0.0, 2, 50.0, 1.0), (1.0, 3, 10.0, 1.0),
])
def test_interval_ratio_equals_configured_alpha(alpha: float, k: int, dps: float, fill: float) -> None:
    sim = steady(acceptance_rate=alpha, num_speculative_tokens=k, drafts_per_second=dps, draft_fill=fill)
    sim.advance(123.4)
    a = engine(sim)
    sim.advance(3600)
    b = engine(sim)
    d_draft, d_acc = b.draft_tokens - a.draft_tokens, b.accepted - a.accepted
    assert d_draft > 0
    assert abs(d_acc / d_draft - alpha) <= (2 * k + 2) / d_draft
    assert b.accepted == sum(b.per_pos)
    if fill == 1.0:
        assert b.draft_tokens == k * b.drafts
    assert all(isinstance(x, int) for x in (b.drafts, b.draft_tokens, b.accepted, *b.per_pos))


def test_per_position_counts_decrease_with_position() -> None:
    sim = steady(acceptance_rate=0.7, num_speculative_tokens=6)
    sim.advance(600)
    e = engine(sim)
    assert list(e.per_pos) == sorted(e.per_pos, reverse=True)
    assert e.per_pos[0] <= e.drafts
    assert e.per_pos[-1] > 0


def test_explicit_position_acceptance_is_conditional() -> None:
    sim = steady(num_speculative_tokens=3, position_acceptance=(0.8, 0.5, 0.5), drafts_per_second=1000.0)
    sim.advance(100)
    e = engine(sim)
    assert [p / e.drafts for p in e.per_pos] == pytest.approx([0.8, 0.4, 0.2], abs=1e-5)


def test_counters_do_not_depend_on_how_often_they_are_observed() -> None:
    def run(step: float) -> EngineSnapshot:
        sim = steady(noise=0.1, drafts_per_second=77.7)
        t = 0.0
        while t < 300.0:
            sim.advance(step)
            sim.snapshot()
            t += step
        return engine(sim)

    assert dataclasses.astuple(run(0.5))[:7] == dataclasses.astuple(run(30.0))[:7]


def test_noise_is_seeded() -> None:
    def drafts(seed: int) -> int:
        sim = Simulator(Scenario(models=(ModelSpec(noise=0.2),), seed=seed), clock=lambda: 0.0)
        sim.advance(100)
        return engine(sim).drafts

    assert drafts(1) == drafts(1)
    assert drafts(1) != drafts(2)


def test_fake_clock_and_time_scale() -> None:
    clock = FakeClock()
    sim = Simulator(Scenario(models=(ModelSpec(drafts_per_second=10.0),)), clock=clock, time_scale=60.0)
    assert engine(sim).drafts == 0
    clock.t += 1.0  # one real second = one simulated minute
    assert engine(sim).drafts == 600
    sim.advance(60)  # manual advance adds simulated seconds
    assert engine(sim).drafts == 1200
    assert sim.state()["sim_time_seconds"] == pytest.approx(120.0)


def test_time_scale_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="time_scale"):
        Simulator(Scenario(), clock=lambda: 0.0, time_scale=0)


def test_restart_resets_counters_and_changes_created() -> None:
    sim = steady()
    sim.advance(50)
    before = engine(sim)
    sim.restart()
    after = engine(sim)
    assert before.drafts > 0
    assert (after.drafts, after.accepted, after.generation_tokens, after.per_pos[0]) == (0, 0, 0, 0)
    assert after.histograms["itl"].count == 0
    assert after.created == pytest.approx(before.created + 50.0)
    sim.advance(10)
    assert engine(sim).drafts == 2000


def test_demo_scenario_phases_restart_and_loop() -> None:
    sim = Simulator(default_scenario("demo"), clock=lambda: 0.0)
    phases = sim.scenario.phases
    assert [p.name for p in phases] == ["healthy", "degraded", "restart", "recovered", "busy"]
    assert sim.scenario.loop
    sim.advance(10)
    assert sim.state()["phase"]["name"] == "healthy"
    sim.advance(phases[0].duration)  # into degraded
    a = engine(sim)
    assert sim.state()["phase"]["name"] == "degraded"
    sim.advance(60)
    b = engine(sim)
    assert (b.accepted - a.accepted) / (b.draft_tokens - a.draft_tokens) == pytest.approx(0.35, abs=1e-3)
    restart_at = phases[0].duration + phases[1].duration
    sim.advance(restart_at + 5 - sim.state()["sim_time_seconds"])
    c = engine(sim)
    assert sim.state()["phase"]["name"] == "restart"
    assert c.drafts < b.drafts
    assert c.created == pytest.approx(b.created + restart_at)
    total = sum(p.duration for p in phases)
    sim.advance(total + 1 - sim.state()["sim_time_seconds"])
    assert sim.state()["phase"]["name"] == "healthy"  # looped


def test_phase_for_one_model_leaves_the_other_alone() -> None:
    a, b = ModelSpec(name="a", acceptance_rate=0.8), ModelSpec(name="b", acceptance_rate=0.8)
    scenario = Scenario(models=(a, b), phases=(Phase(name="bad-a", duration=100.0, acceptance_rate=0.2, model="a"),))
    sim = Simulator(scenario, clock=lambda: 0.0)
    sim.advance(50)
    snap = sim.snapshot()
    assert snap[0].engines[0].accepted / snap[0].engines[0].draft_tokens == pytest.approx(0.2, abs=1e-3)
    assert snap[1].engines[0].accepted / snap[1].engines[0].draft_tokens == pytest.approx(0.8, abs=1e-3)


def test_non_looping_last_phase_holds() -> None:
    scenario = Scenario(phases=(Phase("a", 10.0, acceptance_rate=0.9), Phase("b", 10.0, acceptance_rate=0.4)))
    sim = Simulator(scenario, clock=lambda: 0.0)
    sim.advance(1000)
    assert sim.state()["phase"]["name"] == "b"
    assert sim.live_params(scenario.models[0]).acceptance_rate == 0.4


def test_override_pauses_phases_until_resume() -> None:
    sim = Simulator(default_scenario("demo"), clock=lambda: 0.0)
    sim.advance(5)
    sim.set_override(acceptance_rate=0.2)
    a = engine(sim)
    sim.advance(1000)
    b = engine(sim)
    state = sim.state()
    assert state["paused"] and state["phase"]["name"] == "healthy"
    assert (b.accepted - a.accepted) / (b.draft_tokens - a.draft_tokens) == pytest.approx(0.2, abs=1e-3)
    sim.resume()
    sim.advance(sim.scenario.phases[0].duration)
    assert sim.state()["phase"]["name"] == "degraded"
    with pytest.raises(ConfigError, match="unknown model"):
        sim.set_override(model="nope", acceptance_rate=0.5)
    sim.goto_phase("recovered")
    assert sim.state()["phase"]["name"] == "recovered"


def test_a_served_request_counts_exactly_what_it_reports() -> None:
    sim = steady(drafts_per_second=0.0)
    call = Call(chat=False, model=sim.model_names()[0], max_tokens=40, stream=False, include_usage=False, n=1,
                temperature=0.0)
    (generation,) = sim.serve(call, prompt_tokens=7)
    e = engine(sim)
    assert (e.prompt_tokens, e.generation_tokens, e.requests["length"]) == (7, 40, 1)
    assert (e.drafts, e.draft_tokens, e.accepted) == (generation.spec_steps, generation.drafted, generation.accepted)
    assert sum(e.per_pos) == generation.accepted
    assert e.histograms["e2e"].count == 1 and e.histograms["tpot"].count == 1


def test_faults_from_phase_and_manual() -> None:
    sim = Simulator(Scenario(phases=(Phase("ok", 10.0), Phase("broken", 10.0, fault="http_500"))),
                    clock=lambda: 0.0)
    assert sim.fault == "none"
    sim.advance(11)
    assert sim.fault == "http_500"
    sim.set_fault("garbage")
    assert sim.fault == "garbage"
    sim.set_fault("none")
    assert sim.fault == "http_500"
    with pytest.raises(ConfigError):
        sim.set_fault("explode")


# ----- V0 -----
def test_v0_series_appear_only_after_the_first_report() -> None:
    sim = steady("v0")
    sim.advance(4.9)
    assert engine(sim).v0 is None
    sim.advance(0.1)
    assert engine(sim).v0 is not None


def test_v0_counters_are_sums_of_lifetime_totals() -> None:
    k = 4
    sim = steady("v0", num_speculative_tokens=k, acceptance_rate=0.7, drafts_per_second=123.0)
    lifetimes: list[tuple[int, int, int]] = []
    for _ in range(6):
        sim.advance(5.0)
        v0 = engine(sim).v0
        assert v0 is not None
        lifetimes.append((v0.lifetime_accepted, v0.lifetime_draft, v0.lifetime_emitted))
        assert (v0.accepted_total, v0.draft_total, v0.emitted_total) == tuple(
            sum(lt[i] for lt in lifetimes) for i in range(3))
        assert v0.acceptance_rate == v0.lifetime_accepted / v0.lifetime_draft
        drafts = v0.lifetime_draft // k
        assert v0.lifetime_draft == drafts * k
        assert v0.efficiency == pytest.approx(v0.lifetime_emitted / (drafts * (k + 1)))
        assert v0.acceptance_rate == pytest.approx(0.7, abs=1e-3)
    # Between reports nothing changes.
    before = engine(sim).v0
    sim.advance(4.0)
    assert engine(sim).v0 == before


def test_v0_idle_engine_stops_reporting_and_restart_hides_series() -> None:
    sim = Simulator(Scenario(models=(ModelSpec(),), format="v0",
                             phases=(Phase("busy", 10.0), Phase("idle", 100.0, drafts_per_second=0.0))),
                    clock=lambda: 0.0)
    sim.advance(12)
    busy = engine(sim).v0
    sim.advance(50)
    assert engine(sim).v0 == busy
    sim.restart()
    assert engine(sim).v0 is None


def test_v0_rejects_engines() -> None:
    from specdecode_exporter.simulator import scenario_from_dict

    with pytest.raises(ConfigError, match=r"models\[0\]\.engines"):
        scenario_from_dict({"format": "v0", "models": [{"name": "m", "engines": 2}]}, "s.yaml")
