"""The collection's HTTP side (pipeline/scrape.py's fetch over the client sidecar/collection.py's new_client builds
for a target) against real servers on loopback: what a collection gets back from each kind of answer, and how many
connections it opens for it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import ssl
import threading
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specdecode_exporter.pipeline.scrape import FailureReason, FetchResult, fetch
from specdecode_exporter.sidecar.collection import Exporter, new_client
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, TLSConfig, parse_windows
from tests.faults.certs import Certs
from tests.faults.hostile import (
    Handler,
    HostileServer,
    closed_port,
    gzip_bomb_chunks,
    read_request,
    response_head,
    serve,
    streamed,
    v1_body,
)

BODY = b"vllm:spec_decode_num_drafts_total 10\n" * 200
MiB = 1 << 20


@dataclass
class Counted:
    """A server's connections (each one's requests) as it saw them."""

    connections: list[list[list[bytes]]] = field(default_factory=list)

    @property
    def requests(self) -> list[list[bytes]]:
        return [request for connection in self.connections for request in connection]


Answer = Callable[[int], Awaitable[bytes] | bytes]  # the n-th request over all connections (1-based) -> its answer


@pytest.fixture
def server() -> Iterator[Callable[..., tuple[HostileServer, Counted]]]:
    servers: list[HostileServer] = []

    def start(answer: Answer, close_after: bool = False, tls: ssl.SSLContext | None = None,
              unanswered: int | None = None) -> tuple[HostileServer, Counted]:
        """Answers every request with ``answer(n)``; with ``close_after``, closes each connection after one answer
        (without saying Connection: close); with ``unanswered``, closes each connection when that request of its
        own (1-based) comes, unanswered."""
        seen = Counted()

        def make(_: HostileServer) -> Handler:
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                requests: list[list[bytes]] = []
                seen.connections.append(requests)
                while True:
                    requests.append(await read_request(reader))
                    if len(requests) == unanswered:
                        return
                    data = answer(len(seen.requests))
                    writer.write(data if isinstance(data, bytes) else await data)
                    await writer.drain()
                    if close_after:
                        return
            return handle

        servers.append(serve(make, ssl=tls))
        return servers[-1], seen

    yield start
    for s in servers:
        s.stop()


def ok(body: bytes = BODY, headers: dict[str, str] | None = None) -> bytes:
    head = {"Content-Length": str(len(body)), "Content-Type": "text/plain", **(headers or {})}
    return response_head(200, head) + body


def fetch_many(url: str, count: int, max_bytes: int = MiB, timeout: float = 3.0, gap: float = 0.02,
               target: TargetConfig | None = None) -> list[FetchResult]:
    """``count`` fetches over one target's client, ``gap`` seconds apart (as between collections)."""
    async def main() -> list[FetchResult]:
        async with new_client(target or TargetConfig("t", url)) as client:
            results = []
            for i in range(count):
                if i:
                    await asyncio.sleep(gap)
                results.append(await fetch(client, url, timeout, max_bytes,
                                           sni_hostname=target.tls.server_name if target and target.tls else None))
            return results
    return asyncio.run(main())


# ---------- what a collection gets ----------

def test_consecutive_collections_reuse_one_connection_across_an_idle_interval(server: Callable[..., tuple[
        HostileServer, Counted]]) -> None:
    """Idle longer than httpx's default keep-alive expiry (5 s, the default collection interval): the connection is
    still used for the next collection. Breaks when the client drops its idle connection before the next tick."""
    s, seen = server(lambda n: ok())
    results = fetch_many(s.url, 2, gap=5.5)
    assert [r.body for r in results] == [BODY] * 2
    assert [len(requests) for requests in seen.connections] == [2]


def test_requests_say_what_the_collection_accepts(server: Callable[..., tuple[HostileServer, Counted]]) -> None:
    s, seen = server(lambda n: ok())
    (result,) = fetch_many(s.url, 1)
    assert result.body == BODY and result.content_type == "text/plain"
    request = [line.lower() for line in seen.requests[0]]
    assert request[0] == b"get /metrics http/1.1"
    assert b"accept-encoding: gzip" in request  # gzip only: a br or zstd answer could not be decoded under the cap
    assert any(line.startswith(b"accept: application/openmetrics-text;version=1.0.0") for line in request)
    assert b"user-agent: specdecode-exporter" in request


