"""The simulator's OpenAI API over real HTTP: vLLM's response shapes (compared with the real captures), the
per-request metrics summing exactly to the counters, temperature and workload dependence, a control pod, load."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httpx
import pytest

from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.model import LiveParams, Workload, compute_rates, position_fractions
from specdecode_exporter.simulator.server import serve_in_thread
from tests.helpers import Exposition, fixture_text
from tests.tap.fake_vllm import fixture_events, without_usage

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MIXED = ModelSpec(drafts_per_second=0.0, cost_per_draft_token=0.5, workloads=(
    Workload("structured", 0.6, 0.82, 0.0), Workload("creative", 0.4, 0.38, 1.0)))


@contextlib.contextmanager
def serving(spec: ModelSpec, **options: object) -> Iterator[tuple[Simulator, str]]:
    sim = Simulator(steady_scenario(spec), clock=lambda: 0.0, **options)  # type: ignore[arg-type]
    server, url = serve_in_thread(sim)
    try:
        yield sim, url
    finally:
        server.stop()


@pytest.fixture
def api() -> Iterator[tuple[Simulator, str]]:
    with serving(ModelSpec(drafts_per_second=0.0)) as served:
        yield served


def counters(url: str) -> tuple[float, float, float]:
    metrics = Exposition.parse(httpx.get(url + "/metrics").text)
    return (metrics.get("vllm:spec_decode_num_drafts_total", engine="0") or 0.0,
            metrics.get("vllm:spec_decode_num_draft_tokens_total", engine="0") or 0.0,
            metrics.get("vllm:spec_decode_num_accepted_tokens_total", engine="0") or 0.0)


def sse(body: str) -> list[dict[str, object] | str]:
    events = [e.removeprefix("data: ") for e in body.split("\n\n") if e]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def test_non_streamed_completion_has_vllms_shape(api: tuple[Simulator, str]) -> None:
    _, url = api
    real = json.loads(fixture_text("vllm_0.32.0/completion_nonstream.json"))
    body = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 40,
                                                     "temperature": 0}).json()
    assert set(real["metrics"]) == set(body["metrics"])
    assert set(real["metrics"]["speculative_decoding"]) == set(body["metrics"]["speculative_decoding"])
    assert {"id", "object", "created", "model", "choices", "usage", "metrics"} <= set(body)
    spec = body["metrics"]["speculative_decoding"]
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
    assert sum(j * n for j, n in enumerate(spec["acceptance_histogram"])) == spec["num_accepted_draft_tokens"]
    assert spec["num_draft_tokens"] == 3 * spec["num_spec_steps"]
    assert body["usage"]["completion_tokens"] == 40


def test_per_request_numbers_sum_to_the_counters(api: tuple[Simulator, str]) -> None:
    _, url = api
    before = counters(url)
    sums = [0, 0, 0]
    for i in range(12):
        body = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 30 + i,
                                                         "temperature": (i % 3) / 2}).json()
        spec = body["metrics"]["speculative_decoding"]
        for j, key in enumerate(("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")):
            sums[j] += spec[key]
    after = counters(url)
    assert tuple(a - b for a, b in zip(after, before, strict=True)) == tuple(sums)


def test_streams_carry_metrics_only_on_the_usage_chunk(api: tuple[Simulator, str]) -> None:
    _, url = api
    request = {"model": MODEL, "prompt": "x", "max_tokens": 20, "stream": True}
    with_usage = sse(httpx.post(url + "/v1/completions",
                                json={**request, "stream_options": {"include_usage": True}}).text)
    assert with_usage[-1] == "[DONE]"
    usage = with_usage[-2]
    assert isinstance(usage, dict) and usage["choices"] == [] and "speculative_decoding" in usage["metrics"]
    assert all("metrics" not in e for e in with_usage[:-2] if isinstance(e, dict))
    without = sse(httpx.post(url + "/v1/completions", json=request).text)
    assert without[-1] == "[DONE]" and all(isinstance(e, dict) and e["choices"] for e in without[:-1])
    text = "".join(e["choices"][0]["text"] for e in without[:-1] if isinstance(e, dict))  # type: ignore[index]
    assert len(text.split()) + text.count(".") >= 1


def test_chat_completion_streamed_starts_with_the_role(api: tuple[Simulator, str]) -> None:
    _, url = api
    events = sse(httpx.post(url + "/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True,
        "stream_options": {"include_usage": True}}).text)
    first = events[0]
    assert isinstance(first, dict) and first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # type: ignore[index]
    body = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": [], "max_tokens": 5}).json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"


def shape(value: object) -> object:
    """A JSON value's structure: each object's keys in order with their values' shapes, a list by its first item,
    a leaf by its type (the text, ids and numbers differ from run to run; their places must not)."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def stream_shape(events: list[dict[str, object] | str]) -> list[object]:
    """The shapes of a stream's events, a run of the same shape as one (streams differ in their number of steps)."""
    shapes = [shape(e) for e in events]
    return [s for i, s in enumerate(shapes) if i == 0 or s != shapes[i - 1]]


