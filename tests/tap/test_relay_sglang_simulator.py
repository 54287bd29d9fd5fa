"""The simulator speaking SGLang (format sglang): its responses in SGLang's shapes carry the same counts its engine
counters add, and the tap in front of it reads them: per-request drafted and accepted tokens that sum to the
counters' increase, streamed or not, and the reason that says to set return_spec_tokens_details when a request did
not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.server import serve_in_thread
from specdecode_exporter.tap import start_tap
from specdecode_exporter.tap.model import SPEC_DETAILS_NOT_REQUESTED
from specdecode_exporter.tap.openai import sglang_shaped
from specdecode_exporter.tap.request_stats import spec_figures
from tests.tap.harness import Recorder, fetch, request_bytes, run, tap_settings

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _engine_counts(sim: Simulator) -> tuple[int, int]:
    (engine,) = sim.snapshot()[0].engines
    return engine.draft_tokens, engine.accepted


def _bodies(response: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a response: its body, or each `data:` event of a stream."""
    body = response.split(b"\r\n\r\n", 1)[1]
    if b"data: " not in body:
        return [json.loads(body)]
    return [json.loads(line[len(b"data: "):]) for line in body.split(b"\n")
            if line.startswith(b"data: {")]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_the_tap_reads_the_simulators_sglang_details_as_its_counters_count_them(path: str) -> None:
    sim = Simulator(steady_scenario(ModelSpec(acceptance_rate=0.6, drafts_per_second=0.0), fmt="sglang"),
                    pace=False)
    server, url = serve_in_thread(sim)
    recorder = Recorder()
    requests = [{"stream": stream, "return_spec_tokens_details": True, "stream_options": options}
                for stream, options in ((False, None), (True, None), (True, {"include_usage": True}))]

    counts: list[tuple[int, int]] = []

    async def main() -> None:
        tap = await start_tap("127.0.0.1", 0, tap_settings(url), recorder)
        try:
            unasked = {"model": MODEL, "prompt": "a", "messages": [], "max_tokens": 40, "stream": True}
            await fetch(tap.port, request_bytes(path, unasked))
            await recorder.wait(1)
            counts.append(_engine_counts(sim))
            for extra in requests:
                body = {"model": MODEL, "prompt": "a", "messages": [], "max_tokens": 40, "temperature": 0.0,
                        **{k: v for k, v in extra.items() if v is not None}}
                shapes = _bodies(await fetch(tap.port, request_bytes(path, body)))
                assert all("metrics" not in shape for shape in shapes)  # SGLang's shape, not vLLM's
                assert any(sglang_shaped(shape, shape.get("usage")) for shape in shapes)
                asked_usage = not extra["stream"] or extra["stream_options"] is not None
                assert isinstance(shapes[-1].get("usage"), dict) is asked_usage, "the tap's usage request is hidden"
            await recorder.wait(4)
            counts.append(_engine_counts(sim))
        finally:
            await tap.close()

    try:
        run("uvloop", main)
    finally:
        server.stop()
    (_, unasked_result), *asked = recorder.seen
    assert unasked_result.reason == SPEC_DETAILS_NOT_REQUESTED and unasked_result.sglext is None
    figures = [spec_figures(r.metrics, r.timings, r.sglext) for _, r in asked]
    assert all(r.reason is None for _, r in asked) and all(f is not None and f.steps for f in figures)
    (before, after) = counts
    assert sum(f.draft_tokens for f in figures if f) == after[0] - before[0] > 0  # exactly what the counters added
    assert sum(f.accepted_tokens for f in figures if f) == after[1] - before[1]
