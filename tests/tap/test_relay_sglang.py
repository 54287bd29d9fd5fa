"""SGLang behind the tap: its per-request spec-decode details (a root `sglext` object, SGLang #33518) reach the
observer, streamed or not, and the client receives exactly what SGLang sent, whether the tap asked for usage on its
behalf or not. A request without return_spec_tokens_details is counted under the reason that says to set it. The
responses are tests/fixtures/sglang_openai/ (see its README for the upstream files they follow)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdecode_exporter.sidecar.status import requests_json
from specdecode_exporter.tap import TapRequest, TapResult
from specdecode_exporter.tap.model import N_GT_1, NOT_ENABLED, SPEC_DETAILS_NOT_REQUESTED
from specdecode_exporter.tap.request_stats import RequestRecorder, spec_figures
from tests.tap.fake_vllm import SGLANG_FIXTURES
from tests.tap.harness import LOOPS, fetch, request_bytes, run, tap_settings, tapped

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
DETAILS = json.loads((SGLANG_FIXTURES / "completion_nonstream.json").read_bytes())["sglext"]


def _through_the_tap(path: str, body: dict[str, Any], loop: str = "uvloop") -> tuple[TapRequest, TapResult]:
    """One request through the tap; asserts the client got byte for byte what SGLang sends it directly."""
    seen: list[tuple[TapRequest, TapResult]] = []
    raw = request_bytes(path, {"model": "default", "prompt": "a", "messages": [], "fake_engine": "sglang", **body})

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            assert await fetch(tap.port, raw) == await fetch(fake.port, raw)
            seen.extend(await recorder.wait(1))

    run(loop, main)
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("stream_options", [None, {"include_usage": True}])
def test_streamed_details_reach_the_observer_and_the_client_gets_sglangs_stream(
        loop: str, path: str, stream_options: dict[str, bool] | None) -> None:
    """Streamed: the sglext event comes before the usage event; the tap reads it whether it asked for usage itself
    (and removed the usage event again) or the client did."""
    body: dict[str, Any] = {"stream": True, "return_spec_tokens_details": True}
    if stream_options is not None:
        body["stream_options"] = stream_options
    request, result = _through_the_tap(path, body, loop)
    assert request.spec_details_requested and request.usage_injected is (stream_options is None)
    assert result.reason is None and result.metrics is None
    assert result.sglext == DETAILS
    assert spec_figures(result.metrics, result.timings, result.sglext) == (215.0, 63.0, 43.0)


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_non_streamed_details_reach_the_observer(path: str) -> None:
    request, result = _through_the_tap(path, {"return_spec_tokens_details": True})
    assert request.spec_details_requested and not request.stream
    assert (result.reason, result.sglext) == (None, DETAILS)
    assert result.usage is not None and result.usage["completion_tokens"] == 106


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_without_return_spec_tokens_details_is_counted_under_the_reason_that_says_to_set_it(
        path: str, stream: bool) -> None:
    """SGLang sends no sglext then. Streamed, its events all carry "usage":null: the usage event the tap asked for
    is still removed (the client gets SGLang's stream without usage, byte for byte)."""
    request, result = _through_the_tap(path, {"stream": stream})
    assert not request.spec_details_requested
    assert (result.reason, result.sglext) == (SPEC_DETAILS_NOT_REQUESTED, None)


@pytest.mark.parametrize("stream", [False, True])
def test_details_asked_for_but_not_given_is_not_enabled(stream: bool) -> None:
    """SGLang without a speculative algorithm (or a build before #33518) answers without sglext."""
    _, result = _through_the_tap(COMPLETIONS, {"stream": stream, "return_spec_tokens_details": True,
                                               "fake_metrics": False})
    assert (result.reason, result.sglext) == (NOT_ENABLED, None)


def test_details_per_choice_are_not_one_requests() -> None:
    """n > 1: SGLang lists the details per choice; the tap counts the request as vLLM's n > 1 ones."""
    response = json.loads((SGLANG_FIXTURES / "completion_nonstream.json").read_bytes())
    response["sglext"] = {"spec_tokens_details": [DETAILS["spec_tokens_details"]] * 2}
    _, result = _through_the_tap(COMPLETIONS, {"n": 2, "temperature": 1, "return_spec_tokens_details": True,
                                               "fake_raw_body": json.dumps(response)})
    assert result.reason == N_GT_1
    assert spec_figures(None, None, result.sglext) is None


def test_the_recorder_counts_sglang_requests_in_the_same_families_as_vllms() -> None:
    """Bands, the per-request α distribution, the mean length and the variance sums, from SGLang's details."""
    recorder = RequestRecorder(tap_settings())
    request, result = _through_the_tap(COMPLETIONS, {"temperature": 0.0, "return_spec_tokens_details": True})
    recorder.observe(request, result)
    unasked_request, unasked = _through_the_tap(COMPLETIONS, {"temperature": 0.0})
    recorder.observe(unasked_request, unasked)
    view = recorder.view()
    ((key, totals),) = view.bands.items()
    assert key.model_name == "default" and key.temperature == "0-0.3"
    assert (totals.requests, totals.draft_tokens, totals.accepted_tokens) == (1, 215.0, 63.0)
    assert totals.acceptance.observations == 1 and totals.mean_length.observations == 1
    moments = view.moments["default"]
    assert (moments.requests, moments.draft_tokens, moments.accepted_tokens) == (1, 215, 63)
    assert view.without_metrics == {("default", SPEC_DETAILS_NOT_REQUESTED): 1}
    status = requests_json(view, 0.5, 60.0)  # what /api/v1/status and the status page say of them
    assert status["without_spec_metrics"] == {SPEC_DETAILS_NOT_REQUESTED: 1}
    assert status["hint"] is not None and '"return_spec_tokens_details": true' in status["hint"]
