"""Byte-for-byte passthrough over real loopback HTTP: the client gets what it would get from the upstream directly,
and the upstream gets what the client sent (apart from the one rewrite: asking a stream for its usage)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.tap.harness import LOOPS, Client, dechunk, fetch, request_bytes, run, tapped

REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/v1/completions", {"model": "tiny", "prompt": "lin mire", "max_tokens": 4}),
    "chat": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ),
}
SHAPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "stream": {"stream": True},
    "stream_usage": {"stream": True, "stream_options": {"include_usage": True}},
    "stream_options_without_usage": {"stream": True, "stream_options": {"continuous_usage_stats": True}},
    "n2": {"stream": True, "n": 2, "temperature": 1.0},
    # A server spelling its JSON as json.dumps does ("choices": []): the usage event is still found and removed.
    "stream_spaced_json": {"stream": True, "fake_json": "spaced"},
    "plain_spaced_json": {"fake_json": "spaced"},
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("kind", list(REQUESTS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_response_bytes_identical_to_direct(loop: str, kind: str, shape: str) -> None:
    path, body = REQUESTS[kind]
    raw = request_bytes(path, {**body, **SHAPES[shape]}, headers={"authorization": "Bearer s3cret"})

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            direct = await fetch(fake.port, raw)
            tapped_response = await fetch(tap.port, raw)
            assert tapped_response == direct
            await recorder.wait(1)
            # What the upstream received from the tap: the client's bytes, unless usage was injected.
            received = fake.exchanges[-1].raw
            request, result = recorder.seen[0]
            if request.usage_injected:
                head, _, sent_body = received.partition(b"\r\n\r\n")
                client_head, _, client_body = raw.partition(b"\r\n\r\n")
                options = {**json.loads(client_body).get("stream_options", {}), "include_usage": True}
                if "continuous_usage_stats" in options:
                    options["continuous_usage_stats"] = False  # ignored by vLLM without include_usage
                assert json.loads(sent_body) == {**json.loads(client_body), "stream_options": options}
                length = b"content-length: %d"
                assert head == client_head.replace(length % len(client_body), length % len(sent_body))
            else:
                assert received == raw
            assert result.status == 200

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_keep_alive_several_requests_on_one_connection(loop: str) -> None:
    """One client connection, one upstream connection, mixed requests: each answered exactly as direct."""
    raws = [
        request_bytes("/v1/completions", {"prompt": "a", "stream": True, "max_tokens": 3}),
        request_bytes("/v1/models", method="GET"),
        request_bytes("/v1/completions", {"prompt": "a", "max_tokens": 3}),
        request_bytes("/v1/chat/completions", {"messages": [], "stream": True, "max_tokens": 2}),
        request_bytes("/health", method="HEAD"),
    ]

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            direct = [await fetch(fake.port, raw) for raw in raws]
            connections_before = fake.connections
            client = await Client.open(tap.port)
            for raw, expected in zip(raws, direct, strict=True):
                assert await client.exchange(raw) == expected
            await client.close()
            assert fake.connections == connections_before + 1
            assert len(await recorder.wait(3)) == 3

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_pipelined_requests(loop: str) -> None:
    raws = [request_bytes("/v1/completions", {"prompt": "a", "stream": True, "max_tokens": n}) for n in (2, 3)]

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            direct = [await fetch(fake.port, raw) for raw in raws]
            client = await Client.open(tap.port)
            await client.send(b"".join(raws))
            assert [await client.response(), await client.response()] == direct
            await client.close()
            assert len(await recorder.wait(2)) == 2

    run(loop, main)


UNTOUCHED = {
    "malformed_json": request_bytes("/v1/completions", b'{"prompt": "a", "stream": tru'),
    "json_array": request_bytes("/v1/completions", b"[1, 2, 3]"),
    "other_endpoint": request_bytes("/v1/embeddings", {"input": "a", "stream": True}),
    "other_method": request_bytes("/v1/completions", {"prompt": "a", "stream": True}, method="PUT"),
    "get": request_bytes("/v1/completions?stream=true", method="GET"),
    "query_string": request_bytes("/v1/x?a=b", {"stream": True}, method="PATCH"),
    "chunked_body": b"POST /v1/completions HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n"
    b'7\r\n{"promp\r\n15\r\nt": "a", "stream": 1}\r\n0\r\n\r\n',
    "expect_continue": request_bytes("/v1/echo", b'{"stream": true}', headers={"expect": "100-continue"}),
    "odd_header_case": b"POST /v1/completions HTTP/1.1\r\nHOST: a\r\nCoNtEnT-LeNgTh: 2\r\nX-Odd:\t v \r\n\r\n{}",
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("case", list(UNTOUCHED))
def test_requests_not_understood_pass_untouched(loop: str, case: str) -> None:
    raw = UNTOUCHED[case]

    inspected = case == "odd_header_case"  # a valid completion request in unusual spelling

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            direct = await fetch(fake.port, raw)
            assert await fetch(tap.port, raw) == direct
            assert fake.exchanges[-1].raw == raw
            if inspected:
                await recorder.wait(1)
        assert len(recorder.seen) == (1 if inspected else 0)  # the tap is closed: nothing more can arrive

    run(loop, main)


def test_body_over_the_inspection_cap_passes_untouched() -> None:
    body = json.dumps({"prompt": "x" * 5000, "stream": True, "max_tokens": 2}).encode()
    raw = request_bytes("/v1/completions", body)

    async def main() -> None:
        async with tapped(max_inspect_body=1000) as (fake, tap, recorder):
            direct = await fetch(fake.port, raw)
            assert await fetch(tap.port, raw) == direct
            assert fake.exchanges[-1].raw == raw
            assert recorder.seen == []

    run("uvloop", main)


def test_large_body_arriving_in_pieces_is_inspected() -> None:
    body = json.dumps({"prompt": "y" * 300_000, "stream": True, "max_tokens": 2}).encode()
    raw = request_bytes("/v1/completions", body)

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            direct = await fetch(fake.port, raw)
            client = await Client.open(tap.port)
            for start in range(0, len(raw), 65536):
                await client.send(raw[start : start + 65536])
                await asyncio.sleep(0.001)
            assert await client.response() == direct
            await client.close()
            ((request, result),) = await recorder.wait(1)
            assert request.usage_injected and result.metrics is not None

    run("asyncio", main)


@pytest.mark.parametrize("loop", LOOPS)
def test_upgrade_becomes_a_tunnel(loop: str) -> None:
    async def main() -> None:
        async with tapped() as (_, tap, recorder):
            client = await Client.open(tap.port)
            await client.send(
                request_bytes("/v1/upgrade", method="GET", headers={"connection": "Upgrade", "upgrade": "echo"})
            )
            head = await client.reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101 ")
            tunnelled = b"POST /v1/completions HTTP/1.1\r\n\r\nnot http any more"
            await client.send(tunnelled)
            assert await client.reader.readexactly(len(tunnelled)) == tunnelled
            await client.close()
            assert recorder.seen == []

    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("status", [400, 404, 500])
def test_error_responses_pass_unchanged(loop: str, status: int) -> None:
    raw = request_bytes("/v1/completions", {"prompt": "a", "stream": True, "fake_status": status})

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            direct = await fetch(fake.port, raw)
            assert direct.startswith(b"HTTP/1.1 %d " % status)
            assert await fetch(tap.port, raw) == direct
            ((_, result),) = await recorder.wait(1)
            assert (result.status, result.reason, result.metrics) == (status, "http_error", None)

    run(loop, main)


@pytest.mark.parametrize("framing", ["coalesced", "split"])
def test_usage_event_removed_whatever_the_chunking(framing: str) -> None:
    """The usage event sharing a chunk with others, or split across chunks and reads: the client gets the same
    events, in the same order, as without the tap (the chunk boundaries around the removed event may differ)."""
    request = {"prompt": "a", "stream": True, "max_tokens": 3, "fake_framing": framing}

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            direct = await fetch(fake.port, request_bytes("/v1/completions", request))
            through = await fetch(tap.port, request_bytes("/v1/completions", request))
            assert dechunk(through) == dechunk(direct)
            assert through.partition(b"\r\n\r\n")[0] == direct.partition(b"\r\n\r\n")[0]
            ((tap_request, result),) = await recorder.wait(1)
            assert tap_request.usage_injected and result.metrics is not None

    run("uvloop", main)
