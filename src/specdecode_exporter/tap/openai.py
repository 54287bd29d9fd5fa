"""The OpenAI completion requests the tap inspects: what they ask for, and the one rewrite it makes (asking a
stream for its usage event, which carries vLLM's per-request metrics); and what a response says of the request in
each engine's shape (vLLM's `metrics`, llama.cpp's `timings`, SGLang's `sglext`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_ERROR_TEXT = 300  # characters of an error body shown in a one-line message
INSPECTED_PATHS = {b"/v1/completions": "completions", b"/v1/chat/completions": "chat_completions"}


@dataclass(frozen=True, slots=True)
class RequestPlan:
    endpoint: str
    model: str | None
    temperature: float | None
    stream: bool
    n: int
    single_prompt: bool  # vLLM reports metrics only for one prompt and n == 1
    usage_injected: bool
    body: bytes  # what to send upstream: the client's body, or the rewritten one when usage_injected
    prompt_chars: int | None = None  # see prompt_size
    prompt_tokens: int | None = None
    spec_details_requested: bool = False  # SGLang's return_spec_tokens_details: true (SGLang #33518)


def endpoint_of(target: bytes) -> str | None:
    return INSPECTED_PATHS.get(target.split(b"?", 1)[0])


def plan_request(endpoint: str, body: bytes) -> RequestPlan | None:
    """None when the body is not a JSON object in UTF-8: such requests are forwarded untouched, unobserved."""
    try:
        request = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(request, dict):
        return None
    model = request.get("model")
    given_n = request.get("n")
    stream = request.get("stream") is True
    n = given_n if isinstance(given_n, int) and not isinstance(given_n, bool) else 1
    single_prompt = endpoint != "completions" or _single_prompt(request.get("prompt"))
    new_body = None
    if stream and n == 1 and single_prompt and _usage_unrequested(request):
        new_body = _with_usage(request, body)
    chars, tokens = prompt_size(request.get("prompt") if endpoint == "completions" else request.get("messages"))
    return RequestPlan(
        endpoint=endpoint,
        model=model if isinstance(model, str) else None,
        temperature=_temperature(request.get("temperature")),
        stream=stream,
        n=n,
        single_prompt=single_prompt,
        usage_injected=new_body is not None,
        body=new_body if new_body is not None else body,
        prompt_chars=chars,
        prompt_tokens=tokens,
        spec_details_requested=request.get("return_spec_tokens_details") is True,
    )


def prompt_size(prompt: object) -> tuple[int | None, int | None]:
    """(characters, tokens) of a prompt, one of them known: tokens when it is given as token ids; characters of
    its text otherwise (a completion's string, or the text of chat messages). Several prompts: the longest."""
    if isinstance(prompt, str):
        return len(prompt), None
    if not isinstance(prompt, list) or not prompt:
        return None, None
    if all(isinstance(t, int) for t in prompt):
        return None, len(prompt)
    if all(isinstance(m, dict) for m in prompt):  # chat messages
        return sum(_message_chars(m.get("content")) for m in prompt), None
    sizes = [prompt_size(p) for p in prompt if isinstance(p, str | list)]
    chars = [c for c, _ in sizes if c is not None]
    tokens = [t for _, t in sizes if t is not None]
    return (max(chars), None) if chars else (None, max(tokens)) if tokens else (None, None)


def _message_chars(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # content parts: {"type": "text", "text": ...}
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        return sum(len(text) for text in texts if isinstance(text, str))
    return 0


def _temperature(value: object) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _single_prompt(prompt: object) -> bool:
    if isinstance(prompt, str):
        return True
    if isinstance(prompt, list):
        # list[int] is one tokenized prompt; list[str] / list[list[int]] are one prompt each.
        return len(prompt) == 1 or (bool(prompt) and all(isinstance(t, int) for t in prompt))
    return False


def _usage_unrequested(request: dict[str, Any]) -> bool:
    """True only when the client clearly did not ask for usage (anything vLLM might read as true counts as asked)."""
    if "stream_options" not in request or request["stream_options"] is None:
        return True
    options = request["stream_options"]
    return isinstance(options, dict) and options.get("include_usage") in (None, False)


def _with_usage(request: dict[str, Any], body: bytes) -> bytes | None:
    if "stream_options" not in request:
        # Append the member before the closing brace: every byte the client sent is kept.
        stripped = body.rstrip(b" \t\r\n")
        if not stripped.endswith(b"}"):
            return None
        return stripped[:-1] + b',"stream_options":{"include_usage":true}}' + body[len(stripped) :]
    options = dict(request["stream_options"] or {})
    options["include_usage"] = True
    if options.get("continuous_usage_stats"):
        # vLLM ignores continuous_usage_stats without include_usage; keep it ignored so chunks stay unchanged.
        options["continuous_usage_stats"] = False
    # FastAPI parses the body with json.loads, so json.dumps of what json.loads returned means the same to vLLM.
    return json.dumps({**request, "stream_options": options}, separators=(",", ":")).encode("ascii")


@dataclass(frozen=True, slots=True)
class BodyFindings:
    usage: dict[str, Any] | None
    metrics: dict[str, Any] | None
    timings: dict[str, Any] | None
    sglext: dict[str, Any] | None = None
    sglang: bool = False  # the response is in SGLang's shape (sglang_shaped)


def read_response_body(body: bytes) -> BodyFindings | None:
    """usage, metrics, timings and sglext of a non-streamed completion response; None when it is not a JSON
    object."""
    try:
        response = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(response, dict):
        return None
    usage = _object(response, "usage")
    return BodyFindings(usage, _object(response, "metrics"), _object(response, "timings"),
                        _object(response, "sglext"), sglang_shaped(response, usage))


def _object(response: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = response.get(key)
    return value if isinstance(value, dict) else None


def sglang_shaped(response: Mapping[str, Any], usage: Mapping[str, Any] | None) -> bool:
    """Whether a response (or a stream's usage event) is SGLang's: a root `sglext` member, a top-level
    `usage.reasoning_tokens` (SGLang's UsageInfo always has one; vLLM's and TensorRT-LLM's nest reasoning tokens in
    completion_tokens_details, llama.cpp reports none) or a choice with `matched_stop` (SGLang's choices always
    carry it); python/sglang/srt/entrypoints/openai/protocol.py."""
    if "sglext" in response or (usage is not None and "reasoning_tokens" in usage):
        return True
    choices = response.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and "matched_stop" in c for c in choices)


def sglang_spec_details(sglext: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """SGLang's per-request spec-decode details of one choice: `sglext.spec_tokens_details` (an object for n = 1,
    a list for n > 1, which is not one request's), or the same members directly on `sglext`."""
    if not isinstance(sglext, Mapping):
        return None
    details = sglext.get("spec_tokens_details", sglext)
    if not isinstance(details, Mapping) or "spec_num_proposed_drafts" not in details:
        return None
    return details


def one_line(text: str) -> str:
    """Whitespace collapsed to single spaces, cut to MAX_ERROR_TEXT characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_ERROR_TEXT else flat[:MAX_ERROR_TEXT - 1] + "…"


def error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body (vLLM: {"error": {"message": …}}), else the text."""
    try:
        data = json.loads(body)
    except ValueError:
        return one_line(body.decode("utf-8", "replace")) or "(empty body)"
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return one_line(error["message"])
        for key in ("message", "detail", "error"):
            if isinstance(data.get(key), str):
                return one_line(data[key])
    return one_line(body.decode("utf-8", "replace"))
