"""The fake vLLM's ASGI app (Starlette): /metrics, /health, /v1/models, /v1/completions, /-/ controls."""

from __future__ import annotations

import asyncio
import gzip
import math
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.simulator import sglang_responses
from specdecode_exporter.simulator.exposition import render
from specdecode_exporter.simulator.requests import (
    RequestError,
    parse_call,
    request_metrics,
    response_body,
    stream_events,
)
from specdecode_exporter.simulator.scenario import FAULTS
from specdecode_exporter.simulator.simulator import Simulator
from specdecode_exporter.simulator.text_format import content_type

# Not an exposition: an HTML error page from a proxy followed by a broken sample line.
GARBAGE = (
    b"<html><head><title>502 Bad Gateway</title></head><body>upstream hiccup</body></html>\n"
    b'vllm:spec_decode_num_drafts_total{engine="0" 12 13 14 \x00garbage\n'
)
SLOW_CHUNKS = 20
_PHASE_KEYS = ("acceptance_rate", "drafts_per_second", "position_acceptance", "model", "resume", "phase")


def accepts_gzip(header: str | None) -> bool:
    for part in (header or "").split(","):
        name, _, params = part.partition(";")
        if name.strip().lower() not in ("gzip", "*"):
            continue
        params = params.strip()
        if not params.startswith("q="):
            return True
        try:
            return float(params[2:]) > 0
        except ValueError:
            return False
    return False


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _dribble(body: bytes, seconds: float) -> AsyncIterator[bytes]:
    size = max(1, math.ceil(len(body) / SLOW_CHUNKS))
    for start in range(0, len(body), size):
        await asyncio.sleep(seconds / SLOW_CHUNKS)
        yield body[start:start + size]


def _number(payload: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ConfigError(f"{key}: expected a number between {lo:g} and {hi:g}, got {value!r}")
    return float(value)


def _curve(payload: dict[str, Any]) -> tuple[float, ...] | None:
    value = payload.get("position_acceptance")
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for v in value
    ):
        raise ConfigError(f"position_acceptance: expected a list of numbers between 0 and 1, got {value!r}")
    return tuple(float(v) for v in value)


def apply_phase_request(sim: Simulator, payload: object) -> None:
    """POST /-/phase: resume, jump to a named phase, or override live parameters (pauses the scenario)."""
    if not isinstance(payload, dict):
        raise ConfigError("body: expected a JSON object")
    for key in payload:
        if key not in _PHASE_KEYS:
            raise ConfigError(f"{key}: unknown key (expected one of: {', '.join(_PHASE_KEYS)})")
    if payload.get("resume") is True:
        sim.resume()
    if payload.get("phase") is not None:
        sim.goto_phase(str(payload["phase"]))
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"model: expected a model name, got {model!r}")
    alpha = _number(payload, "acceptance_rate", 0.0, 1.0)
    dps = _number(payload, "drafts_per_second", 0.0, 1e7)
    curve = _curve(payload)
    if alpha is not None or dps is not None or curve is not None:
        sim.set_override(model=model, acceptance_rate=alpha, drafts_per_second=dps, position_acceptance=curve)


def _prompt_tokens(payload: dict[str, Any], chat: bool) -> int:
    if chat:
        messages = payload.get("messages")
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict)) \
            if isinstance(messages, list) else ""
    else:
        prompt = payload.get("prompt", "")
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return max(1, len(text.split()))


async def _paced(events: Iterator[bytes], seconds: float) -> AsyncIterator[bytes]:
    """The stream at the simulated step time: one event per engine step, as vLLM sends them."""
    for event in events:
        yield event
        if seconds > 0:
            await asyncio.sleep(seconds)