def test_the_environment_sets_no_proxy_and_no_credentials(server: Callable[..., tuple[HostileServer, Counted]],
                                                          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A proxy or a .netrc meant for other programs on the host: the collection neither goes through the proxy (here
    a closed port: every collection would fail with connect) nor sends the .netrc's credentials."""
    s, seen = server(lambda n: ok())
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret-from-netrc\n")
    netrc.chmod(0o600)
    proxy = f"http://127.0.0.1:{closed_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(netrc))
    results = fetch_many(s.url, 2)
    assert [r.failure for r in results] == [None, None], [r.detail for r in results]
    assert all(not line.lower().startswith(b"authorization") for request in seen.requests for line in request)


def test_a_gzip_body_is_decoded(server: Callable[..., tuple[HostileServer, Counted]]) -> None:
    s, _ = server(lambda n: ok(gzip.compress(BODY), {"Content-Encoding": "gzip"}))
    (result,) = fetch_many(s.url, 1)
    assert result.body == BODY


def test_a_gzip_bomb_stops_at_the_cap_and_inflating_it_stays_bounded(
        server: Callable[..., tuple[HostileServer, Counted]]) -> None:
    """64 MiB once inflated, 195 KiB sent in one write, so a raw read of the client may hold ~20 MiB of it: too_large,
    and no more than a step of it is ever inflated at once (the 1 GiB bomb over a trickle:
    tests/faults/test_vllm_faults.py)."""
    async def gather(chunks: AsyncIterator[bytes]) -> bytes:
        return b"".join([chunk async for chunk in chunks])

    bomb = asyncio.run(gather(gzip_bomb_chunks(64 * MiB)()))
    s, _ = server(lambda n: ok(bomb, {"Content-Encoding": "gzip"}))
    tracemalloc.start()
    try:
        (result,) = fetch_many(s.url, 1, max_bytes=4 * MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.failure is FailureReason.TOO_LARGE and result.detail == f"body larger than {4 * MiB} bytes"
    assert peak < 3 * 4 * MiB, f"peak {peak / MiB:.1f} MiB for a 4 MiB cap"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_over_the_cap_is_too_large_and_its_connection_not_kept(
        server: Callable[..., tuple[HostileServer, Counted]], framing: str) -> None:
    big = b"x" * (2 * MiB)

    def answer(n: int) -> bytes:
        if framing == "chunked":
            return response_head(200, {"Transfer-Encoding": "chunked"}) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big)
        return ok(big)

    s, seen = server(answer)
    results = fetch_many(s.url, 2)
    assert [r.failure for r in results] == [FailureReason.TOO_LARGE] * 2
    assert len(seen.connections) == 2  # the rest of the first body was never read: its connection went with it


def test_a_body_at_the_cap_is_read_whole(server: Callable[..., tuple[HostileServer, Counted]]) -> None:
    s, _ = server(lambda n: ok())
    assert fetch_many(s.url, 1, max_bytes=len(BODY))[0].body == BODY
    assert fetch_many(s.url, 1, max_bytes=len(BODY) - 1)[0].failure is FailureReason.TOO_LARGE


def test_chunked_bodies_with_extensions_and_trailers(server: Callable[..., tuple[HostileServer, Counted]]) -> None:
    def chunked(n: int) -> bytes:
        parts = [BODY[:1000], BODY[1000:1001], BODY[1001:]]
        coded = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts)
        return response_head(200, {"Transfer-Encoding": "chunked"}) + coded + b"0\r\nX-Trailer: 1\r\n\r\n"

    s, seen = server(chunked)
    results = fetch_many(s.url, 3)
    assert [r.body for r in results] == [BODY] * 3 and len(seen.connections) == 1


def test_a_body_framed_by_the_end_of_the_connection(server: Callable[..., tuple[HostileServer, Counted]]) -> None:
    s, seen = server(lambda n: b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + BODY, close_after=True)
    results = fetch_many(s.url, 2)
    assert [r.body for r in results] == [BODY] * 2 and len(seen.connections) == 2


