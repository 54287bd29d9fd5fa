"""Simulator in each engine's format → sidecar → /metrics: the engine is detected with no config, and what the
sidecar exports is what can be computed exactly from that engine's exposition (and nothing it cannot)."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator

import httpx
import pytest

from specdecode_exporter.check.command import run_check
from specdecode_exporter.pipeline.engines import ALL_PREFIXES
from specdecode_exporter.pipeline.parse import select_samples
from specdecode_exporter.sidecar.config import TargetConfig
from specdecode_exporter.simulator import ModelSpec, default_scenario, steady_scenario
from tests.helpers import Harness, harness_fixture, start_harness

MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # ModelSpec's default name
STEP = 5.0


def run(harness: Harness, url: str, minutes: float = 2.0) -> dict[float, dict[str, float]]:
    """Collect every STEP simulated seconds; the raw spec samples the engine served at each collection."""
    raw: dict[float, dict[str, float]] = {}
    for _ in range(int(minutes * 60 / STEP)):
        view = harness.step(STEP)
        text = httpx.get(url, timeout=5).text  # the simulator's clock has not moved since the collection
        raw[harness.clock()] = {name_of(s.name, s.labels): s.value for s in select_samples(text, ALL_PREFIXES)}
        assert view.up, view.last_error
    return raw


def name_of(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    position = dict(labels).get("position", dict(labels).get("token_position"))
    return name if position is None else f"{name}[{position}]"


def one_minute(raw: dict[float, dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """The raw samples at the start and the end of the sidecar's latest 1m window (STEP apart, slack STEP/2)."""
    times = sorted(raw)
    return raw[times[-1] - 60.0], raw[times[-1]]


@pytest.fixture
def llamacpp() -> Iterator[Harness]:
    scenario = steady_scenario(ModelSpec(acceptance_rate=0.6, num_speculative_tokens=4), fmt="llamacpp")
    yield from harness_fixture(start_harness(scenario))


