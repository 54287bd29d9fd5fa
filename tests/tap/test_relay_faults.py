"""Failures and load: upstream down or dying, clients leaving, slow clients, many streams at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest

from specdecode_exporter.core.process.log import LOGGER_NAME
from specdecode_exporter.tap import start_tap
from specdecode_exporter.tap.relay import WRITE_HIGH_WATER
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
    tapped,
    unanswering_listener,
)

SECRET = "Bearer sk-not-to-be-logged-9f8e7d"
STREAM = {"model": "tiny", "prompt": "a", "stream": True}


@contextlib.contextmanager
def log_lines() -> Iterator[list[str]]:
    """Every tap log line, formatted as the sidecar formats them."""
    from specdecode_exporter.core.process.log import EventFormatter

    lines: list[str] = []
    formatter = EventFormatter(json_format=False)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(formatter.format(record))

    logger = logging.getLogger(LOGGER_NAME)
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("loop", LOOPS)
def test_upstream_down_gives_a_json_502_at_once(loop: str) -> None:
    raw = request_bytes("/v1/completions", STREAM, headers={"authorization": SECRET, "x-workload": "w"})

    async def main() -> None:
        recorder = Recorder()
        # A connect timeout far beyond the test's own limit: a refusal must be answered at once, not timed out.
        tap = await start_tap("127.0.0.1", 0, tap_settings(f"http://127.0.0.1:{_closed_port()}", connect_timeout=60.0),
                              recorder)
        response = await fetch(tap.port, raw)
        head, _, body = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and b"connection: close" in head
        assert body.count(b"\n") == 0
        assert json.loads(body) == {
            "error": {
                "message": "upstream unavailable: connection refused",
                "type": "BadGatewayError",
                "param": None,
                "code": 502,
            }
        }
        ((request, result),) = await recorder.wait(1)
        assert (result.status, result.reason, request.workload) == (502, "upstream_failed", "w")
        await tap.close()

    with log_lines() as lines:
        run(loop, main)
    assert any("request tap upstream unavailable" in line for line in lines)
    assert not any("sk-not-to-be-logged" in line or "authorization" in line.lower() for line in lines)


def test_upstream_not_answering_connects_gives_a_502_within_the_connect_timeout() -> None:
    async def main() -> None:
        # The kernel retries a dropped SYN for minutes: a 502 that names the connect timeout, within the test's
        # own limit, is the tap's timeout at work.
        tap = await start_tap("127.0.0.1", 0, tap_settings(f"http://127.0.0.1:{port}", connect_timeout=0.5), Recorder())
        response = await fetch(tap.port, request_bytes("/v1/completions", STREAM))
        assert response.startswith(b"HTTP/1.1 502 ") and b"connect timeout" in response
        await tap.close()

    with unanswering_listener() as port:
        run("uvloop", main)


@pytest.mark.parametrize("loop", LOOPS)
def test_client_disconnect_closes_the_upstream_at_once(loop: str) -> None:
    raw = request_bytes("/v1/completions", {**STREAM, "max_tokens": 400, "fake_interval": 0.01})

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            client = await Client.open(tap.port)
            await client.send(raw)
            await client.reader.readuntil(b"data: ")
            client.writer.transport.abort()
            exchange = fake.exchanges[-1]
            await exchange.disconnected.wait()
            assert exchange.events_sent < 400  # closed mid-stream, not at its end: vLLM would abort the request here
            ((_, result),) = await recorder.wait(1)
            assert (result.status, result.reason, result.metrics) == (200, "client_disconnected", None)

    run(loop, main)


@pytest.mark.parametrize("abort_after", [0, 3])
def test_upstream_dying(abort_after: int) -> None:
    raw = request_bytes("/v1/completions", {**STREAM, "max_tokens": 20, "fake_abort_after": abort_after})

    async def main() -> None:
        async with tapped() as (_, tap, recorder):
            client = await Client.open(tap.port)
            await client.send(raw)
            received = await asyncio.wait_for(client.reader.read(), 2.0)  # until the tap closes the connection
            if abort_after == 0:  # nothing was sent yet: a 502
                assert received.startswith(b"HTTP/1.1 502 ") and b"connection closed" in received
            else:
                assert received.startswith(b"HTTP/1.1 200 ") and received.count(b"data: ") == 3
            ((_, result),) = await recorder.wait(1)
            assert result.reason == "upstream_failed"
            await client.close()

    run("uvloop", main)


def test_upstream_closing_an_idle_connection_closes_the_client_connection() -> None:
    async def main() -> None:
        async with tapped() as (fake, tap, _):
            client = await Client.open(tap.port)
            await client.exchange(request_bytes("/v1/models", method="GET", headers={"connection": "close"}))
            assert await asyncio.wait_for(client.reader.read(), 1.0) == b""
            await client.close()
            assert fake.connections == 1

    run("uvloop", main)


def test_upstream_idle_close_is_mirrored_but_never_loses_a_request_being_read() -> None:
    """uvicorn closes connections idle for timeout_keep_alive. An idle client connection is closed with it, as it
    would be without the tap; a request whose body the tap is still reading (held back for inspection, so the
    upstream saw nothing) goes out on a new connection instead."""
    raw = request_bytes("/v1/completions", {**STREAM, "max_tokens": 2})

    async def main() -> None:
        # The upstream connections of the two clients close as idle, and no other: a request sent just as the
        # upstream closes its connection is HTTP/1.1's keep-alive race, not what this test is about.
        fake = await FakeVllm(max_idle_closes=2).start()
        recorder = Recorder()
        tap = await start_tap("127.0.0.1", 0, tap_settings(fake.url), recorder)
        direct = await fetch(fake.port, raw)  # its connection has no idle timer: the timeout is set only now
        fake.idle_timeout = 0.2
        idle = await Client.open(tap.port)
        slow = await Client.open(tap.port)
        await slow.send(raw[:-5])
        await fake.wait_idle_closes(2)
        assert await idle.reader.read() == b""  # closed with its idle upstream
        while fake.connections < 4:  # direct, idle's, slow's, and the new one the tap opened for slow's request
            await asyncio.sleep(0.01)
        await slow.send(raw[-5:])
        assert await slow.response() == direct
        ((request, result),) = await recorder.wait(1)
        assert request.usage_injected and result.metrics is not None
        for client in (idle, slow):
            await client.close()
        await tap.close()
        await fake.close()

    run("uvloop", main)


def _small_receive_buffer_socket(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


@pytest.mark.parametrize("loop", LOOPS)
def test_slow_client_bounded_memory_and_others_unaffected(loop: str) -> None:
    """A client that stops reading a 30 MB stream: the tap stops reading the upstream (which sees its writes
    paused), holds a bounded amount of it, and other streams go on at full pace."""
    flood = request_bytes("/v1/completions", {**STREAM, "max_tokens": 3000, "fake_pad": 10_000})
    paced = request_bytes("/v1/completions", {**STREAM, "max_tokens": 40, "fake_interval": 0.005})

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            expected = await fetch(fake.port, paced)
            slow = _small_receive_buffer_socket(tap.port)
            slow.send(flood)
            peak = 0
            flood_exchange = None
            while flood_exchange is None or not flood_exchange.paused:  # the flood fills every buffer, then stops
                await asyncio.sleep(0.02)
                peak = max(peak, tap.stats().buffered_bytes)
                flood_exchange = next((e for e in fake.exchanges if e.body and e.body.get("fake_pad")), None)
            assert flood_exchange.events_sent < 3000

            # The slow client never reads: streams stuck behind it would never end (the test's limit would cut it).
            fast = await asyncio.gather(*(fetch(tap.port, paced) for _ in range(8)))
            assert all(dechunk(r) == dechunk(expected) for r in fast)
            for _ in range(10):
                await asyncio.sleep(0.01)
                peak = max(peak, tap.stats().buffered_bytes)
            # Per-stream memory is bounded: the client transport's high-water mark, plus the one socket read (up to
            # 256 KiB on both loops) that took it over the mark, plus events held back.
            assert peak <= WRITE_HIGH_WATER + 256 * 1024 + 16 * 1024
            assert len(recorder.seen) == 8  # the slow stream has not ended
            slow.close()
            ((_, result),) = (r for r in await recorder.wait(9) if r[1].reason == "client_disconnected")
            assert result.status == 200

    run(loop, main, timeout=60)  # a limit against a hang, not a measure of speed


@pytest.mark.parametrize("loop", LOOPS)
def test_concurrent_streams(loop: str) -> None:
    bodies = [{**STREAM, "max_tokens": 5 + i % 7, "fake_interval": 0.002} for i in range(64)]
    for i, body in enumerate(bodies):
        if i % 3 == 0:
            body["stream_options"] = {"include_usage": True}

    async def main() -> None:
        async with tapped() as (fake, tap, recorder):
            raws = [request_bytes("/v1/completions", body) for body in bodies]
            direct = await asyncio.gather(*(fetch(fake.port, raw) for raw in raws))
            through = await asyncio.gather(*(fetch(tap.port, raw) for raw in raws))
            assert through == direct
            seen = await recorder.wait(64)
            assert all(result.metrics is not None for _, result in seen)
            assert sum(request.usage_injected for request, _ in seen) == 64 - 22

    run(loop, main, timeout=20)


@pytest.mark.parametrize("loop", LOOPS)
def test_close_with_grace_lets_requests_in_flight_finish(loop: str) -> None:
    """A shutdown (a pod rollout): no new connections, idle ones closed at once, a stream in flight completes
    and is recorded; only then is the tap gone."""

    async def main() -> None:
        fake = await FakeVllm().start()
        recorder = Recorder()
        tap = await start_tap("127.0.0.1", 0, tap_settings(fake.url), recorder)
        raw = request_bytes("/v1/completions", {**STREAM, "max_tokens": 40, "fake_interval": 0.01})
        streaming, idle = await Client.open(tap.port), await Client.open(tap.port)
        await idle.exchange(request_bytes("/v1/models", method="GET"))
        await streaming.send(raw)
        await streaming.reader.readuntil(b"data: ")
        exchange = fake.exchanges[-1]
        # A grace far beyond the test's own limit: the tap must close when the stream ends, not at the deadline.
        closing = asyncio.create_task(tap.close(grace=600.0))
        assert await idle.reader.read() == b"", "an idle connection is closed at once"
        with pytest.raises(OSError):
            await Client.open(tap.port)
        assert not closing.done() or exchange.events_sent == 40, "closed before the stream in flight ended"
        rest = await streaming.reader.read()  # to the end, then the tap closes it
        assert rest.count(b"data: {") > 20 and rest.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        await closing
        assert len(await recorder.wait(1)) == 1 and recorder.seen[0][1].metrics is not None
        await fake.close()

    run(loop, main)


@pytest.mark.parametrize("grace", [0.0, 0.3])
def test_close_cuts_what_outlasts_the_grace(grace: float) -> None:
    """A stream longer than the grace (none by default) is cut when it ends; nothing is accepted any more."""

    async def main() -> None:
        fake = await FakeVllm().start()
        tap = await start_tap("127.0.0.1", 0, tap_settings(fake.url), Recorder())
        client = await Client.open(tap.port)
        await client.send(request_bytes("/v1/completions", {**STREAM, "max_tokens": 500, "fake_interval": 0.01}))
        await client.reader.readuntil(b"data: ")
        started = time.monotonic()
        with log_lines() as lines:
            await tap.close(grace=grace)
        assert grace <= time.monotonic() - started  # the grace is kept in real time, never cut short
        with contextlib.suppress(ConnectionError):  # cut: the 5 s stream never ends properly
            assert not (await client.reader.read()).endswith(b"0\r\n\r\n")
        while tap.stats().connections:
            await asyncio.sleep(0.01)
        assert any("request tap stopped" in line and "cut=1" in line for line in lines), lines
        with pytest.raises(OSError):
            await Client.open(tap.port)
        await fake.close()

    run("uvloop", main)


def test_bad_upstream_urls() -> None:
    async def main() -> None:
        for url in (
            "https://127.0.0.1:8000",
            "http://user:pw@127.0.0.1:8000",
            "http://127.0.0.1:8000/v1",
            "127.0.0.1:8000",
        ):
            with pytest.raises(ValueError) as error:
                await start_tap("127.0.0.1", 0, tap_settings(url), Recorder())
            assert "pw" not in str(error.value)

    run("asyncio", main)
