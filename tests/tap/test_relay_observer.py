"""What the observer is told, once per inspected request, when its response ends."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from specdecode_exporter.core.process.log import LOGGER_NAME
from specdecode_exporter.tap import TapRequest, TapResult
from tests.tap.fake_vllm import FIXTURES, fixture_events
from tests.tap.harness import LOOPS, fetch, request_bytes, run, tap_settings, tapped

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _observe_one(path: str, body: dict[str, Any], loop: str = "uvloop", **headers: str) -> tuple[TapRequest, TapResult]:
    seen: list[tuple[TapRequest, TapResult]] = []

    async def main() -> None:
        async with tapped(workload_header="X-Workload") as (_, tap, recorder):
            await fetch(tap.port, request_bytes(path, body, headers=headers))
            seen.extend(await recorder.wait(1))

    run(loop, main)
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_stream_without_usage_reports_metrics(loop: str, path: str) -> None:
    body = {"model": "tiny", "prompt": "a", "messages": [], "stream": True, "temperature": 0.7, "max_tokens": 3}
    request, result = _observe_one(path, body, loop, **{"x-workload": "batch-eval"})
    assert request == TapRequest(
        method="POST",
        path=path,
        endpoint="chat_completions" if path == CHAT else "completions",
        model="tiny",
        temperature=0.7,
        stream=True,
        n=1,
        workload="batch-eval",
        usage_injected=True,
        prompt_chars=1 if path == COMPLETIONS else None,  # "a"; no chat messages
    )
    assert result.status == 200 and result.reason is None
    assert result.metrics is not None
    spec = result.metrics["speculative_decoding"]
    assert (spec["num_draft_tokens"], spec["num_accepted_draft_tokens"], spec["acceptance_histogram"]) == (
        33,
        25,
        [2, 1, 0, 8],
    )
    assert result.usage == {"prompt_tokens": 31, "total_tokens": 71, "completion_tokens": 40}
    assert result.first_byte is not None and result.started <= result.first_byte <= result.finished


def test_stream_with_usage_asked_by_the_client() -> None:
    body = {"prompt": "a", "stream": True, "stream_options": {"include_usage": True}}
    request, result = _observe_one(COMPLETIONS, body)
    assert not request.usage_injected and request.temperature is None and request.workload is None
    assert result.metrics is not None and result.reason is None


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_non_streamed_response(path: str) -> None:
    request, result = _observe_one(path, {"model": "tiny", "prompt": "a", "messages": [], "temperature": 0})
    assert not request.stream and request.temperature == 0.0
    assert result.metrics is not None and result.metrics["speculative_decoding"]["num_spec_steps"] == 11
    assert result.usage is not None and result.usage["completion_tokens"] == 40


@pytest.mark.parametrize("stream", [False, True])
def test_metrics_not_enabled(stream: bool) -> None:
    _, result = _observe_one(COMPLETIONS, {"prompt": "a", "stream": stream, "fake_metrics": False})
    assert (result.metrics, result.reason) == (None, "not_enabled")
    assert result.usage is not None  # the usage event still came (and was still removed)


@pytest.mark.parametrize("stream", [False, True])
def test_n_greater_than_one(stream: bool) -> None:
    request, result = _observe_one(COMPLETIONS, {"prompt": "a", "n": 2, "temperature": 1, "stream": stream})
    assert request.n == 2 and not request.usage_injected
    assert (result.metrics, result.reason) == (None, "n_gt_1")


def test_several_prompts() -> None:
    _, result = _observe_one(COMPLETIONS, {"prompt": ["a", "b"], "stream": True})
    assert (result.metrics, result.reason) == (None, "multi_prompt")


def test_unparsable_body() -> None:
    _, result = _observe_one(COMPLETIONS, {"prompt": "a", "fake_raw_body": "<html>oops"})
    assert (result.status, result.metrics, result.reason) == (200, None, "unparsable")


@pytest.mark.parametrize("stream", [False, True])
def test_llamacpp_timings(stream: bool) -> None:
    _, result = _observe_one(CHAT, {"messages": [], "stream": stream, "fake_engine": "llamacpp"})
    assert result.metrics is None and result.reason == "not_enabled"
    assert result.timings == {"prompt_n": 31, "predicted_n": 40, "draft_n": 33, "draft_n_accepted": 25}


def test_failing_observer_does_not_break_the_relay() -> None:
    class Broken:
        def observe(self, request: TapRequest, result: TapResult) -> None:
            raise RuntimeError("observer bug")

    async def main() -> None:
        from specdecode_exporter.tap import start_tap
        from tests.tap.fake_vllm import FakeVllm

        fake = await FakeVllm().start()
        tap = await start_tap("127.0.0.1", 0, tap_settings(fake.url), Broken())
        raw = request_bytes(COMPLETIONS, {"prompt": "a", "stream": True})
        direct = await fetch(fake.port, raw)
        for _ in range(3):
            assert await fetch(tap.port, raw) == direct
        await tap.close()
        await fake.close()

    records = _capture_logs(lambda: run("uvloop", main))
    failures = [r for r in records if r.getMessage() == "request tap observer failed"]
    assert [r.fields["count"] for r in failures] == [1, 2]  # type: ignore[attr-defined]  # 1st, 2nd, 4th, ...


def _capture_logs(action: Any) -> list[logging.LogRecord]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(LOGGER_NAME)
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        action()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return records


@pytest.mark.parametrize(
    ("fixture", "spec_drafts", "timing"),
    [
        ("completion_nonstream.json", 33, True),
        ("completion_nonstream_t1.json", None, True),
        ("completion_nonstream_spec_only.json", 33, False),  # --per-request-spec-decode-metrics only
        ("completion_nonstream_nospec.json", None, True),  # no speculative decoding: speculative_decoding null
        ("chat_nonstream.json", 33, True),
    ],
)
def test_real_non_streamed_responses(fixture: str, spec_drafts: int | None, timing: bool) -> None:
    """vLLM 0.32.0 captures served byte for byte: the client gets them unchanged, the observer their metrics."""
    body = {"prompt": "a", "messages": [], "fake_fixture": fixture}
    raw = request_bytes(CHAT if fixture.startswith("chat") else COMPLETIONS, body)
    expected = json.loads((FIXTURES / fixture).read_bytes())["metrics"]

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            assert await fetch(tap.port, raw) == await fetch(fake.port, raw)
            ((_, result),) = await recorder.wait(1)
            assert result.metrics is not None and result.metrics == expected and result.reason is None
            spec = result.metrics["speculative_decoding"]
            if spec_drafts is None:
                assert spec is None or spec["num_draft_tokens"] > 0
            else:
                assert spec["num_draft_tokens"] == spec_drafts
            assert (result.metrics["generation_time_ms"] is not None) is timing

    run("uvloop", main)


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*stream_usage*.sse")))
@pytest.mark.parametrize("asks_usage", [False, True])
def test_real_streams(fixture: str, asks_usage: bool) -> None:
    """Every captured stream: the client gets what vLLM would have sent it (asking for usage or not), the observer
    the usage event's metrics."""
    body: dict[str, Any] = {"prompt": "a", "messages": [], "stream": True, "fake_fixture": fixture}
    if asks_usage:
        body["stream_options"] = {"include_usage": True}
    raw = request_bytes(CHAT if fixture.startswith("chat") else COMPLETIONS, body)
    usage_event = fixture_events(fixture)[-2]
    expected = json.loads(usage_event[len(b"data: ") :])["metrics"]

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            assert await fetch(tap.port, raw) == await fetch(fake.port, raw)
            ((request, result),) = await recorder.wait(1)
            assert request.usage_injected is not asks_usage
            assert result.metrics == expected and result.reason is None

    run("uvloop", main)