@pytest.mark.parametrize(("chat", "include_usage", "fixture"), [
    (False, True, "completion_stream_usage.sse"),
    (False, False, "completion_stream_nousage.sse"),
    (True, True, "chat_stream_usage.sse"),
    (True, False, "chat_stream_usage.sse"),  # as vLLM sends it without usage (tests/tap/fake_vllm.py)
], ids=["completion-usage", "completion", "chat-usage", "chat"])
def test_streams_have_vllms_shape(api: tuple[Simulator, str], chat: bool, include_usage: bool, fixture: str) -> None:
    """Every event of a streamed response, with and without stream_options.include_usage, has the members real
    vLLM 0.32's has, in its order: the chat opening's prompt_token_ids, each chunk's token_ids, and the
    system_fingerprint on the usage event or, without one, on the terminal chunk."""
    _, url = api
    request: dict[str, object] = {"model": MODEL, "max_tokens": 40, "temperature": 0, "stream": True,
                                  **({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "x"})}
    if include_usage:
        request["stream_options"] = {"include_usage": True}
    body = httpx.post(url + ("/v1/chat/completions" if chat else "/v1/completions"), json=request).text
    real = fixture_events(fixture) if include_usage or not chat else without_usage(fixture_events(fixture))
    assert stream_shape(sse(body)) == stream_shape(sse(b"".join(real).decode()))


def test_errors_are_vllms(api: tuple[Simulator, str]) -> None:
    _, url = api
    missing = httpx.post(url + "/v1/completions", json={"model": "nope", "prompt": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    greedy = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "n": 2, "temperature": 0})
    assert greedy.status_code == 400 and "n must be 1" in greedy.json()["error"]["message"]
    two = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "n": 2, "temperature": 1,
                                                     "max_tokens": 8}).json()
    assert two["metrics"] is None and len(two["choices"]) == 2


def test_flags_off_mean_no_metrics() -> None:
    with serving(ModelSpec(drafts_per_second=0.0), per_request_metrics="none", request_timings=False) as (_, url):
        body = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 8}).json()
        assert body["metrics"] is None
    with serving(ModelSpec(drafts_per_second=0.0), per_request_metrics="none") as (_, url):
        body = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 8}).json()
        assert body["metrics"]["speculative_decoding"] is None and body["metrics"]["generation_time_ms"] > 0


def test_alpha_falls_with_temperature(api: tuple[Simulator, str]) -> None:
    _, url = api

    def alpha(temperature: float) -> float:
        drafted = accepted = 0
        for _ in range(30):
            spec = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 40,
                                                             "temperature": temperature}).json()
            drafted += spec["metrics"]["speculative_decoding"]["num_draft_tokens"]
            accepted += spec["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"]
        return accepted / drafted

    cold, hot = alpha(0.0), alpha(1.0)
    assert cold == pytest.approx(0.75, abs=0.05) and hot == pytest.approx(0.375, abs=0.05)


def test_a_mixed_workload_by_temperature_and_header() -> None:
    with serving(MIXED) as (_, url):
        def request_alpha(**extra: object) -> float:
            headers = extra.pop("headers", {})
            body = httpx.post(url + "/v1/completions", headers=headers,  # type: ignore[arg-type]
                              json={"model": MODEL, "prompt": "x", "max_tokens": 60, **extra}).json()
            return float(body["metrics"]["speculative_decoding"]["draft_acceptance_rate"])

        structured = [request_alpha(temperature=0.1) for _ in range(20)]
        creative = [request_alpha(temperature=0.9) for _ in range(20)]
        named = [request_alpha(headers={"x-workload": "creative"}, temperature=0.0) for _ in range(10)]
        assert sum(structured) / 20 == pytest.approx(0.82, abs=0.05)
        assert sum(creative) / 20 == pytest.approx(0.38, abs=0.05) and max(named) < 0.6


def test_the_mixed_workload_counters_read_healthy_while_part_of_it_is_slow() -> None:
    """Aggregate α 0.644 (0.6 · 0.82 + 0.4 · 0.38) while the creative part's TPOT is above a control pod's."""
    rates = compute_rates(MIXED, LiveParams(0.75, 200.0), position_fractions(0.75, 3))
    assert rates.accepted / rates.draft_tokens == pytest.approx(0.644)
    control = compute_rates(ModelSpec(spec_decode=False), LiveParams(0.75, 200.0), position_fractions(0.75, 3))
    (_, fast), (_, slow) = rates.tpot_groups
    assert fast < control.tpot_seconds < slow


def test_a_control_pod_has_latency_and_no_spec_families() -> None:
    sim = Simulator(steady_scenario(ModelSpec(spec_decode=False)), clock=lambda: 0.0)
    sim.advance(30)
    server, url = serve_in_thread(sim)
    try:
        text = httpx.get(url + "/metrics").text
    finally:
        server.stop()
    real = fixture_text("vllm_0.32.0/metrics_nospec.prom")
    assert "spec_decode" not in text and "spec_decode" not in real
    assert "vllm:request_time_per_output_token_seconds_bucket" in text
    assert Exposition.parse(text).get("vllm:request_time_per_output_token_seconds_count", engine="0") > 0


def test_under_load_spec_decode_loses_to_a_control_pod() -> None:
    loaded = ModelSpec(cost_per_draft_token=0.2, batch_slowdown=0.01, saturating_batch=64)
    light, heavy = (compute_rates(loaded, LiveParams(0.75, d), position_fractions(0.75, 3)) for d in (50, 1000))
    control_light, control_heavy = (
        compute_rates(ModelSpec(spec_decode=False, batch_slowdown=0.01), LiveParams(0.75, d), (0.0,) * 3)
        for d in (50 * 3.25, 1000 * 3.25))  # the same tokens per second without drafts
    assert light.tpot_seconds < control_light.tpot_seconds  # idle: spec decode pays off
    assert heavy.tpot_seconds > control_heavy.tpot_seconds  # loaded: verification is compute-bound, it loses
