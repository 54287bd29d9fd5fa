"""Every OpenAI-compatible server, not only vLLM's spelling: a second, real server style through the tap — a
Starlette/uvicorn app writing its SSE events with Python's json.dumps defaults (`"choices": []`, as FastChat-style
servers do) — as the upstream and as the routing fallback. A client that did not ask for usage never sees the usage
event the tap asked for; everything else reads as that server wrote it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as Path

from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.tap import TapRequest, start_tap
from specdecode_exporter.tap.model import BENEFIT, FALLBACK, Route
from tests.tap.fake_vllm import FakeVllm
from tests.tap.harness import Recorder, dechunk, fetch, request_bytes, run, tap_settings


def python_style_server() -> Starlette:
    """Completions as a Python OpenAI-compatible server writes them: json.dumps with its default separators, the
    usage event (`"choices": []`) only when stream_options.include_usage asks for it."""

    async def completions(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        tokens = int(body.get("max_tokens", 3))
        usage = {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": 2 + tokens}
        if not body.get("stream"):
            return JSONResponse({"id": "cmpl-py", "object": "text_completion", "model": "m",
                                 "choices": [{"index": 0, "text": " a" * tokens, "finish_reason": "length"}],
                                 "usage": usage})

        async def events() -> AsyncIterator[bytes]:
            for i in range(tokens):
                last = i == tokens - 1
                chunk = {"id": "cmpl-py", "object": "text_completion", "model": "m",
                         "choices": [{"index": 0, "text": " a", "finish_reason": "length" if last else None}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                await asyncio.sleep(0)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({'id': 'cmpl-py', 'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Path("/v1/completions", completions, methods=["POST"])])


@pytest.fixture(scope="module")
def python_server() -> Iterator[str]:
    with ThreadedServer(python_style_server(), bind_socket(), name="python-style").start() as server:
        yield server.base_url


STREAM = {"model": "m", "prompt": "a", "max_tokens": 4, "stream": True}


def test_its_usage_event_never_reaches_a_client_that_did_not_ask(python_server: str) -> None:
    port = int(python_server.rsplit(":", 1)[1])

    async def main() -> None:
        recorder = Recorder()
        tap = await start_tap("127.0.0.1", 0, tap_settings(python_server), recorder)
        direct = await fetch(port, request_bytes("/v1/completions", STREAM))
        through = await fetch(tap.port, request_bytes("/v1/completions", STREAM))
        await tap.close()
        assert b'"choices": [{' in dechunk(direct)  # the server's spelling, with spaces
        assert dechunk(through) == dechunk(direct)  # no `"choices": []` event, nothing else changed
        ((request, result),) = await recorder.wait(1)
        assert request.usage_injected and result.usage == {"prompt_tokens": 2, "completion_tokens": 4,
                                                           "total_tokens": 6}

    run("uvloop", main)


def test_as_the_routing_fallback(python_server: str) -> None:
    class AlwaysFallback:
        def route(self, request: TapRequest) -> Route:
            return Route(FALLBACK, BENEFIT, True, ("m",))

    port = int(python_server.rsplit(":", 1)[1])

    async def main() -> None:
        speculative = await FakeVllm().start()
        recorder = Recorder()
        tap = await start_tap("127.0.0.1", 0, tap_settings(speculative.url, python_server), recorder,
                              router=AlwaysFallback())
        direct = await fetch(port, request_bytes("/v1/completions", STREAM))
        through = await fetch(tap.port, request_bytes("/v1/completions", STREAM))
        await tap.close()
        await speculative.close()
        assert through.partition(b"\r\n\r\n")[0].endswith(b"\r\nx-specdecode-route: fallback; reason=benefit")
        assert dechunk(through) == dechunk(direct)
        assert not speculative.exchanges
        ((_, result),) = await recorder.wait(1)
        assert result.usage is not None and result.metrics is None and result.reason == "not_enabled"

    run("uvloop", main)
