"""Requests the tap cannot read, against a real uvicorn upstream (h11, as vLLM's API server runs without
httptools): the client gets uvicorn's own answer byte for byte, and its connection ends when a direct one would
(at once after a 400 with Connection: close, or at uvicorn's keep-alive timeout); no upstream connection is left
behind. The tap neither waits for a head it can never read nor reconnects under a connection the upstream ended."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specdecode_exporter.core.net.httpserver import bind_socket
from specdecode_exporter.tap import start_tap
from tests.tap.harness import LOOPS, Recorder, run, tap_settings

KEEP_ALIVE = 1  # uvicorn's timeout_keep_alive here (s): a kept-alive direct connection ends after this
READ_LIMIT = 5.0  # how long a client waits for the end of its connection before the test calls it a hang


async def _models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})


class Upstream:
    """uvicorn (h11) on its own thread, no Date header (so direct and tapped answers compare byte for byte)."""

    def __init__(self) -> None:
        app = Starlette(routes=[Route("/v1/models", _models, methods=["GET", "POST"])])
        self.sock = bind_socket()
        config = uvicorn.Config(app, http="h11", lifespan="off", log_config=None, access_log=False,
                                date_header=False, server_header=False, timeout_keep_alive=KEEP_ALIVE)
        self.server = uvicorn.Server(config)
        self.port = int(self.sock.getsockname()[1])
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def connections(self) -> int:
        """The connections uvicorn holds open now."""
        return len(self.server.server_state.connections)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    server.thread.start()
    deadline = time.monotonic() + 10
    while not server.server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.server.started
    try:
        yield server
    finally:
        server.server.should_exit = True
        server.thread.join(5)
        server.sock.close()


async def _talk(port: int, raw: bytes) -> tuple[bytes, float | None]:
    """Send ``raw`` and read until the connection ends: what came back, and after how long it ended (None: it
    did not end within READ_LIMIT)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(raw)
    received = b""
    ended: float | None = None
    try:
        async with asyncio.timeout(READ_LIMIT):
            while chunk := await reader.read(65536):
                received += chunk
            ended = time.monotonic() - started
    except TimeoutError:
        pass
    except ConnectionResetError:
        ended = time.monotonic() - started
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return received, ended


TLS_CLIENT_HELLO = bytes.fromhex("16030100f4010000f00303") + bytes(32) + b"\x00\x00\x02\x13\x01\x01\x00"

# The request the tap cannot read, and whether a direct connection to uvicorn ends at once (it answers 400 and
# closes) or is kept alive until uvicorn's keep-alive timeout.
CASES: dict[str, tuple[bytes, bool]] = {
    # Heads the tap's parser refuses (a tunnel from there on).
    "garbage": (b"GARBAGE\r\n\r\n", True),
    "obs_fold": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\r\n folded\r\n\r\n", False),
    "te_and_cl": (b"POST /v1/models HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
                  b"0\r\n\r\n", False),
    "two_lengths": (b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", True),
    "bad_chunk_size": (b"POST /v1/models HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", True),
    # Heads without CRLF CRLF, or with bare LF line ends the upstream reads and the tap does not.
    "bare_lf": (b"GET /v1/models HTTP/1.1\nHost: x\n\n", False),
    "mixed_line_ends": (b"POST /v1/models HTTP/1.1\nHost: x\nContent-Length: 2\r\n\r\n{}", False),
    "tls_client_hello": (TLS_CLIENT_HELLO, True),
    # A request the tap reads, answered with Connection: close while the client's next one is half sent.
    "close_then_half_a_head": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                               b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", True),
    "close_then_half_an_inspected_body": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"prompt\": ", True),
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("case", list(CASES))
def test_what_the_tap_cannot_read_ends_as_a_direct_connection_would(upstream: Upstream, loop: str,
                                                                     case: str) -> None:
    raw, closes_at_once = CASES[case]

    async def main() -> None:
        tap = await start_tap("127.0.0.1", 0, tap_settings(f"http://127.0.0.1:{upstream.port}"), Recorder())
        try:
            (direct, direct_end), (tapped, tapped_end) = await asyncio.gather(
                _talk(upstream.port, raw), _talk(tap.port, raw))
            # The premise: uvicorn answers each of these and ends the connection itself.
            assert direct and direct_end is not None
            assert direct_end < (0.5 if closes_at_once else KEEP_ALIVE + 0.5), direct_end
            assert tapped == direct
            assert tapped_end is not None, "the tap never closed the client connection"
            assert tapped_end < direct_end + 0.5, (tapped_end, direct_end)
            # Nothing is left open: not the client's link, not an upstream connection (no reconnect under the
            # upstream's close, which a moment later would show as a connection again).
            deadline = time.monotonic() + 1.0
            while (upstream.connections() or tap.stats().connections) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            assert (upstream.connections(), tap.stats().connections) == (0, 0)
        finally:
            await tap.close()

    run(loop, main)
