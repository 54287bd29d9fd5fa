"""The collection's HTTP transport (pipeline/transport.py) against a real server on loopback: one connection kept
for every collection, each way a body may be framed, a connection the server closed while idle, broken answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

import pytest

from specdecode_exporter.pipeline.scrape import FailureReason, FetchResult, fetch
from specdecode_exporter.sidecar.collection import new_client
from specdecode_exporter.sidecar.config import TargetConfig
from tests.faults.hostile import Handler, HostileServer, read_request, response_head, serve

BODY = b"vllm:spec_decode_num_drafts_total 10\n" * 200


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[HostileServer], Handler]], HostileServer]]:
    servers: list[HostileServer] = []

    def start(behaviour: Callable[[HostileServer], Handler]) -> HostileServer:
        servers.append(serve(behaviour))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def answering(answer: Callable[[int], Awaitable[bytes] | bytes], close_after: bool = False
              ) -> Callable[[HostileServer], Handler]:
    """Answers every request on a connection with ``answer(n)`` (n: the request's number over all connections);
    counts connections in ``server.bytes_sent`` (here: connections accepted)."""
    def make(server: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            server.bytes_sent += 1  # one more connection
            while True:
                server.requests.append(await read_request(reader))
                data = answer(len(server.requests))
                writer.write(data if isinstance(data, bytes) else await data)
                await writer.drain()
                if close_after:
                    return  # the handler's finally closes the connection, with no Connection: close said
        return handle
    return make


def fetch_many(url: str, count: int) -> list[FetchResult]:
    async def main() -> list[FetchResult]:
        async with new_client(TargetConfig("t", url)) as client:
            results = []
            for _ in range(count):
                results.append(await fetch(client, url, 3.0, 1 << 20))
                await asyncio.sleep(0.02)  # as between collections: a close by the server arrives meanwhile
            return results
    return asyncio.run(main())


def test_one_connection_serves_every_collection(server: Callable[..., HostileServer]) -> None:
    s = server(answering(lambda n: response_head(200, {"Content-Length": str(len(BODY))}) + BODY))
    results = fetch_many(s.url, 5)
    assert [r.body for r in results] == [BODY] * 5
    assert s.bytes_sent == 1 and len(s.requests) == 5  # five requests, one connection
    assert s.requests[0][0] == b"GET /metrics HTTP/1.1"
    assert b"accept-encoding: gzip" in [line.lower() for line in s.requests[0]]


def test_a_connection_the_server_closed_while_idle_is_replaced(server: Callable[..., HostileServer]) -> None:
    s = server(answering(lambda n: response_head(200, {"Content-Length": str(len(BODY))}) + BODY, close_after=True))
    results = fetch_many(s.url, 3)
    assert [r.body for r in results] == [BODY] * 3 and s.bytes_sent == 3


def test_chunked_bodies_with_extensions_and_trailers(server: Callable[..., HostileServer]) -> None:
    def chunked(n: int) -> bytes:
        parts = [BODY[:1000], BODY[1000:1001], BODY[1001:]]
        coded = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts)
        return response_head(200, {"Transfer-Encoding": "chunked"}) + coded + b"0\r\nX-Trailer: 1\r\n\r\n"

    s = server(answering(chunked))
    results = fetch_many(s.url, 3)
    assert [r.body for r in results] == [BODY] * 3 and s.bytes_sent == 1  # the connection kept after each


def test_a_body_framed_by_the_end_of_the_connection(server: Callable[..., HostileServer]) -> None:
    s = server(answering(lambda n: b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + BODY, close_after=True))
    results = fetch_many(s.url, 2)
    assert [r.body for r in results] == [BODY] * 2 and s.bytes_sent == 2  # nothing to keep: a new one each time


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    b"SPDY 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n folded: header\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
])
def test_malformed_answers_are_connect_failures(server: Callable[..., HostileServer], answer: bytes) -> None:
    s = server(answering(lambda n: answer, close_after=True))
    (result,) = fetch_many(s.url, 1)
    assert result.failure is FailureReason.CONNECT and "RemoteProtocolError" in result.detail, result.detail


def test_a_failed_answer_leaves_no_connection_behind(server: Callable[..., HostileServer]) -> None:
    """A body cut short by the size cap: the connection is closed, the next collection opens a new one."""
    big = b"x" * (2 << 20)
    s = server(answering(lambda n: response_head(200, {"Content-Length": str(len(big))}) + big))
    results = fetch_many(s.url, 2)
    assert [r.failure for r in results] == [FailureReason.TOO_LARGE] * 2 and s.bytes_sent == 2


def test_an_answer_written_a_byte_at_a_time_is_read_whole(server: Callable[..., HostileServer]) -> None:
    """The head split anywhere (here between every byte, its CRLF CRLF too), the body in pieces: one answer."""
    answer = response_head(200, {"Content-Length": str(len(BODY)), "Content-Type": "text/plain"}) + BODY

    def make(s: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            s.bytes_sent += 1
            while True:
                s.requests.append(await read_request(reader))
                for i in range(len(answer)):
                    writer.write(answer[i:i + 1] if i < 200 else answer[i:])
                    await writer.drain()
                    if i >= 200:
                        break
                    await asyncio.sleep(0)
        return handle

    s = server(make)
    results = fetch_many(s.url, 2)
    assert [(r.body, r.content_type) for r in results] == [(BODY, "text/plain")] * 2 and s.bytes_sent == 1


def test_an_interim_answer_is_skipped(server: Callable[..., HostileServer]) -> None:
    s = server(answering(lambda n: b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
                         + response_head(200, {"Content-Length": str(len(BODY))}) + BODY))
    results = fetch_many(s.url, 2)
    assert [r.body for r in results] == [BODY] * 2 and s.bytes_sent == 1


def test_bytes_past_the_content_length_are_not_read_as_the_next_answer(server: Callable[..., HostileServer]) -> None:
    """The body is what Content-Length says; what follows it cannot start the next answer: a new connection."""
    s = server(answering(lambda n: response_head(200, {"Content-Length": str(len(BODY))}) + BODY + b"HTTP/1.1 garbage"))
    results = fetch_many(s.url, 2)
    assert [r.body for r in results] == [BODY] * 2 and s.bytes_sent == 2


def test_a_status_other_than_200_is_reported_and_its_connection_closed(server: Callable[..., HostileServer]) -> None:
    s = server(answering(lambda n: response_head(503, {"Content-Length": "4"}) + b"busy" if n == 1
                         else response_head(200, {"Content-Length": str(len(BODY))}) + BODY))
    first, second = fetch_many(s.url, 2)
    assert first.failure is FailureReason.HTTP_STATUS and "503" in first.detail
    assert second.body == BODY and s.bytes_sent == 2  # the unread body went with its connection


def test_an_encoding_it_cannot_decode_is_a_parse_failure(server: Callable[..., HostileServer]) -> None:
    s = server(answering(lambda n: response_head(200, {"Content-Length": "2", "Content-Encoding": "br"}) + b"xx"))
    (result,) = fetch_many(s.url, 1)
    assert result.failure is FailureReason.PARSE and "'br'" in result.detail, result.detail


def test_the_deadline_covers_the_whole_answer(server: Callable[..., HostileServer]) -> None:
    """A server that sends the head and then nothing: a timeout at the deadline, and the connection is not kept."""
    async def never_finishes(n: int) -> bytes:
        return response_head(200, {"Content-Length": "100"}) + b"half"

    s = server(answering(never_finishes))

    async def main() -> tuple[FetchResult, float]:
        async with new_client(TargetConfig("t", s.url)) as client:
            started = asyncio.get_running_loop().time()
            result = await fetch(client, s.url, 0.3, 1 << 20)
            return result, asyncio.get_running_loop().time() - started

    result, took = asyncio.run(main())
    assert result.failure is FailureReason.TIMEOUT and 0.25 <= took < 2.0, (result, took)


def test_a_collection_cancelled_mid_answer_closes_its_connection(server: Callable[..., HostileServer]) -> None:
    """Cancelled while waiting for the answer (the sidecar stopping, a reload): its connection is closed at once (the
    server sees it go), and the next fetch opens a new one instead of reading the rest of the old answer as its own."""

    def make(s: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            s.bytes_sent += 1
            s.requests.append(await read_request(reader))
            if s.bytes_sent == 1:  # the first connection never answers; it waits for the client to hang up
                if await reader.read(1) == b"":
                    s.requests.append([b"hung up"])
                return
            writer.write(response_head(200, {"Content-Length": str(len(BODY))}) + BODY)
            await writer.drain()
        return handle

    s = server(make)

    async def main() -> FetchResult:
        async with new_client(TargetConfig("t", s.url)) as client:
            task = asyncio.ensure_future(fetch(client, s.url, 3.0, 1 << 20))
            await asyncio.sleep(0.2)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.2)
            return await fetch(client, s.url, 3.0, 1 << 20)

    assert asyncio.run(main()).body == BODY and s.bytes_sent == 2
    assert [b"hung up"] in s.requests, "the cancelled fetch's connection was left open"
