"""Test plumbing for the tap: event loops, a raw HTTP/1.1 client that keeps every byte, a recording observer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvloop

from specdecode_exporter.tap import Tap, TapRequest, TapResult, start_tap
from specdecode_exporter.tap.relay import DEFAULT_MAX_INSPECT_BODY
from specdecode_exporter.tap.settings import RouteSettings, TapSettings
from tests.tap.fake_vllm import FakeVllm

LOOPS = ["asyncio", "uvloop"]


def run(loop: str, main: Callable[[], Awaitable[None]], timeout: float = 10.0) -> None:
    """Run ``main`` on a fresh default or uvloop event loop, with a hard time limit."""
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(asyncio.wait_for(main(), timeout))


@dataclass
class Recorder:
    seen: list[tuple[TapRequest, TapResult]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def observe(self, request: TapRequest, result: TapResult) -> None:
        self.seen.append((request, result))
        self.arrived.set()

    async def wait(self, count: int, timeout: float = 3.0) -> list[tuple[TapRequest, TapResult]]:
        async with asyncio.timeout(timeout):
            while len(self.seen) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.seen


def tap_settings(upstream: str = "http://127.0.0.1:1", fallback: str | None = None, **changes: Any) -> TapSettings:
    """The tap's settings as the sidecar hands them to its process: relaying to ``upstream`` (routing to
    ``fallback``), the declared defaults but for ``changes``."""
    return TapSettings(listen_address="127.0.0.1:0", upstream=upstream, target="vllm",
                       route=RouteSettings(fallback) if fallback else None, **changes)


@contextlib.asynccontextmanager
async def tapped(max_inspect_body: int = DEFAULT_MAX_INSPECT_BODY, **settings: Any
                 ) -> AsyncIterator[tuple[FakeVllm, Tap, Recorder]]:
    """A tap in front of a fake vLLM; ``settings``: tap settings other than the defaults."""
    fake = await FakeVllm().start()
    recorder = Recorder()
    tap = await start_tap("127.0.0.1", 0, tap_settings(fake.url, **settings), recorder,
                          max_inspect_body=max_inspect_body)
    try:
        yield fake, tap, recorder
    finally:
        await tap.close()
        await fake.close()


@contextlib.contextmanager
def unanswering_listener() -> Iterator[int]:
    """The port of a listener whose accept queue is full: the kernel drops further SYNs, so connects to it hang
    (and the kernel retries them for minutes) — an upstream that does not answer connects."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            fillers.append(filler)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(listener.getsockname())
        yield int(listener.getsockname()[1])
    finally:
        for sock in (*fillers, listener):
            sock.close()


def request_bytes(
    path: str,
    body: dict[str, Any] | bytes | None = None,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", "user-agent: tap-test"]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


class Client:
    """One client connection that returns each response exactly as received (head and framed body)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, raw: bytes) -> None:
        self.writer.write(raw)
        await self.writer.drain()

    async def response(self, head_request: bool = False) -> bytes:
        """One response; interim 1xx heads are included in what is returned."""
        out = b""
        while True:
            head = await self.reader.readuntil(b"\r\n\r\n")
            out += head
            status = int(head.split(b" ", 2)[1])
            if not 100 <= status < 200:
                break
        lines = head.split(b"\r\n")[1:]
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines)}
        if head_request or status in (204, 304):
            return out
        if fields.get(b"transfer-encoding") == b"chunked":
            while True:
                size_line = await self.reader.readuntil(b"\r\n")
                out += size_line
                size = int(size_line.strip(), 16)
                out += await self.reader.readexactly(size + 2)
                if size == 0:
                    return out
        if b"content-length" in fields:
            return out + await self.reader.readexactly(int(fields[b"content-length"]))
        return out + await self.reader.read()

    async def exchange(self, raw: bytes) -> bytes:
        await self.send(raw)
        return await self.response(head_request=raw.startswith(b"HEAD "))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def fetch(port: int, raw: bytes) -> bytes:
    client = await Client.open(port)
    try:
        return await client.exchange(raw)
    finally:
        await client.close()


def dechunk(response: bytes) -> bytes:
    """The body of a chunked response."""
    _, _, rest = response.partition(b"\r\n\r\n")
    body, pos = b"", 0
    while True:
        eol = rest.index(b"\r\n", pos)
        size = int(rest[pos:eol], 16)
        if size == 0:
            return body
        body += rest[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


def chunks(response: bytes) -> list[bytes]:
    """The payload of every chunk of a chunked response, in order."""
    _, _, rest = response.partition(b"\r\n\r\n")
    out: list[bytes] = []
    pos = 0
    while True:
        eol = rest.index(b"\r\n", pos)
        size = int(rest[pos:eol], 16)
        if size == 0:
            return out
        out.append(rest[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2