async def serve_completion(sim: Simulator, request: Request, chat: bool) -> Response:
    try:
        payload = await request.json()
    except ValueError:
        return JSONResponse(RequestError(400, "body: expected a JSON object").body, status_code=400)
    try:
        call = parse_call(payload, chat, sim.model_names())
    except RequestError as exc:
        return JSONResponse(exc.body, status_code=exc.status)
    prompt_tokens = _prompt_tokens(payload, chat)
    generations = sim.serve(call, prompt_tokens, request.headers.get("x-workload"))
    step = generations[0].step_seconds / sim.time_scale if sim.pace else 0.0
    if sim.format == "sglang":  # SGLang's shapes: sglext instead of vLLM's metrics
        if not call.stream:
            return JSONResponse(sglang_responses.response_body(call, generations, prompt_tokens))
        return StreamingResponse(_paced(sglang_responses.stream_events(call, generations[0], prompt_tokens), step),
                                 media_type="text/event-stream")
    single = call.n == 1
    metrics = request_metrics(generations[0], sim.per_request_metrics, sim.request_timings) if single else None
    if not call.stream:
        return JSONResponse(response_body(call, generations, prompt_tokens, metrics))
    return StreamingResponse(_paced(stream_events(call, generations[0], prompt_tokens, metrics), step),
                             media_type="text/event-stream")


def build_app(sim: Simulator) -> Starlette:
    app = Starlette(routes=[*_metrics_routes(sim), *_control_routes(sim)])
    app.state.simulator = sim
    return app


def _metrics_routes(sim: Simulator) -> list[Route]:
    """/metrics (and trtllm-serve's /prometheus/metrics), /health, and the OpenAI API."""

    async def metrics(request: Request) -> Response:
        if sim.format == "trtllm" and request.url.path == "/metrics":
            return JSONResponse([])  # trtllm-serve's /metrics is JSON iteration statistics
        fault = sim.fault
        if fault == "http_500":
            return PlainTextResponse("Internal Server Error", status_code=500)
        if fault == "garbage":
            return Response(GARBAGE, media_type="text/plain; charset=utf-8")
        if fault == "hang":
            await asyncio.sleep(sim.hang_seconds)
            return PlainTextResponse("Gateway Timeout", status_code=504)
        body = render(sim.format, sim.snapshot(), drop_spec=fault == "drop_spec")
        headers: dict[str, str] = {}
        if accepts_gzip(request.headers.get("accept-encoding")):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        if fault == "slow":
            return StreamingResponse(_dribble(body, sim.slow_seconds), media_type=content_type(sim.format),
                                     headers=headers)
        return Response(body, media_type=content_type(sim.format), headers=headers)

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def models(_: Request) -> JSONResponse:
        now = int(time.time())
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": name, "parent": None}
            for name in sim.model_names()
        ]})

    async def completions(request: Request) -> Response:
        return await serve_completion(sim, request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await serve_completion(sim, request, chat=True)

    return [Route("/metrics", metrics, methods=["GET"]),
            Route("/prometheus/metrics", metrics, methods=["GET"]),  # where trtllm-serve serves Prometheus text
            Route("/health", health, methods=["GET"]), Route("/v1/models", models, methods=["GET"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"])]


def _control_routes(sim: Simulator) -> list[Route]:
    """/-/: the tests' and the demo's hands on the simulation (state, phase, restart, fault)."""

    async def state(_: Request) -> JSONResponse:
        return JSONResponse(sim.state())

    async def phase(request: Request) -> Response:
        try:
            apply_phase_request(sim, await request.json())
        except ConfigError as exc:
            return _error(400, str(exc))
        except ValueError:
            return _error(400, "body: expected a JSON object")
        return JSONResponse(sim.state())

    async def restart(_: Request) -> JSONResponse:
        sim.restart()
        return JSONResponse(sim.state())

    async def fault(request: Request) -> Response:
        try:
            payload = await request.json()
        except ValueError:
            return _error(400, "body: expected a JSON object")
        mode = payload.get("mode") if isinstance(payload, dict) else None
        if mode not in FAULTS:
            return _error(400, f"mode: expected one of {', '.join(FAULTS)}, got {mode!r}")
        sim.set_fault(mode)
        return JSONResponse({"fault": sim.fault})

    return [Route("/-/state", state, methods=["GET"]), Route("/-/phase", phase, methods=["POST"]),
            Route("/-/restart", restart, methods=["POST"]), Route("/-/fault", fault, methods=["POST"])]
