"""The probe's HTTP side (httpx, async): the served models, the spec-decode counters of /metrics, and one
streamed completion with its usage event. Only the URLs given are contacted: no proxies from the environment,
no redirects."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from specdecode_exporter.pipeline.engines.vllm_v1 import ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POSITION, RUNNING, WAITING
from specdecode_exporter.pipeline.parse import ParseError, select_samples
from specdecode_exporter.probe.measure import Counters, RequestResult, client_tpot, request_spec, server_tpot
from specdecode_exporter.sidecar.discover import model_ids
from specdecode_exporter.tap.openai import error_message, one_line

GENERATION_TOKENS = "vllm:generation_tokens_total"
IN_FLIGHT = (RUNNING, WAITING)
PREFIXES = ("vllm:spec_decode_", GENERATION_TOKENS, *IN_FLIGHT)
SPEC_PREFIX = "vllm:spec_decode_"
DISCOVERY_TIMEOUT = 10.0


class ProbeFault(Exception):
    """An expected failure that ends the probe: one line on stderr, exit code 1."""


class RequestRejected(ProbeFault):
    """The server refused a request (4xx): the same request would be refused every time."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url} refused a request (HTTP {status}): {message}")
        self.status = status
        self.message = message


def new_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=DISCOVERY_TIMEOUT,
                             limits=httpx.Limits(max_connections=256, max_keepalive_connections=256))


def _unreachable(url: str, exc: httpx.HTTPError) -> ProbeFault:
    if isinstance(exc, httpx.ConnectError):
        return ProbeFault(f"cannot reach {url}: {one_line(str(exc)) or 'connection refused'}")
    if isinstance(exc, httpx.TimeoutException):
        return ProbeFault(f"cannot reach {url}: no answer within {DISCOVERY_TIMEOUT:g}s")
    return ProbeFault(f"cannot reach {url}: {type(exc).__name__}: {one_line(str(exc))}")


async def served_models(client: httpx.AsyncClient, base: str) -> list[str]:
    """The model names /v1/models lists; a ProbeFault when the server is not there or not an OpenAI API."""
    url = base + "/v1/models"
    try:
        response = await client.get(url)
    except httpx.HTTPError as exc:
        raise _unreachable(base, exc) from None
    if response.status_code != 200:
        raise ProbeFault(f"{url} answered HTTP {response.status_code}: not an OpenAI-compatible server (vLLM)?")
    names = model_ids(response.content)
    if names is None:
        raise ProbeFault(f"{url}: not a model list (is this an OpenAI-compatible server?)")
    if not names:
        raise ProbeFault(f"{url} lists no model")
    return names


def counters_from_text(text: str, model: str) -> Counters | None:
    """vLLM V1's spec-decode counters for ``model`` (summed over engines); None without them."""
    try:
        samples = select_samples(text, PREFIXES)
    except ParseError:
        return None
    sums: dict[str, float] = {}
    positions: dict[int, float] = {}
    for sample in samples:
        if sample.label("model_name") not in (None, model):
            continue
        if sample.name == PER_POSITION:
            position = sample.label("position")
            if position is not None and position.isdigit():
                positions[int(position)] = positions.get(int(position), 0.0) + sample.value
        else:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    if DRAFTS not in sums or DRAFT_TOKENS not in sums or ACCEPTED not in sums:
        return None
    return Counters(drafts=sums[DRAFTS], draft_tokens=sums[DRAFT_TOKENS], accepted_tokens=sums[ACCEPTED],
                    per_position=tuple(positions.get(i, 0.0) for i in range(max(positions, default=-1) + 1)),
                    generation_tokens=sums.get(GENERATION_TOKENS),
                    requests_in_flight=sum(sums.get(name, 0.0) for name in IN_FLIGHT))


@dataclass(frozen=True, slots=True)
class MetricsPage:
    counters: Counters | None  # None: no vLLM V1 spec-decode counters for the model
    spec_families: bool  # any vllm:spec_decode_* family at all


async def scrape(client: httpx.AsyncClient, base: str, model: str) -> MetricsPage | None:
    """The server's /metrics for ``model``; None when it has none (404, not an exposition, unreachable)."""
    try:
        response = await client.get(base + "/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    text = response.text
    return MetricsPage(counters_from_text(text, model), SPEC_PREFIX in text)


@dataclass
class _Stream:
    """What a streamed response said, event by event."""

    first_token: float | None = None
    last_token: float | None = None
    token_events: int = 0
    usage: Mapping[str, Any] | None = None
    metrics: Mapping[str, Any] | None = None
    timings: Mapping[str, Any] | None = None
    error: str | None = None

    def read(self, event: Mapping[str, Any], now: float) -> None:
        if isinstance(event.get("error"), Mapping | str):
            self.error = error_message(json.dumps(event).encode())
        for key in ("usage", "metrics", "timings"):
            if isinstance(event.get(key), Mapping):
                setattr(self, key, event[key])
        choices = event.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            choice = choices[0]
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, Mapping) else choice.get("text")
            if isinstance(text, str) and text:
                self.first_token = now if self.first_token is None else self.first_token
                self.last_token = now
                self.token_events += 1

    def result(self, started: float, finished: float) -> RequestResult:
        if self.error is not None:
            return RequestResult(0, None, None, None, started, finished, error=self.error)
        reported = (self.usage or {}).get("completion_tokens")
        tokens = reported if isinstance(reported, int) and not isinstance(reported, bool) else self.token_events
        return RequestResult(completion_tokens=tokens, server_tpot=server_tpot(self.metrics, tokens),
                             client_tpot=client_tpot(self.first_token, self.last_token, tokens),
                             spec=request_spec(self.metrics, self.timings), started=started, finished=finished)


async def _read_stream(response: httpx.Response, stream: _Stream) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if isinstance(event, Mapping):
            stream.read(event, time.monotonic())


async def stream_completion(client: httpx.AsyncClient, base: str, body: Mapping[str, Any], chat: bool,
                            timeout: float) -> RequestResult:
    """One streamed completion with its usage event. A 4xx raises RequestRejected, a lost server ProbeFault;
    a timeout, a 5xx or a broken stream is a failed RequestResult."""
    url = base + ("/v1/chat/completions" if chat else "/v1/completions")
    started = time.monotonic()
    stream = _Stream()
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", url, json=dict(body), timeout=timeout) as response:
                if response.status_code >= 400:
                    message = error_message(await response.aread())
                    if response.status_code < 500:
                        raise RequestRejected(base, response.status_code, message)
                    return RequestResult(0, None, None, None, started, time.monotonic(),
                                         error=f"HTTP {response.status_code}: {message}")
                await _read_stream(response, stream)
    except TimeoutError:
        return RequestResult(0, None, None, None, started, time.monotonic(), error=f"no answer within {timeout:g}s")
    except httpx.ConnectError as exc:
        raise ProbeFault(f"lost {base}: {one_line(str(exc)) or 'connection refused'}") from None
    except httpx.HTTPError as exc:
        return RequestResult(0, None, None, None, started, time.monotonic(),
                             error=f"{type(exc).__name__}: {one_line(str(exc))}")
    return stream.result(started, time.monotonic())