def test_an_answer_written_a_byte_at_a_time_is_read_whole() -> None:
    answer = ok()

    def make(s: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            s.requests.append(await read_request(reader))
            for i in range(200):  # the head between every byte, its CRLF CRLF too; then the rest at once
                writer.write(answer[i:i + 1])
                await writer.drain()
                await asyncio.sleep(0)
            writer.write(answer[200:])
            await writer.drain()
        return handle

    s = serve(make)
    try:
        (result,) = fetch_many(s.url, 1)
    finally:
        s.stop()
    assert (result.body, result.content_type) == (BODY, "text/plain")


# ---------- failures, by reason ----------

def test_a_refused_connection_is_connect() -> None:
    url = f"http://127.0.0.1:{closed_port()}/metrics"
    (result,) = fetch_many(url, 1)
    assert result.failure is FailureReason.CONNECT and result.detail.startswith("ConnectError"), result.detail


def test_a_server_that_sends_the_head_and_stalls_is_timeout(server: Callable[..., tuple[HostileServer, Counted]]
                                                            ) -> None:
    async def never_finishes(n: int) -> bytes:
        return response_head(200, {"Content-Length": "100"}) + b"half"

    s, _ = server(never_finishes)
    (result,) = fetch_many(s.url, 1, timeout=0.3)
    assert result.failure is FailureReason.TIMEOUT and result.detail == "no complete answer within 0.3s"


def test_a_body_dribbled_faster_than_each_read_times_out_still_meets_the_one_deadline() -> None:
    """Every piece comes well within the timeout of its read, the whole answer does not: the deadline covers the
    whole answer (httpx's own timeouts are per read)."""
    async def dribble() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"x" * 10
            await asyncio.sleep(0.05)

    s = serve(streamed(dribble, length=400))
    try:
        (result,) = fetch_many(s.url, 1, timeout=0.5)
    finally:
        s.stop()
    assert result.failure is FailureReason.TIMEOUT


@pytest.mark.parametrize(("status", "extra", "detail"), [
    (503, {}, "HTTP 503"),
    (404, {}, "HTTP 404"),
    (302, {"Location": "http://169.254.169.254/"}, "HTTP 302 (redirect to http://169.254.169.254/ not followed)"),
])
def test_another_status_is_http_status_and_its_connection_not_kept(
        server: Callable[..., tuple[HostileServer, Counted]], status: int, extra: dict[str, str], detail: str) -> None:
    s, seen = server(lambda n: response_head(status, {"Content-Length": "4", **extra}) + b"busy" if n == 1 else ok())
    first, second = fetch_many(s.url, 2)
    assert (first.failure, first.detail) == (FailureReason.HTTP_STATUS, detail)
    assert second.body == BODY and len(seen.connections) == 2  # the unread body went with its connection
    assert len(seen.requests) == 2  # the redirect was not followed


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    b"SPDY 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_malformed_answers_are_connect_failures(server: Callable[..., tuple[HostileServer, Counted]],
                                                answer: bytes) -> None:
    s, _ = server(lambda n: answer, close_after=True)
    (result,) = fetch_many(s.url, 1)
    assert result.failure is FailureReason.CONNECT and "RemoteProtocolError" in result.detail, result.detail


def test_an_encoding_it_cannot_decode_is_a_parse_failure(server: Callable[..., tuple[HostileServer, Counted]]
                                                         ) -> None:
    s, _ = server(lambda n: ok(b"xx", {"Content-Encoding": "br"}))
    (result,) = fetch_many(s.url, 1)
    assert (result.failure, result.detail) == (FailureReason.PARSE, "unsupported Content-Encoding 'br'")


# ---------- the kept connection ----------

def test_a_connection_the_server_closed_while_idle_is_replaced(server: Callable[..., tuple[HostileServer, Counted]]
                                                               ) -> None:
    s, seen = server(lambda n: ok(), close_after=True)
    results = fetch_many(s.url, 3)
    assert [r.body for r in results] == [BODY] * 3 and len(seen.connections) == 3


def test_a_kept_connection_closed_as_the_next_request_goes_out_is_asked_again_on_a_new_one(
        server: Callable[..., tuple[HostileServer, Counted]]) -> None:
    """The server (uvicorn closes a connection idle for 5 s, the default interval) reads the next request on the
    kept connection and closes it unanswered: the collection asks once more on a new connection, and succeeds."""
    s, seen = server(lambda n: ok(), unanswered=2)
    results = fetch_many(s.url, 3)
    assert [r.body for r in results] == [BODY] * 3, [r.detail for r in results]
    assert [len(requests) for requests in seen.connections] == [2, 2, 1]


