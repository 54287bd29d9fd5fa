"""The fake engine's OpenAI answers in SGLang's shape, for the `sglang` format: its choices carry `matched_stop`, its
usage a top-level `reasoning_tokens`, its events `"usage":null`, and a request that set `return_spec_tokens_details`
gets the root `sglext` object with the request's spec-decode details (SGLang #33518;
python/sglang/srt/entrypoints/openai/protocol.py, serving_completions.py, serving_chat.py;
tests/fixtures/sglang_openai/ shows the same shapes). The counts are exactly the ones the engine's counters add.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from specdecode_exporter.simulator.requests import Call, Generation, text_of


def spec_tokens_details(g: Generation) -> dict[str, Any]:
    """SGLang's SpecTokensDetails of one choice: drafted tokens are spec_num_proposed_drafts, accepted ones
    spec_num_correct_drafts, verification steps spec_verify_ct; the accept length counts every token per step."""
    histogram = [0] * (g.num_spec_tokens + 1)
    for prefix in g.accepted_per_step:
        histogram[prefix] += 1
    return {"spec_accept_rate": g.accepted / g.drafted if g.drafted else 0.0,
            "spec_accept_length": g.tokens / g.spec_steps if g.spec_steps else 0.0,
            "spec_num_correct_drafts": g.accepted, "spec_num_proposed_drafts": g.drafted,
            "spec_verify_ct": g.spec_steps, "spec_correct_drafts_histogram": histogram}


def sglext(call: Call, generations: list[Generation]) -> dict[str, Any] | None:
    """The root `sglext`: the details when the request asked for them and the engine speculates (a list, one per
    choice, for n > 1); None otherwise, and SGLang then writes no sglext at all."""
    if not call.spec_details or not all(g.speculative for g in generations):
        return None
    details = [spec_tokens_details(g) for g in generations]
    return {"spec_tokens_details": details if call.n > 1 else details[0]}


def _usage(call: Call, prompt_tokens: int, null_details: bool) -> dict[str, Any]:
    completion = call.max_tokens * call.n
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
                             "completion_tokens": completion}
    if null_details:  # serialized without exclude_none (chat); the completions usage event drops it
        usage["prompt_tokens_details"] = None
    usage["reasoning_tokens"] = 0
    return usage


def _choice(call: Call, index: int, text: str, finish: str | None, delta: bool = False) -> dict[str, Any]:
    if not call.chat:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}
    message = {"role": None if delta else "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
    return {"index": index, "delta" if delta else "message": message, "logprobs": None, "finish_reason": finish,
            "matched_stop": None}


def response_body(call: Call, generations: list[Generation], prompt_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": uuid.uuid4().hex, "object": "chat.completion" if call.chat else "text_completion",
        "created": int(time.time()), "model": call.model,
        "choices": [_choice(call, i, text_of(g.tokens), "length") for i, g in enumerate(generations)],
        "usage": _usage(call, prompt_tokens, True), "metadata": {"weight_version": "default"}}
    details = sglext(call, generations)
    if details is not None:
        body["sglext"] = details
    return body


def stream_events(call: Call, generation: Generation, prompt_tokens: int) -> Iterator[bytes]:
    """One event per engine step (every one with "usage":null), the sglext event when asked for, the usage event
    only with include_usage, then [DONE]."""
    ident, created = uuid.uuid4().hex, int(time.time())
    kind = "chat.completion.chunk" if call.chat else "text_completion"

    def event(body: Mapping[str, Any]) -> bytes:
        return b"data: " + json.dumps({"id": ident, "object": kind, "created": created, "model": call.model,
                                       **body}, separators=(",", ":")).encode() + b"\n\n"

    if call.chat:
        first = _choice(call, 0, "", None, delta=True)
        first["delta"]["role"] = "assistant"
        yield event({"choices": [first], "usage": None})
    steps = generation.tokens_per_step()
    offset = 0
    for i, n in enumerate(steps):
        finish = "length" if i == len(steps) - 1 else None
        yield event({"choices": [_choice(call, 0, text_of(n, offset), finish, delta=True)], "usage": None})
        offset += n
    details = sglext(call, [generation])
    if details is not None:
        yield event({"choices": [], "usage": None, "sglext": details})
    if call.include_usage:
        yield event({"choices": [], "usage": _usage(call, prompt_tokens, call.chat)})
    yield b"data: [DONE]\n\n"
