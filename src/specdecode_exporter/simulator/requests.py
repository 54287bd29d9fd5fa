"""The fake vLLM's OpenAI API: one request's generation, step by step, and its response in vLLM's shapes.

Each verification step drafts k tokens and accepts a prefix of them (per-token probability p solved from the
request's α), then emits that prefix plus one target token. A request's α comes from its workload (the request's
x-workload header, or the workload nearest its temperature), spread per request. The counts a request adds to
the engine's counters are exactly the counts its response reports, as in vLLM (tests/fixtures/vllm_0.32.0 shows
the real shapes: `metrics.speculative_decoding`, timings with --enable-per-request-metrics, the usage chunk of
a stream only with stream_options.include_usage).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from specdecode_exporter.pipeline.derive import solve_geometric_probability
from specdecode_exporter.simulator.model import ModelSpec, Workload

SYSTEM_FINGERPRINT = "vllm-0.32.0-simulated"
WORDS = (" lorem", " ipsum", " dolor", " sit", " amet", ".", " sed", " do")


class RequestError(ValueError):
    """A request vLLM would reject: (HTTP status, OpenAI error body)."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True)
class Generation:
    """What one request did, step by step."""

    tokens: int
    accepted_per_step: tuple[int, ...]  # accepted prefix length of each verification step (spec steps only)
    plain_steps: int  # steps without a draft (ngram found nothing), one token each
    num_spec_tokens: int
    drafted_per_step: int
    step_seconds: float
    ttft_seconds: float
    workload: str
    speculative: bool = True  # served with a speculative config (its response carries spec metrics)

    @property
    def spec_steps(self) -> int:
        return len(self.accepted_per_step)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_step)

    @property
    def drafted(self) -> int:
        return self.spec_steps * self.drafted_per_step

    @property
    def steps(self) -> int:
        return self.spec_steps + self.plain_steps

    @property
    def generation_seconds(self) -> float:
        return self.steps * self.step_seconds

    @property
    def tpot_seconds(self) -> float:
        return self.generation_seconds / max(1, self.tokens - 1)

    def tokens_per_step(self) -> list[int]:
        """Tokens emitted by each step in order (the last one cut at max_tokens)."""
        out = [j + 1 for j in self.accepted_per_step] + [1] * self.plain_steps
        emitted, cut = 0, []
        for n in out:
            if emitted >= self.tokens:
                break
            cut.append(min(n, self.tokens - emitted))
            emitted += cut[-1]
        return cut


def workload_for(spec: ModelSpec, temperature: float | None, header: str | None) -> Workload:
    """The request's workload: named by its header, else the one nearest its temperature."""
    if spec.workloads:
        named = next((w for w in spec.workloads if header is not None and w.name == header), None)
        if named is not None:
            return named
        t = temperature if temperature is not None else 1.0  # vLLM's default temperature
        return min(spec.workloads, key=lambda w: abs(w.temperature - t))
    return Workload()


def request_alpha(spec: ModelSpec, base_alpha: float, temperature: float | None, workload: Workload) -> float:
    alpha = workload.acceptance_rate if workload.acceptance_rate is not None else base_alpha
    if not spec.workloads and temperature is not None:
        alpha *= 1.0 - spec.temperature_sensitivity * min(max(temperature, 0.0), 1.0)
    return alpha


def generate(spec: ModelSpec, alpha: float, max_tokens: int, step_seconds: float, ttft_seconds: float,
             rng: random.Random, workload: str = "default", k: int | None = None) -> Generation:
    """Steps until ``max_tokens`` are emitted; each spec step drafts ``k`` tokens (the configured k unless a
    schedule or a gate chose another; 0: no drafts) and accepts a truncated-geometric prefix of them."""
    k = spec.num_speculative_tokens if k is None else k
    drafted = k if spec.spec_decode else 0
    alpha = min(1.0, max(0.0, rng.gauss(alpha, spec.per_request_spread) if spec.per_request_spread else alpha))
    p = solve_geometric_probability(alpha * k, k) if drafted else 0.0
    accepted: list[int] = []
    plain, emitted = 0, 0
    while emitted < max_tokens:
        if not drafted or rng.random() >= spec.draft_fill:
            plain += 1
            emitted += 1
            continue
        prefix = 0
        while prefix < k and rng.random() < p:
            prefix += 1
        accepted.append(prefix)
        emitted += prefix + 1
    return Generation(max_tokens, tuple(accepted), plain, spec.num_speculative_tokens, drafted, step_seconds,
                      ttft_seconds, workload, spec.spec_decode)


def spec_metrics(g: Generation) -> dict[str, Any] | None:
    if not g.speculative:
        return None
    histogram = [0] * (g.num_spec_tokens + 1)
    for prefix in g.accepted_per_step:
        histogram[prefix] += 1
    return {"mean_acceptance_length": 1.0 + g.accepted / g.spec_steps if g.spec_steps else 1.0,
            "draft_acceptance_rate": g.accepted / g.drafted if g.drafted else 0.0,
            "acceptance_histogram": histogram, "num_spec_steps": g.spec_steps,
            "num_accepted_draft_tokens": g.accepted, "num_draft_tokens": g.drafted,
            "num_spec_tokens": g.num_spec_tokens, "per_step_accepted": None, "per_step_drafted": None}


