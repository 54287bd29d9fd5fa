"""Routing in the relay, over real loopback HTTP with two upstreams (the speculative pool and the fallback): each
inspected request goes where the router says, everything else to the speculative pool; responses are the pool's
own bytes plus one header; a fallback that refuses, hangs or dies before answering costs no request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from specdecode_exporter.tap import Tap, TapRequest, start_tap
from specdecode_exporter.tap.model import (
    BENEFIT,
    CANARY,
    FALLBACK,
    FALLBACK_DOWN,
    SPECULATIVE,
    UNROUTED,
    Route,
)
from specdecode_exporter.tap.relay.fallback_watch import check_fallback
from tests.tap.fake_vllm import FakeVllm
from tests.tap.harness import (
    LOOPS,
    Client,
    Recorder,
    dechunk,
    fetch,
    request_bytes,
    run,
    tap_settings,
    unanswering_listener,
)

COMPLETION = {"model": "tiny", "prompt": "a", "max_tokens": 3}
HEADER = b"x-specdecode-route"


@dataclass
class ByWorkload:
    """A router for the relay tests: the workload header names the decision."""

    enforce: bool = True
    asked: list[str | None] = field(default_factory=list)

    def route(self, request: TapRequest) -> Route:
        self.asked.append(request.workload)
        key = ("tiny", request.workload or "unset", "unset", None)
        if request.workload == "slow":
            return Route(FALLBACK, BENEFIT, self.enforce, key)
        if request.workload == "canary":
            return Route(SPECULATIVE, CANARY, True, key)
        return Route(SPECULATIVE, UNROUTED, True, key)


@contextlib.asynccontextmanager
async def two_pools(fallback_url: str | None = None, router_options: dict[str, Any] | None = None,
                    fallback_check: tuple[float, float] | None = None, **settings: Any
                    ) -> AsyncIterator[tuple[FakeVllm, FakeVllm, Tap, Recorder, ByWorkload]]:
    speculative, fallback = await FakeVllm().start(), await FakeVllm().start()
    recorder, router = Recorder(), ByWorkload(**(router_options or {}))
    tap = await start_tap("127.0.0.1", 0, tap_settings(speculative.url, fallback_url or fallback.url, **settings),
                          recorder, router=router, **({"fallback_check": fallback_check} if fallback_check else {}))
    try:
        yield speculative, fallback, tap, recorder, router
    finally:
        await tap.close()
        await speculative.close()
        await fallback.close()


def _completion(workload: str, **extra: Any) -> bytes:
    return request_bytes("/v1/completions", {**COMPLETION, **extra}, headers={"x-workload": workload})


def _route_header(response: bytes) -> bytes | None:
    head = response.partition(b"\r\n\r\n")[0]
    values = [line.partition(b":")[2].strip() for line in head.split(b"\r\n") if line.lower().startswith(HEADER)]
    assert len(values) <= 1
    return values[0] if values else None


def _without_route_header(response: bytes) -> bytes:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(HEADER)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("stream", [False, True])
def test_each_request_goes_where_the_router_says_and_reads_as_that_pool_sent_it(loop: str, stream: bool) -> None:
    async def main() -> None:
        async with two_pools() as (speculative, fallback, tap, recorder, _):
            for workload, pool, header in (("slow", fallback, b"fallback; reason=benefit"),
                                           ("chat", speculative, b"speculative; reason=unrouted"),
                                           ("canary", speculative, b"speculative; reason=canary")):
                raw = _completion(workload, stream=stream)
                direct = await fetch(pool.port, raw)
                before = len(pool.exchanges)
                through = await fetch(tap.port, raw)
                assert len(pool.exchanges) == before + 1, workload
                assert _route_header(through) == header
                assert _without_route_header(through) == direct  # nothing else differs
            seen = await recorder.wait(3)
            assert [(r.route.upstream, r.route.reason) for _, r in seen if r.route] == [
                (FALLBACK, BENEFIT), (SPECULATIVE, UNROUTED), (SPECULATIVE, CANARY)]
            assert all(result.metrics is not None for _, result in seen)

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_one_client_connection_keeps_one_connection_to_each_pool(loop: str) -> None:
    """Keep-alive across pools: the connection to the pool not in use is parked and used again, and requests that
    are not completions (here /v1/models) always go to the speculative pool."""
    async def main() -> None:
        async with two_pools() as (speculative, fallback, tap, _recorder, _):
            client = await Client.open(tap.port)
            plan = ["slow", "chat", "slow", "models", "slow", "slow", "chat", "models"]
            for step in plan:
                raw = (request_bytes("/v1/models", method="GET") if step == "models" else _completion(step))
                response = await client.exchange(raw)
                assert response.startswith(b"HTTP/1.1 200 ")
                assert (_route_header(response) is None) == (step == "models")
            await client.close()
            assert (speculative.connections, fallback.connections) == (1, 1)
            paths = [(e.path, (e.body or {}).get("prompt")) for e in speculative.exchanges]
            assert paths.count(("/v1/models", None)) == 2 and len(fallback.exchanges) == plan.count("slow")

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_pipelined_requests_for_both_pools_are_answered_in_order(loop: str) -> None:
    async def main() -> None:
        async with two_pools() as (speculative, fallback, tap, recorder, _):
            workloads = ["chat", "slow", "slow", "chat", "slow"]
            raws = [_completion(w, max_tokens=2 + i, stream=i % 2 == 0) for i, w in enumerate(workloads)]
            client = await Client.open(tap.port)
            await client.send(b"".join(raws))  # every request in one write
            responses = [await client.response() for _ in raws]
            await client.close()
            for workload, response in zip(workloads, responses, strict=True):
                assert _route_header(response) == (b"fallback; reason=benefit" if workload == "slow"
                                                   else b"speculative; reason=unrouted")
            # Each response belongs to its request (max_tokens differs): its own usage, in order.
            seen = await recorder.wait(len(raws))
            assert [r.usage["completion_tokens"] if r.usage else None for _, r in seen] == [40] * len(raws)
            assert [(e.body or {})["max_tokens"] for e in fallback.exchanges] == [3, 4, 6]
            assert [(e.body or {})["max_tokens"] for e in speculative.exchanges] == [2, 5]

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_fallback_refusing_sends_the_request_to_the_speculative_pool(loop: str) -> None:
    async def main() -> None:
        async with two_pools(f"http://127.0.0.1:{_closed_port()}") as (speculative, _, tap, recorder, _router):
            started = time.monotonic()
            response = await fetch(tap.port, _completion("slow", stream=True))
            assert time.monotonic() - started < 1.0  # refused: no connect timeout to wait for
            assert response.startswith(b"HTTP/1.1 200 ")
            assert _route_header(response) == b"speculative; reason=fallback_down"
            assert dechunk(response) == dechunk(await fetch(speculative.port, _completion("slow", stream=True)))
            assert tap.stats().fallback_available is False  # not tried again at once
            second = await fetch(tap.port, _completion("slow"))
            assert _route_header(second) == b"speculative; reason=fallback_down"
            seen = await recorder.wait(2)
            routes = [(r.route.upstream, r.route.reason) for _, r in seen if r.route]
            assert routes == [(SPECULATIVE, FALLBACK_DOWN)] * 2
            assert all(r.status == 200 and r.metrics is not None for _, r in seen)

    run(loop, main)


def test_fallback_not_answering_connects_costs_the_connect_timeout_once() -> None:
    async def main() -> None:
        await asyncio.sleep(0.2)
        async with two_pools(f"http://127.0.0.1:{port}", connect_timeout=0.5) as (
                _, _fallback, tap, recorder, _router):
            first = await fetch(tap.port, _completion("slow"))
            assert _route_header(first) == b"speculative; reason=fallback_down"
            started = time.monotonic()
            second = await fetch(tap.port, _completion("slow"))
            assert time.monotonic() - started < 0.5  # the fallback is known down: no second wait
            assert _route_header(second) == b"speculative; reason=fallback_down"
            assert [r.status for _, r in await recorder.wait(2)] == [200, 200]

    with unanswering_listener() as port:
        run("uvloop", main)


class HungServer:
    """A server that accepts connections and reads requests but never answers them (a stopped or wedged
    process behind a listening socket); it answers ``GET /health`` with ``health`` once that is set, and any other
    request with ``reply`` once that is."""

    def __init__(self) -> None:
        self.health: bytes | None = None
        self.reply: bytes | None = None
        self.requests: list[bytes] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests.append(head.split(b" ", 2)[1])
            answer = self.health if head.startswith(b"GET /health ") else self.reply
            if answer is not None:
                writer.write(answer)
                writer.close()

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_fallback_that_accepts_but_never_answers_loses_no_request(loop: str) -> None:
    """A stopped fallback still completes connects: its unanswered health check takes it out of routing, and the
    request it holds unanswered goes to the speculative pool; once it answers again, routing uses it again."""
    async def main() -> None:
        hung = HungServer()
        url = await hung.start()
        try:
            async with two_pools(url, fallback_check=(0.2, 0.3)) as (speculative, _fb, tap, recorder, _router):
                started = time.monotonic()
                response = await fetch(tap.port, _completion("slow", stream=True))
                assert time.monotonic() - started < 2.0  # a check's interval and timeout, not the client's patience
                assert _route_header(response) == b"speculative; reason=fallback_down"
                assert dechunk(response).endswith(b"data: [DONE]\n\n")
                assert b"/v1/completions" in hung.requests and len(speculative.exchanges) == 1
                assert tap.stats().fallback_available is False
                second = await fetch(tap.port, _completion("slow"))  # straight to the speculative pool
                assert _route_header(second) == b"speculative; reason=fallback_down"
                assert hung.requests.count(b"/v1/completions") == 1
                hung.health = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
                for _ in range(50):
                    if tap.stats().fallback_available:
                        break
                    await asyncio.sleep(0.05)
                assert tap.stats().fallback_available is True
                assert [r.status for _, r in await recorder.wait(2)] == [200, 200]
        finally:
            await hung.close()

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("garbage", [b"GARBAGE NOT HTTP\r\n\r\n", b"SSH-2.0-OpenSSH_9.2\r\n"])
def test_a_fallback_answering_with_what_is_not_http_loses_no_request(loop: str, garbage: bytes) -> None:
    """Bytes that are not an HTTP response from the fallback, before anything reached the client: the request goes
    to the speculative pool, and the client reads that pool's response, not the fallback's garbage."""
    async def main() -> None:
        wrong = HungServer()
        wrong.reply = garbage
        url = await wrong.start()
        try:
            async with two_pools(url) as (speculative, _fb, tap, recorder, _router):
                response = await fetch(tap.port, _completion("slow", stream=True))
                assert response.startswith(b"HTTP/1.1 200 ")
                assert _route_header(response) == b"speculative; reason=fallback_down"
                assert dechunk(response).endswith(b"data: [DONE]\n\n")
                assert garbage not in response and len(speculative.exchanges) == 1
                assert [r.status for _, r in await recorder.wait(1)] == [200]
        finally:
            await wrong.close()

    run(loop, main)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_the_fallback_check_names_an_ipv6_host_in_brackets() -> None:
    heads: list[bytes] = []

    async def main() -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
            writer.close()

        server = await asyncio.start_server(answer, "::1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            assert await check_fallback("::1", port, 1.0) is None
        finally:
            server.close()
            await server.wait_closed()
        assert f"\r\nHost: [::1]:{port}\r\n".encode() in heads[0]

    run("uvloop", main)


@pytest.mark.parametrize(("answer", "verdict"), [
    (b"HTTP/1.1 200 OK\r\n\r\n", None),
    (b"HTTP/1.1 404 Not Found\r\n\r\n", None),  # no /health there, but the server answers
    (b"HTTP/1.1 503 Service Unavailable\r\n\r\n", "health check answered 503"),
    (b"GARBAGE NOT HTTP\r\n", "health check answered with something that is not HTTP"),
    (None, "no answer to a health check within 0.3 s"),
])
def test_the_fallback_check_says_why_in_one_line(answer: bytes | None, verdict: str | None) -> None:
    async def main() -> None:
        hung = HungServer()
        hung.health = answer
        host, port = (await hung.start()).removeprefix("http://").split(":")
        try:
            assert await check_fallback(host, int(port), 0.3) == verdict
        finally:
            await hung.close()
        assert await check_fallback("127.0.0.1", _closed_port(), 0.3) == "health check failed: connection refused"

    run("uvloop", main)


@pytest.mark.parametrize("loop", LOOPS)
def test_fallback_dying_before_it_answers_loses_no_request(loop: str) -> None:
    """The fallback drops the connection on receiving the request: the request was never answered, so it goes to
    the speculative pool, and the client reads a whole response."""
    async def main() -> None:
        async with two_pools() as (speculative, fallback, tap, recorder, _):
            fallback.dying = True
            client = await Client.open(tap.port)
            response = await client.exchange(_completion("slow", stream=True))
            assert _route_header(response) == b"speculative; reason=fallback_down"
            assert dechunk(response).endswith(b"data: [DONE]\n\n")
            assert len(fallback.exchanges) == 1 and len(speculative.exchanges) == 1
            # The same client connection goes on.
            assert (await client.exchange(_completion("chat"))).startswith(b"HTTP/1.1 200 ")
            await client.close()
            seen = await recorder.wait(2)
            assert [(r.status, r.route.reason if r.route else None) for _, r in seen] == [
                (200, FALLBACK_DOWN), (200, UNROUTED)]

    run(loop, main)


def test_fallback_dying_mid_response_cuts_that_response_as_the_pool_would() -> None:
    async def main() -> None:
        async with two_pools() as (_, _fallback, tap, recorder, _router):
            client = await Client.open(tap.port)
            await client.send(_completion("slow", stream=True, fake_abort_after=2))
            head = await client.reader.readuntil(b"\r\n\r\n")
            assert b"x-specdecode-route: fallback; reason=benefit" in head
            assert b"[DONE]" not in await client.reader.read()  # cut short, as without the tap
            ((_, result),) = await recorder.wait(1)
            assert result.reason == "upstream_failed" and result.route is not None
            assert result.route.upstream == FALLBACK

    run("uvloop", main)


@pytest.mark.parametrize("loop", LOOPS)
def test_observe_mode_sends_everything_to_the_speculative_pool(loop: str) -> None:
    async def main() -> None:
        async with two_pools(router_options={"enforce": False}) as (speculative, fallback, tap, recorder, _):
            response = await fetch(tap.port, _completion("slow"))
            assert _route_header(response) == b"speculative; reason=observe"
            assert (len(speculative.exchanges), len(fallback.exchanges)) == (1, 0)
            ((_, result),) = await recorder.wait(1)
            assert result.route is not None and (result.route.upstream, result.route.reason) == (FALLBACK, BENEFIT)

    run(loop, main)


def test_a_failing_router_sends_to_the_speculative_pool() -> None:
    class Broken:
        def route(self, request: TapRequest) -> Route:
            raise RuntimeError("bug")

    async def main() -> None:
        speculative, fallback = await FakeVllm().start(), await FakeVllm().start()
        recorder = Recorder()
        tap = await start_tap("127.0.0.1", 0, tap_settings(speculative.url, fallback.url), recorder,
                              router=Broken())
        response = await fetch(tap.port, _completion("slow"))
        assert response.startswith(b"HTTP/1.1 200 ") and _route_header(response) is None
        ((_, result),) = await recorder.wait(1)
        assert result.route is None and result.metrics is not None
        await tap.close()
        await speculative.close()
        await fallback.close()

    run("uvloop", main)


def test_streams_record_when_their_body_started() -> None:
    async def main() -> None:
        async with two_pools() as (_, _fallback, tap, recorder, _router):
            await fetch(tap.port, _completion("slow", stream=True, fake_interval=0.02, max_tokens=5))
            ((_, result),) = await recorder.wait(1)
            assert result.first_byte is not None and result.first_body is not None
            assert result.started <= result.first_byte <= result.first_body < result.finished
            assert result.finished - result.first_body >= 0.02 * 5  # the events came 20 ms apart

    run("uvloop", main)


def test_a_routing_tap_needs_a_fallback() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="fallback"):
            await start_tap("127.0.0.1", 0, tap_settings(), Recorder(), router=ByWorkload())

    run("uvloop", main)


def test_request_bodies_reach_the_fallback_unchanged() -> None:
    async def main() -> None:
        async with two_pools() as (_, fallback, tap, _recorder, _router):
            raw = _completion("slow", temperature=0.25, stream=True, stream_options={"include_usage": True})
            await fetch(tap.port, raw)
            assert fallback.exchanges[0].raw == raw
            body = json.loads(raw.partition(b"\r\n\r\n")[2])
            assert fallback.exchanges[0].body == body

    run("uvloop", main)
