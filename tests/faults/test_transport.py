"""The collection's HTTP transport (pipeline/transport.py) against a real server on loopback: one connection kept
for every collection, each way a body may be framed, a connection the server closed while idle, broken answers."""

from __future__ import annotations

import asyncio
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