def test_a_collection_cancelled_mid_answer_closes_its_connection() -> None:
    """Cancelled while waiting for the answer (the sidecar stopping, a reload): its connection is closed at once (the
    server sees it go), and the next fetch opens a new one instead of reading the rest of the old answer as its own."""
    hung_up = asyncio.Event()
    connections: list[int] = []

    def make(_: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(1)
            await read_request(reader)
            if len(connections) == 1:  # the first connection never answers; it waits for the client to hang up
                if await reader.read(1) == b"":
                    hung_up.set()
                return
            writer.write(ok())
            await writer.drain()
        return handle

    s = serve(make)

    async def main() -> FetchResult:
        async with new_client(TargetConfig("t", s.url)) as client:
            task = asyncio.ensure_future(fetch(client, s.url, 3.0, MiB))
            await asyncio.sleep(0.2)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.2)
            return await fetch(client, s.url, 3.0, MiB)

    try:
        assert asyncio.run(main()).body == BODY and len(connections) == 2
    finally:
        s.stop()
    assert hung_up.is_set(), "the cancelled fetch's connection was left open"


# ---------- TLS ----------

def test_tls_collections_verify_the_server_and_share_one_connection(
        server: Callable[..., tuple[HostileServer, Counted]], certs: Certs) -> None:
    """The target's CA and server name verify the server; the TLS connection (one handshake) serves every
    collection. A wrong CA or name is connect."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    s, seen = server(lambda n: ok(), tls=context)
    url = s.url.replace("127.0.0.1", "localhost")
    named = TargetConfig("t", url, tls=TLSConfig(ca_file=str(certs.ca), server_name="vllm.internal"))
    assert [r.body for r in fetch_many(url, 3, target=named)] == [BODY] * 3
    assert [len(requests) for requests in seen.connections] == [3]
    for wrong in (TLSConfig(ca_file=str(certs.other_ca)), TLSConfig(ca_file=str(certs.ca), server_name="x.example")):
        (failed,) = fetch_many(url, 1, target=TargetConfig("t", url, tls=wrong))
        assert failed.failure is FailureReason.CONNECT and "CERTIFICATE_VERIFY_FAILED" in failed.detail, failed.detail


def test_a_plain_http_client_cannot_reach_an_https_server_unverified(
        server: Callable[..., tuple[HostileServer, Counted]], certs: Certs) -> None:
    """A plain-http target's client carries a context that trusts no CA: pointed at https it verifies and fails."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    s, _ = server(lambda n: ok(), tls=context)

    async def main() -> FetchResult:
        async with new_client(TargetConfig("t", s.url.replace("https:", "http:"))) as client:
            return await fetch(client, s.url, 3.0, MiB)

    result = asyncio.run(main())
    assert result.failure is FailureReason.CONNECT and "CERTIFICATE_VERIFY_FAILED" in result.detail, result.detail


# ---------- the clients' lifetime ----------

def test_a_reload_that_removes_a_target_and_a_stop_close_their_connections() -> None:
    """A target removed by a reload hangs up on its server at once, and so does every target when the sidecar stops:
    the connections kept between collections do not outlive their collection loops."""
    hung_up = {name: threading.Event() for name in ("removed", "kept")}

    def counting(name: str) -> Callable[[HostileServer], Handler]:
        def make(s: HostileServer) -> Handler:
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                try:
                    while True:
                        s.requests.append(await read_request(reader))
                        writer.write(ok(v1_body(30 * len(s.requests), 20 * len(s.requests))))
                        await writer.drain()
                except asyncio.IncompleteReadError:
                    hung_up[name].set()
            return handle
        return make

    servers = {name: serve(counting(name)) for name in hung_up}
    targets = tuple(TargetConfig(name, s.url) for name, s in servers.items())
    config = Config(targets=targets, windows=parse_windows("1m", "windows"), collect=CollectSection(interval=0.2))
    exporter = Exporter(config)

    async def main() -> None:
        running = asyncio.create_task(exporter.run())
        try:
            while not all(len(s.requests) >= 2 for s in servers.values()):  # a kept connection each, in use
                await asyncio.sleep(0.02)
            exporter.apply_config(dataclasses.replace(config, targets=targets[1:]))
            await asyncio.to_thread(hung_up["removed"].wait, 10)
            assert not hung_up["kept"].is_set()  # its connection stays, kept between its collections
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        await asyncio.to_thread(hung_up["kept"].wait, 10)

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        for s in servers.values():
            s.stop()
    assert hung_up["removed"].is_set(), "the removed target's connection was left open"
    assert hung_up["kept"].is_set(), "the stopped sidecar left its connection open"