def request_metrics(g: Generation, level: str, timings: bool) -> dict[str, Any] | None:
    """The response's `metrics` object as vLLM builds it: timings with --enable-per-request-metrics, the
    speculative_decoding part with --per-request-spec-decode-metrics (level "summary")."""
    spec = spec_metrics(g) if level != "none" else None
    if spec is None and not timings:
        return None
    generation_ms = g.generation_seconds * 1000
    out: dict[str, Any] = {
        "time_to_first_token_ms": g.ttft_seconds * 1000 if timings else None,
        "generation_time_ms": generation_ms if timings else None,
        "queue_time_ms": 0.05 if timings else None,
        "mean_itl_ms": generation_ms / max(1, g.steps) if timings else None,
        "tokens_per_second": g.tokens / g.generation_seconds if timings and g.generation_seconds else None,
        "speculative_decoding": spec,
    }
    return out


@dataclass(frozen=True)
class Call:
    """What a completion request asked for."""

    chat: bool
    model: str
    max_tokens: int
    stream: bool
    include_usage: bool
    n: int
    temperature: float | None
    spec_details: bool = False  # SGLang's return_spec_tokens_details (its sglext; the sglang format only)


def parse_call(payload: Any, chat: bool, models: tuple[str, ...]) -> Call:
    if not isinstance(payload, dict):
        raise RequestError(400, "body: expected a JSON object")
    model = payload.get("model") or models[0]
    if model not in models:
        raise RequestError(404, f"The model `{model}` does not exist. Valid aliases: {', '.join(models)}.",
                           "NotFoundError", "model")
    max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens", 16))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(400, f"max_tokens: expected a positive integer, got {max_tokens!r}", param="max_tokens")
    n = payload.get("n", 1)
    temperature = payload.get("temperature")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise RequestError(400, f"n: expected a positive integer, got {n!r}", param="n")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)):
        raise RequestError(400, f"temperature: expected a number, got {temperature!r}", param="temperature")
    if n > 1 and temperature == 0:
        raise RequestError(400, f"n must be 1 when using greedy sampling, got {n}.", param="n")
    options = payload.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return Call(chat, model, max_tokens, payload.get("stream") is True, include_usage, n,
                None if temperature is None else float(temperature), payload.get("return_spec_tokens_details") is True)


def text_of(tokens: int, offset: int = 0) -> str:
    return "".join(WORDS[(offset + i) % len(WORDS)] for i in range(tokens))


def _choice(call: Call, index: int, text: str, finish: str | None) -> dict[str, Any]:
    """A whole (not streamed) response's choice; a streamed chunk's is _chunk_choice."""
    if not call.chat:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
            "finish_reason": finish, "stop_reason": None}


def _usage(call: Call, prompt_tokens: int) -> dict[str, int]:
    completion = call.max_tokens * call.n
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion, "completion_tokens": completion}


def response_body(call: Call, generations: list[Generation], prompt_tokens: int,
                  metrics: dict[str, Any] | None) -> dict[str, Any]:
    kind = "chat.completion" if call.chat else "text_completion"
    return {"id": f"{'chatcmpl' if call.chat else 'cmpl'}-{uuid.uuid4().hex[:16]}", "object": kind,
            "created": int(time.time()), "model": call.model,
            "choices": [_choice(call, i, text_of(g.tokens), "length") for i, g in enumerate(generations)],
            "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": _usage(call, prompt_tokens),
            "metrics": metrics}


def _chunk_choice(call: Call, text: str, finish: str | None) -> dict[str, Any]:
    """A streamed chunk's choice with the members vLLM 0.32 writes (tests/fixtures/vllm_0.32.0): a completion's
    carry stop_reason, prompt_token_ids and token_ids on every chunk; a chat delta's carry token_ids, and
    stop_reason only on the terminal one."""
    if not call.chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                "prompt_token_ids": None, "token_ids": None}
    stop = {} if finish is None else {"stop_reason": None}
    return {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish, **stop,
            "token_ids": None}


def stream_events(call: Call, generation: Generation, prompt_tokens: int,
                  metrics: dict[str, Any] | None) -> Iterator[bytes]:
    """The SSE events of a streamed response: one per engine step, the usage event (only when asked for), and
    [DONE]; one event per chunk, shaped as vLLM 0.32 sends them (tests/fixtures/vllm_0.32.0): system_fingerprint
    rides on the usage event when there is one, else on the terminal chunk."""
    ident, created = f"{'chatcmpl' if call.chat else 'cmpl'}-{uuid.uuid4().hex[:16]}", int(time.time())
    kind = "chat.completion.chunk" if call.chat else "text_completion"

    def event(body: Mapping[str, Any]) -> bytes:
        return b"data: " + json.dumps({"id": ident, "object": kind, "created": created, "model": call.model,
                                       **body}, separators=(",", ":")).encode() + b"\n\n"

    if call.chat:
        yield event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}], "prompt_token_ids": None, "prompt_text": None})
    steps = generation.tokens_per_step()
    offset = 0
    for i, n in enumerate(steps):
        last = i == len(steps) - 1
        body: dict[str, Any] = {"choices": [_chunk_choice(call, text_of(n, offset), "length" if last else None)]}
        if last and not call.include_usage:
            body["system_fingerprint"] = SYSTEM_FINGERPRINT
        yield event(body)
        offset += n
    if call.include_usage:
        usage: dict[str, Any] = {"choices": [], "usage": _usage(call, prompt_tokens),
                                 "system_fingerprint": SYSTEM_FINGERPRINT}
        if metrics is not None:
            usage["metrics"] = {k: v for k, v in metrics.items() if v is not None} | (
                {"speculative_decoding": {k: v for k, v in metrics["speculative_decoding"].items() if v is not None}}
                if metrics.get("speculative_decoding") else {})
        yield event(usage)
    yield b"data: [DONE]\n\n"
