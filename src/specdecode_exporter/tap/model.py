"""What the request tap reports: one TapRequest and one TapResult per inspected request, handed to an Observer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

# Why a TapResult carries no metrics (TapResult.reason). None when metrics are present.
NOT_ENABLED = "not_enabled"  # a good response without a `metrics` object (vLLM flags off, or another engine)
# SGLang answered (its response shape: tap/openai.py sglang_shaped) and the request did not set
# return_spec_tokens_details, without which SGLang leaves its per-request details out (SGLang #33518)
SPEC_DETAILS_NOT_REQUESTED = "spec_tokens_details_not_requested"
N_GT_1 = "n_gt_1"  # vLLM leaves metrics null when n > 1
MULTI_PROMPT = "multi_prompt"  # ... and when one completion request carries several prompts
NO_USAGE = "no_usage"  # a stream without the final usage event (usage could not be requested)
HTTP_ERROR = "http_error"  # status >= 400
CLIENT_DISCONNECTED = "client_disconnected"
UPSTREAM_FAILED = "upstream_failed"  # connect failed, or the upstream closed mid-response
UNPARSABLE = "unparsable"  # a body the tap could not read (not JSON, too large, content-encoded, odd SSE)


@dataclass(frozen=True, slots=True)
class TapRequest:
    """The parts of a completion request an observer needs (never the prompt, never other headers)."""

    method: str
    path: str
    endpoint: str  # "completions" | "chat_completions"
    model: str | None
    temperature: float | None  # None when the request did not set one
    stream: bool
    n: int
    workload: str | None  # the raw value of the configured workload header; the observer caps it
    usage_injected: bool  # the tap added stream_options.include_usage and strips the usage event again
    prompt_chars: int | None = None  # characters of a text prompt (chat: of the messages' text)
    prompt_tokens: int | None = None  # tokens of a prompt given as token ids
    spec_details_requested: bool = False  # the request set SGLang's return_spec_tokens_details to true


@dataclass(frozen=True, slots=True)
class TapResult:
    """How the response ended, and what it said about the request. Times are time.monotonic() seconds."""

    status: int  # 0 when no response status was seen
    metrics: dict[str, Any] | None  # vLLM's per-request `metrics` object
    timings: dict[str, Any] | None  # llama.cpp's per-request `timings` object (draft_n, draft_n_accepted, ...)
    usage: dict[str, Any] | None
    reason: str | None  # one of the constants above when metrics is None
    started: float  # the request head was read
    first_byte: float | None  # the first response byte was handed to the client
    finished: float
    first_body: float | None = None  # the first byte of the response body (a stream's first event) was read
    route: Route | None = None  # where the request went, when the tap routes
    sglext: dict[str, Any] | None = None  # SGLang's root `sglext` object (spec_tokens_details, SGLang #33518)


# Routing (src/specdecode_exporter/tap/route.py): where a request went, and why.
SPECULATIVE, FALLBACK = "speculative", "fallback"  # the upstream label
BENEFIT = "benefit"  # the class is routed: it goes to the fallback
CANARY = "canary"  # the class is routed, and this request was drawn to stay on the speculative pool
UNROUTED = "unrouted"  # the class is not routed
FALLBACK_DOWN = "fallback_down"  # meant for the fallback, which refused, did not answer, or failed its health check
ROUTE_HEADER = b"x-specdecode-route"


class Route(NamedTuple):
    """A routing decision. ``upstream`` and ``reason`` are what is counted; ``enforced`` is False in observe
    mode when the decision was the fallback (the request went to the speculative upstream all the same)."""

    upstream: str
    reason: str
    enforced: bool
    key: tuple[str | None, ...]  # the request's class, as the router labels it

    @property
    def to_fallback(self) -> bool:
        return self.upstream == FALLBACK and self.enforced

    def failed_over(self) -> Route:
        """The same request sent to the speculative upstream because the fallback could not be reached."""
        return Route(SPECULATIVE, FALLBACK_DOWN, True, self.key)

    def header(self) -> bytes:
        """The response header line that says where the request went."""
        sent = FALLBACK if self.to_fallback else SPECULATIVE
        reason = self.reason if self.enforced or self.upstream == SPECULATIVE else "observe"
        return b"%b: %b; reason=%b\r\n" % (ROUTE_HEADER, sent.encode(), reason.encode())


class Router(Protocol):
    def route(self, request: TapRequest) -> Route:
        """Called on the event loop once per inspected request, when it has been read; must not block."""


class Observer(Protocol):
    def observe(self, request: TapRequest, result: TapResult) -> None:
        """Called on the event loop once per inspected request when its response ends or fails; must not block."""