def test_llamacpp_is_exact_and_named_from_v1_models(llamacpp: Harness) -> None:
    raw = run(llamacpp, llamacpp.simulator_url + "/metrics")
    metrics = llamacpp.metrics()
    labels = {"target": "vllm", "model_name": MODEL}  # no model label in llama.cpp: from /v1/models
    assert metrics.get("specdecode_info", **labels, api="llamacpp", num_speculative_tokens="4") == 1
    assert not metrics.all("specdecode_info", engine="0")
    last = raw[max(raw)]
    assert metrics.get("specdecode_drafts_total", **labels) == last["llamacpp:spec_decode_num_drafts_total"]
    assert metrics.get("specdecode_draft_tokens_total", **labels) == last["llamacpp:spec_decode_num_draft_tokens_total"]
    assert metrics.get("specdecode_accepted_tokens_total", **labels) == \
        last["llamacpp:spec_decode_num_accepted_tokens_total"]
    start, end = one_minute(raw)
    delta = {name: end[name] - start[name] for name in end}
    drafts = delta["llamacpp:spec_decode_num_drafts_total"]
    w = {**labels, "window": "1m"}
    assert metrics.get("specdecode_acceptance_ratio", **w) == pytest.approx(
        delta["llamacpp:spec_decode_num_accepted_tokens_total"] / delta["llamacpp:spec_decode_num_draft_tokens_total"],
        rel=1e-12)
    assert metrics.get("specdecode_mean_acceptance_length", **w) == pytest.approx(
        1 + delta["llamacpp:spec_decode_num_accepted_tokens_total"] / drafts, rel=1e-12)
    for i in range(4):
        assert metrics.get("specdecode_position_acceptance_ratio", **w, position=str(i)) == pytest.approx(
            delta[f"llamacpp:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] / drafts, rel=1e-12)


def test_llamacpp_model_name_from_config_wins_also_on_reload(llamacpp: Harness) -> None:
    llamacpp.step(STEP)
    llamacpp.step(STEP)  # the fast path: the same lines as last time
    assert llamacpp.metrics().get("specdecode_info", target="vllm", model_name=MODEL, api="llamacpp") == 1
    target = TargetConfig(name="vllm", url=llamacpp.simulator_url + "/metrics", timeout=2.0, model_name="tiny")
    llamacpp.exporter.apply_config(dataclasses.replace(llamacpp.exporter.config, targets=(target,)))
    llamacpp.step(STEP)
    assert llamacpp.metrics().get("specdecode_info", target="vllm", model_name="tiny", api="llamacpp") == 1


@pytest.fixture
def sglang() -> Iterator[Harness]:
    scenario = steady_scenario(ModelSpec(acceptance_rate=0.7, engines=2), fmt="sglang")
    yield from harness_fixture(start_harness(scenario))


def test_sglang_exports_drafts_and_its_own_gauges_but_no_alpha(sglang: Harness) -> None:
    raw = run(sglang, sglang.simulator_url + "/metrics", minutes=1.5)
    metrics = sglang.metrics()
    counter = {"target": "vllm", "model_name": MODEL}  # the verify-call counter has no rank: no engine label
    infos = metrics.all("specdecode_info", **counter, api="sglang", num_speculative_tokens="3")
    assert sorted(dict(labels).get("engine", "") for labels in infos) == ["", "0", "1"]
    verify_calls = raw[max(raw)]["sglang:spec_verify_calls_total"]
    assert list(metrics.all("specdecode_drafts_total", **counter).values()) == [verify_calls]
    for name in ("specdecode_draft_tokens_total", "specdecode_accepted_tokens_total", "specdecode_acceptance_ratio",
                 "specdecode_mean_acceptance_length", "specdecode_position_acceptance_ratio",
                 "specdecode_expected_speedup"):
        assert metrics.all(name) == {}, f"{name} must be absent: SGLang exports no token counts"
    assert all(v == 0 for v in metrics.all("specdecode_interval_acceptance_ratio_count").values())
    for rank in ("0", "1"):
        per_rank = {**counter, "engine": rank}
        assert metrics.get("specdecode_reported_acceptance_length", **per_rank) == pytest.approx(1 + 0.7 * 3)
        assert metrics.get("specdecode_reported_acceptance_ratio", **per_rank) == pytest.approx(0.7)
        assert metrics.get("specdecode_drafts_total", **per_rank) is None  # the counter has no rank


@pytest.fixture
def trtllm() -> Iterator[Harness]:
    scenario = steady_scenario(ModelSpec(acceptance_rate=0.65, method="mtp"), fmt="trtllm")
    yield from harness_fixture(start_harness(scenario, url_path="/prometheus/metrics"))


def test_trtllm_alpha_is_exact_and_method_and_k_come_from_the_engine(trtllm: Harness) -> None:
    raw = run(trtllm, trtllm.simulator_url + "/prometheus/metrics")
    metrics = trtllm.metrics()
    labels = {"target": "vllm", "model_name": MODEL}
    assert metrics.get("specdecode_info", **labels, api="trtllm", method="mtp", num_speculative_tokens="3") == 1
    assert trtllm.status()["targets"][0]["method"] == "mtp"
    start, end = one_minute(raw)
    drafted = end["trtllm_spec_decode_num_draft_tokens_total"] - start["trtllm_spec_decode_num_draft_tokens_total"]
    accepted = end["trtllm_spec_decode_num_accepted_tokens_total"] - \
        start["trtllm_spec_decode_num_accepted_tokens_total"]
    w = {**labels, "window": "1m"}
    assert metrics.get("specdecode_acceptance_ratio", **w) == pytest.approx(accepted / drafted, rel=1e-12)
    # Drafts, their length and the accepted tokens per draft: from the per-position family (one clock).
    d = [end[f"trtllm_spec_decode_drafted_tokens_total[{i}]"] - start[f"trtllm_spec_decode_drafted_tokens_total[{i}]"]
         for i in range(3)]
    a = [end[f"trtllm_spec_decode_accepted_tokens_total[{i}]"] - start[f"trtllm_spec_decode_accepted_tokens_total[{i}]"]
         for i in range(3)]
    assert metrics.get("specdecode_mean_draft_length", **w) == pytest.approx(sum(d) / d[0], rel=1e-12)
    assert metrics.get("specdecode_mean_acceptance_length", **w) == pytest.approx(1 + sum(a) / d[0], rel=1e-12)
    for i in range(3):
        assert metrics.get("specdecode_position_acceptance_ratio", **w, position=str(i)) == pytest.approx(
            a[i] / d[i], rel=1e-12)
    assert metrics.get("specdecode_drafts_total", **labels) is None  # no drafts counter on the iteration clock
    assert metrics.get("specdecode_reported_acceptance_length", **labels) == pytest.approx(1 + 0.65 * 3)


def test_trtllm_draft_len_schedule_is_measured_not_taken_from_k() -> None:
    """k = 4 (max_draft_len), and at this load the schedule drafts 2: the sidecar's mean draft length, mean
    acceptance length and per-position curve follow what was drafted, where drafted tokens / k would say 4."""
    spec = ModelSpec(acceptance_rate=0.8, method="eagle3", num_speculative_tokens=4, drafts_per_second=400,
                     num_speculative_tokens_per_batch_size=((1, 8, 4), (9, 1024, 2)))
    harness = start_harness(steady_scenario(spec, fmt="trtllm"), url_path="/prometheus/metrics")
    try:
        raw = run(harness, harness.simulator_url + "/prometheus/metrics")
        start, end = one_minute(raw)
        d = [end.get(f"trtllm_spec_decode_drafted_tokens_total[{i}]", 0.0)
             - start.get(f"trtllm_spec_decode_drafted_tokens_total[{i}]", 0.0) for i in range(4)]
        a = [end.get(f"trtllm_spec_decode_accepted_tokens_total[{i}]", 0.0)
             - start.get(f"trtllm_spec_decode_accepted_tokens_total[{i}]", 0.0) for i in range(4)]
        assert d[0] > 0 and d[2] == d[3] == 0  # nothing drafted beyond position 1 at this batch size
        w = {"target": "vllm", "model_name": MODEL, "window": "1m"}
        metrics = harness.metrics()
        assert metrics.get("specdecode_info", target="vllm", model_name=MODEL, num_speculative_tokens="4") == 1
        assert metrics.get("specdecode_mean_draft_length", **w) == pytest.approx(2.0, rel=1e-9)
        length = metrics.get("specdecode_mean_acceptance_length", **w)
        assert length == pytest.approx(1 + sum(a) / d[0], rel=1e-12)
        alpha = metrics.get("specdecode_acceptance_ratio", **w)
        assert alpha is not None and length < 1 + 4 * alpha - 1.0  # far from what k = 4 would make of α
        assert metrics.get("specdecode_position_acceptance_ratio", **w, position="1") == pytest.approx(
            a[1] / d[1], rel=1e-12)
        assert metrics.get("specdecode_position_acceptance_ratio", **w, position="2") is None
    finally:
        harness.stop()


def test_trtllm_method_from_config_wins_and_plain_metrics_path_is_json(trtllm: Harness) -> None:
    config = trtllm.exporter.config
    target = TargetConfig(name="vllm", url=trtllm.simulator_url + "/prometheus/metrics", timeout=2.0, method="eagle")
    trtllm.exporter.apply_config(dataclasses.replace(config, targets=(target,)))
    trtllm.step(STEP)
    assert trtllm.metrics().get("specdecode_info", target="vllm", api="trtllm", method="eagle") == 1
    assert httpx.get(trtllm.simulator_url + "/metrics", timeout=5).json() == []


def test_tgi_is_a_collection_failure_with_its_reason() -> None:
    harness = start_harness(steady_scenario(ModelSpec(), fmt="tgi"))
    try:
        view = harness.step(STEP)
        assert not view.up
        assert view.last_error == "no_spec_metrics: TGI exports no drafted-token count: α cannot be computed"
        metrics = harness.metrics()
        assert metrics.get("specdecode_up", target="vllm") == 0
        assert metrics.get("specdecode_collect_errors_total", target="vllm", reason="no_spec_metrics") == 1
        assert metrics.all("specdecode_info") == {}
    finally:
        harness.stop()


def test_a_target_that_changes_dialect_is_followed() -> None:
    """The sidecar selects only the known engine's lines; when they are gone it looks at every dialect again."""
    harness = start_harness(steady_scenario(ModelSpec()))
    try:
        for fmt, api, error in (("v1", "vllm-v1", None), ("llamacpp", "llamacpp", None), ("tgi", None, "TGI exports"),
                                ("trtllm", None, "parse"), ("sglang", "sglang", None), ("v1", "vllm-v1", None)):
            harness.simulator.scenario = dataclasses.replace(harness.simulator.scenario, format=fmt)
            view = harness.step(STEP)
            assert view.up == (error is None), (fmt, view.last_error)
            if error is None:
                assert view.api == api
            else:
                assert error in (view.last_error or ""), (fmt, view.last_error)
    finally:
        harness.stop()


def test_a_diffusion_model_is_up_without_spec_figures_and_says_why() -> None:
    """vLLM serving a diffusion LLM: recognised (api vllm-diffusion), collected (up 1, no no_spec_metrics error, so
    SpecDecodeMetricsMissing cannot fire), no α; the status API, the page and `check` say the figures do not
    apply."""
    harness = start_harness(steady_scenario(ModelSpec(), fmt="vllm-diffusion"))
    try:
        for _ in range(3):
            view = harness.step(STEP)
            assert view.up, view.last_error
        metrics = harness.metrics()
        assert metrics.get("specdecode_up", target="vllm") == 1
        assert metrics.get("specdecode_info", target="vllm", model_name=MODEL, engine="0", api="vllm-diffusion") == 1
        assert metrics.get("specdecode_collect_errors_total", target="vllm", reason="no_spec_metrics") in (None, 0)
        for name in ("specdecode_acceptance_ratio", "specdecode_mean_acceptance_length",
                     "specdecode_mean_draft_length", "specdecode_expected_speedup", "specdecode_verdict"):
            assert metrics.all(name) == {}, name
        (target,) = harness.status()["targets"]  # type: ignore[attr-defined]
        assert target["api"] == "vllm-diffusion"
        assert target["not_applicable"] == "diffusion model: speculative decoding metrics do not apply"
        page = httpx.get(harness.sidecar_url + "/", timeout=5).text
        assert "diffusion model: speculative decoding metrics do not apply" in page
        out, err = io.StringIO(), io.StringIO()
        assert run_check(harness.simulator_url + "/metrics", 0.1, 2.0, out, err) == 0, err.getvalue()
        assert "api      vllm-diffusion" in out.getvalue()
        assert "diffusion model: speculative decoding metrics do not apply" in out.getvalue()
        assert "variance per drafted token" not in out.getvalue(), "nothing is drafted, nothing pages"
    finally:
        harness.stop()


def test_vllm_adaptive_verification_withholds_alpha_rather_than_guessing() -> None:
    """With adaptive verification declared and no verified-token counter, vLLM's drafted-token count may be the
    proposed tokens: the sidecar exports the drafts and accepted tokens, but no drafted tokens, no α and nothing
    built on it, so no rule can page on a guess; accepted per proposed token is exported as what it is, a lower bound
    of α; the status API and the page say why. Declared off again, α is back."""
    harness = start_harness(steady_scenario(ModelSpec(acceptance_rate=0.7)))
    try:
        plain = TargetConfig(name="vllm", url=harness.simulator_url + "/metrics", timeout=2.0)
        adaptive = dataclasses.replace(plain, adaptive_verification=True)
        harness.exporter.apply_config(dataclasses.replace(harness.exporter.config, targets=(adaptive,)))
        for _ in range(14):
            assert harness.step(STEP).up
        metrics = harness.metrics()
        series = {"target": "vllm", "model_name": MODEL, "engine": "0"}
        assert metrics.get("specdecode_drafts_total", **series)
        assert metrics.get("specdecode_accepted_tokens_total", **series)
        for name in ("specdecode_draft_tokens_total", "specdecode_acceptance_ratio", "specdecode_mean_draft_length",
                     "specdecode_expected_speedup", "specdecode_position_acceptance_ratio"):
            assert metrics.all(name) == {}, name
        w = {**series, "window": "1m"}
        lower_bound = metrics.get("specdecode_proposed_token_acceptance_ratio", **w)
        assert lower_bound == pytest.approx(0.7, rel=2e-3)  # nothing trimmed here: proposed = verified
        (target,) = harness.status()["targets"]  # type: ignore[attr-defined]
        assert "no vllm:spec_decode_num_verified_draft_tokens counter" in target["withheld"]
        assert "specdecode_proposed_token_acceptance_ratio instead" in target["withheld"]
        assert target["series"][0]["windows"]["1m"]["proposed_token_acceptance_ratio"] == pytest.approx(0.7, rel=2e-3)
        page = httpx.get(harness.sidecar_url + "/", timeout=5).text
        assert "no vllm:spec_decode_num_verified_draft_tokens counter" in page
        assert "1m ≥ 0.70 <small>(accepted per proposed token: a lower bound, not α)</small>" in page
        out, err = io.StringIO(), io.StringIO()  # `check --adaptive-verification`: the same refusal
        assert run_check(harness.simulator_url + "/metrics", 0.1, 2.0, out, err, adaptive_verification=True) == 0
        row = out.getvalue().splitlines()[4].split()  # the series' row: model, engine, α, α since start, mean
        # len, draft len, k, speedup, …
        assert row[:2] == [MODEL, "0"] and row[2:6] == ["–"] * 4 and row[7] == "–", out.getvalue()
        assert "Withheld: adaptive verification" in out.getvalue() and "No drafted tokens" not in out.getvalue()
        assert "variance per drafted token" not in out.getvalue()
        harness.exporter.apply_config(dataclasses.replace(harness.exporter.config, targets=(plain,)))
        for _ in range(3):
            harness.step(STEP)
        assert harness.metrics().get("specdecode_draft_tokens_total", **series)
        assert harness.metrics().all("specdecode_proposed_token_acceptance_ratio") == {}
        (target,) = harness.status()["targets"]  # type: ignore[attr-defined]
        assert target["withheld"] is None
    finally:
        harness.stop()


def test_the_packaged_trtllm_schedule_scenario_shows_the_draft_length_moving() -> None:
    """scenarios/trtllm-schedule.yaml: light load drafts 4 (max_draft_len), busy drafts 2; the 1m mean draft length
    follows, while k (spec_num_tokens) stays 4."""
    harness = start_harness(default_scenario("trtllm-schedule"), url_path="/prometheus/metrics")
    try:
        w = {"target": "vllm", "model_name": "meta-llama/Llama-3.1-70B-Instruct", "window": "1m"}
        lengths = []
        for _ in range(2):  # the end of each phase: light, busy
            for _ in range(int(120 / STEP)):
                assert harness.step(STEP).up
            lengths.append(harness.metrics().get("specdecode_mean_draft_length", **w))
        assert lengths == [pytest.approx(4.0), pytest.approx(2.0)]
        assert harness.metrics().get("specdecode_info", target="vllm", model_name=w["model_name"], api="trtllm",
                                     num_speculative_tokens="4") == 1
    finally:
        harness.stop()


@pytest.mark.parametrize(("counts", "alpha", "draft_length"), [("proposed", 1.376 / 3, 3.0), ("verified", 0.688, 2.0)])
def test_vllm_adaptive_verification_worked_example(counts: str, alpha: float, draft_length: float) -> None:
    """The issue's example: per-token acceptance 0.8, k = 3, half the steps trimmed to 1 before verification. If
    vLLM counts proposed tokens, α reads 0.46 and the model says 0.95× (hurting); if it counts verified ones, 0.69.
    The sidecar cannot tell which from the exposition: undeclared it shows whatever the counter says, declared
    (adaptive_verification: true) it withholds α rather than pick one."""
    spec = ModelSpec(num_speculative_tokens=3, position_acceptance=(0.8, 0.8, 0.8), adaptive_verification_share=0.5,
                     verified_draft_length=1, draft_tokens_count=counts)
    harness = start_harness(steady_scenario(spec))
    try:
        for _ in range(14):
            assert harness.step(STEP).up
        w = {"target": "vllm", "model_name": MODEL, "engine": "0", "window": "1m"}
        metrics = harness.metrics()
        assert metrics.get("specdecode_acceptance_ratio", **w) == pytest.approx(alpha, rel=2e-3)
        assert metrics.get("specdecode_mean_acceptance_length", **w) == pytest.approx(2.376, rel=2e-3)
        assert metrics.get("specdecode_mean_draft_length", **w) == pytest.approx(draft_length, rel=1e-3)
        if counts == "proposed":  # every draft counted 3 long: nothing tells the sidecar the trim happened
            assert metrics.get("specdecode_expected_speedup", **w) == pytest.approx(2.376 / 2.5, rel=2e-3)
        else:  # the length varies and vLLM counts no drafted tokens per position
            assert metrics.all("specdecode_position_acceptance_ratio") == {}
        target = TargetConfig(name="vllm", url=harness.simulator_url + "/metrics", timeout=2.0,
                              adaptive_verification=True)
        harness.exporter.apply_config(dataclasses.replace(harness.exporter.config, targets=(target,)))
        for _ in range(14):
            harness.step(STEP)
        metrics = harness.metrics()
        assert metrics.get("specdecode_acceptance_ratio", **w) is None
        assert metrics.get("specdecode_expected_speedup", **w) is None
        # accepted over vLLM's drafted count: the proposed reading's 0.46 is below α 0.69, the verified one's is α
        assert metrics.get("specdecode_proposed_token_acceptance_ratio", **w) == pytest.approx(alpha, rel=2e-3)
    finally:
        harness.stop()


def test_vllm_with_a_verified_token_counter_gives_alpha_over_verified_tokens_under_adaptive_verification() -> None:
    """The same worked example, on a vLLM that exports vllm:spec_decode_num_verified_draft_tokens (vllm#58340)
    beside its proposed count: α is accepted over verified tokens (0.69, not 0.46) and adaptive verification no
    longer withholds it; the lower bound is not exported, nothing says withheld."""
    spec = ModelSpec(num_speculative_tokens=3, position_acceptance=(0.8, 0.8, 0.8), adaptive_verification_share=0.5,
                     verified_draft_length=1, verified_draft_tokens_counter=True)
    harness = start_harness(steady_scenario(spec))
    try:
        target = TargetConfig(name="vllm", url=harness.simulator_url + "/metrics", timeout=2.0,
                              adaptive_verification=True)
        harness.exporter.apply_config(dataclasses.replace(harness.exporter.config, targets=(target,)))
        for _ in range(14):
            assert harness.step(STEP).up
        w = {"target": "vllm", "model_name": MODEL, "engine": "0", "window": "1m"}
        metrics = harness.metrics()
        assert metrics.get("specdecode_acceptance_ratio", **w) == pytest.approx(0.688, rel=2e-3)
        assert metrics.get("specdecode_mean_draft_length", **w) == pytest.approx(2.0, rel=1e-3)
        assert metrics.get("specdecode_mean_acceptance_length", **w) == pytest.approx(2.376, rel=2e-3)
        assert metrics.all("specdecode_proposed_token_acceptance_ratio") == {}
        (status,) = harness.status()["targets"]  # type: ignore[attr-defined]
        assert status["withheld"] is None
    finally:
        harness.stop()


def test_lossy_verification_is_said_of_alpha_without_new_series() -> None:
    """A target declared rejection_sample_method: fly (vLLM's lossy FLy verification counts overridden rejections as
    accepted): α is exported as before, the status API and the page say what it means; no series changes."""
    harness = start_harness(steady_scenario(ModelSpec(acceptance_rate=0.7)))
    try:
        for _ in range(3):
            assert harness.step(STEP).up
        before = harness.metrics()
        target = TargetConfig(name="vllm", url=harness.simulator_url + "/metrics", timeout=2.0,
                              rejection_sample_method="fly")
        harness.exporter.apply_config(dataclasses.replace(harness.exporter.config, targets=(target,)))
        for _ in range(3):
            assert harness.step(STEP).up
        metrics = harness.metrics()
        assert metrics.all("specdecode_info") == before.all("specdecode_info")  # the same info series
        assert {name for name, _ in metrics.samples} == {name for name, _ in before.samples}
        assert not any("fly" in value for _, labels in metrics.samples for _, value in labels)
        assert metrics.get("specdecode_acceptance_ratio", target="vllm", model_name=MODEL, engine="0",
                           window="1m") == pytest.approx(0.7, rel=2e-3)
        (status,) = harness.status()["targets"]  # type: ignore[attr-defined]
        assert status["verification"].startswith("lossy verification (rejection_sample_method fly)")
        assert "α reads higher than the target model" in httpx.get(harness.sidecar_url + "/", timeout=5).text
    finally:
        harness.stop()
