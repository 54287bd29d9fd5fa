"""vLLM's proposed per-request α histogram (vllm:request_spec_decode_acceptance_rate, vllm#44487) read from a
simulated vLLM that serves it and re-exported reset-safe: every bucket equals the count of the API responses'
own α at or below it, across a vLLM restart; without the family (every released vLLM) nothing is exported."""

from __future__ import annotations

import math

import httpx
import pytest

from specdecode_exporter.simulator import ModelSpec, steady_scenario
from specdecode_exporter.simulator.model import Workload
from tests.helpers import Harness, start_harness

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAMILY = "specdecode_engine_request_acceptance_ratio"
MIXED = ModelSpec(drafts_per_second=0.0, request_acceptance_histogram=True, workloads=(
    Workload("structured", 0.6, 0.82, 0.0), Workload("creative", 0.4, 0.38, 1.0)))


def request_alphas(harness: Harness, count: int) -> list[float]:
    alphas = []
    for i in range(count):
        body = httpx.post(harness.simulator_url + "/v1/completions", timeout=5, json={
            "model": MODEL, "prompt": "x", "max_tokens": 40 + i, "temperature": 0.9 if i % 3 == 0 else 0.1}).json()
        spec = body["metrics"]["speculative_decoding"]
        alphas.append(spec["num_accepted_draft_tokens"] / spec["num_draft_tokens"])
    return alphas


def assert_exported(harness: Harness, alphas: list[float]) -> None:
    metrics = harness.metrics()
    buckets = metrics.all(f"{FAMILY}_bucket", engine="0", model_name=MODEL)
    assert buckets, "the family is not exported"
    for labels, value in buckets.items():
        le = float(dict(labels)["le"])
        assert value == sum(1 for a in alphas if a <= le), f"le={le}"
    assert metrics.get(f"{FAMILY}_count", engine="0") == len(alphas)
    assert metrics.get(f"{FAMILY}_sum", engine="0") == pytest.approx(math.fsum(alphas))


def test_the_engines_per_request_histogram_is_each_requests_alpha_and_survives_a_restart() -> None:
    harness = start_harness(steady_scenario(MIXED))
    try:
        harness.collect()
        alphas = request_alphas(harness, 12)
        assert min(alphas) < 0.5 < max(alphas)  # both workloads, so the buckets are not all alike
        harness.step(5)
        assert_exported(harness, alphas)
        harness.simulator.restart()
        alphas += request_alphas(harness, 6)
        harness.step(5)
        assert_exported(harness, alphas)
        assert harness.metrics().get("specdecode_source_restarts_total", engine="0") == 1
    finally:
        harness.stop()


def test_released_vllm_has_no_such_family_and_none_is_exported() -> None:
    harness = start_harness(steady_scenario(ModelSpec(drafts_per_second=0.0)))
    try:
        request_alphas(harness, 2)
        harness.step(5)
        assert "vllm:request_spec_decode_acceptance_rate" not in httpx.get(harness.simulator_url + "/metrics").text
        assert not harness.metrics().all(f"{FAMILY}_count")
    finally:
        harness.stop()
