"""The tap's recorder keeps its label sets bounded without letting a hostile client crowd out the real model; the
counts of two tap processes combine into one; the router's break-even per model."""

from __future__ import annotations

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.stats.dispersion import Moments, Variance, WindowVariance
from specdecode_exporter.sidecar.expose import RequestsCollector
from specdecode_exporter.tap import TapRequest, TapResult
from specdecode_exporter.tap.process import break_even_for
from specdecode_exporter.tap.request_stats import NO_REQUESTS, OTHER, RequestRecorder, combined
from tests.tap.harness import tap_settings

METRICS = {"speculative_decoding": {"num_draft_tokens": 30, "num_accepted_draft_tokens": 21, "num_spec_steps": 10}}


def request(model: str) -> TapRequest:
    return TapRequest("POST", "/v1/completions", "completions", model, 0.0, False, 1, "chat", False)


def answered(status: int) -> TapResult:
    metrics = METRICS if status == 200 else None
    return TapResult(status, metrics, None, None, None if status == 200 else "upstream_error", 0.0, 0.1, 0.2)


def test_model_names_the_upstream_never_served_take_no_slot() -> None:
    recorder = RequestRecorder(tap_settings(), max_models=4)
    for i in range(50):  # a client naming models vLLM does not serve: 404s
        recorder.observe(request(f"junk-{i}"), answered(404))
    recorder.observe(request("llama"), answered(200))
    view = recorder.view()
    assert {key.model_name for key in view.bands} == {"llama"}
    assert {model for model, _ in view.without_metrics} == {OTHER}
    assert sum(view.without_metrics.values()) == 50
    assert recorder.band_key(request("llama")).model_name == "llama"
    assert recorder.band_key(request("junk-1")).model_name == OTHER


def test_served_model_names_are_capped() -> None:
    recorder = RequestRecorder(tap_settings(), max_models=2)
    for name in ("a", "b", "c", "a"):
        recorder.observe(request(name), answered(200))
    view = recorder.view()
    assert sorted(key.model_name for key in view.bands) == ["a", "b", OTHER]
    assert view.bands[recorder.band_key(request("a"))].requests == 2


def test_two_recorders_combined_count_as_one() -> None:
    """A tap process that died and the one started after it (tap/process.py): one recorder's counts."""
    first, then, both = (RequestRecorder(tap_settings()) for _ in range(3))
    for recorder, models in ((first, ["a", "a", "b"]), (then, ["a", "c"])):
        for name in models:
            for each in (recorder, both):
                each.observe(request(name), answered(200))
                each.observe(request(name), answered(500))
    assert combined(first.view(), then.view()) == both.view()
    assert combined(NO_REQUESTS, then.view()) == then.view()


def test_break_even_is_the_models_own_when_the_target_serves_several() -> None:
    assert break_even_for((("a", 0.4), ("a", 0.6), ("b", 0.9)), "a") == 0.5
    assert break_even_for((("a", 0.4),), "any name a client uses") == 0.4  # one model answers for all names
    assert break_even_for((("a", 0.4), ("b", 0.9)), "c") is None
    assert break_even_for((), "a") is None


def test_the_variance_sums_are_per_model_over_every_class_and_exported() -> None:
    """Σ D, Σ A, Σ D², Σ A², Σ A·D per model, whatever the workload and temperature (the page's pooled α), from
    vLLM's metrics and llama.cpp's timings alike; exposed as counters per model beside the gauge per window."""
    recorder = RequestRecorder(tap_settings())
    chat = TapRequest("POST", "/v1/completions", "completions", "llama", 0.0, False, 1, "chat", False)
    code = TapRequest("POST", "/v1/completions", "completions", "llama", 0.9, False, 1, "code", False)
    recorder.observe(chat, answered(200))  # D 30, A 21, 10 steps
    recorder.observe(code, TapResult(200, None, {"draft_n": 12, "draft_n_accepted": 3}, None, None, 0.0, 0.1, 0.2))
    view = recorder.view()
    assert len(view.bands) == 2
    assert view.moments == {"llama": Moments(2, 42, 24, 30 * 30 + 12 * 12, 21 * 21 + 3 * 3, 21 * 30 + 3 * 12, 10, 30)}
    registry = CollectorRegistry(auto_describe=True)
    rows = [WindowVariance("llama", "5m", Variance(1.83, "assumed", 2))]
    registry.register(RequestsCollector(lambda: view, lambda: {"target": "vllm"}, lambda: None, variances=lambda: rows))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    per_model = (("model_name", "llama"), ("target", "vllm"))
    assert samples[(m.REQUEST_DRAFT_TOKENS_SQUARED.exposed_name, per_model)] == 1044
    assert samples[(m.REQUEST_ACCEPTED_TOKENS_SQUARED.exposed_name, per_model)] == 450
    assert samples[(m.REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT.exposed_name, per_model)] == 666
    gauge = (("model_name", "llama"), ("source", "assumed"), ("target", "vllm"), ("window", "5m"))
    assert samples[(m.ACCEPTANCE_VARIANCE.name, gauge)] == 1.83
