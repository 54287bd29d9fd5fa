"""A hostile 'vLLM': a raw asyncio TCP server on 127.0.0.1 (port 0) on its own thread, one behaviour per test.

It speaks just enough HTTP/1.1 to be dangerous: it can refuse to answer, dribble bytes, close mid-body,
stream a body of any length that it generates on the fly (never held in memory), or send a gzip bomb.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def read_request(reader: asyncio.StreamReader) -> list[bytes]:
    """The request head's lines (request line first)."""
    head = await reader.readuntil(b"\r\n\r\n")
    return head.split(b"\r\n")[:-2]


def response_head(status: int = 200, headers: dict[str, str] | None = None, reason: str = "X") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class HostileServer:
    handler: Handler
    host: str = "127.0.0.1"
    ssl: Any = None  # an ssl.SSLContext to speak HTTPS
    requests: list[list[bytes]] = field(default_factory=list)
    bytes_sent: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.Server | None = None
    _thread: threading.Thread | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://{self.host}:{self.port}/metrics"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError, OSError):
            pass  # the client hung up on us: expected for most behaviours here
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def start(self) -> HostileServer:
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, self.host, 0, ssl=self.ssl))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            self._server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.sleep(0.05))
            loop.close()

        self._thread = threading.Thread(target=run, name="hostile-vllm", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("hostile server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def serve(server_behaviour: Callable[[HostileServer], Handler], ssl: Any = None) -> HostileServer:
    """``serve(lambda s: handler)`` where the handler may update ``s.bytes_sent`` / ``s.requests``."""
    server = HostileServer(handler=lambda r, w: asyncio.sleep(0), ssl=ssl)
    server.handler = server_behaviour(server)
    return server.start()


# ---------- behaviours ----------

def fixed(status: int, body: bytes, headers: dict[str, str] | None = None) -> Callable[[HostileServer], Handler]:
    def make(server: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            server.requests.append(await read_request(reader))
            all_headers = {"Content-Length": str(len(body)), "Content-Type": "text/plain; version=0.0.4"}
            all_headers.update(headers or {})
            writer.write(response_head(status, all_headers) + body)
            await writer.drain()
        return handle
    return make


def streamed(chunks: Callable[[], AsyncIterator[bytes]], headers: dict[str, str] | None = None,
             length: int | None = None) -> Callable[[HostileServer], Handler]:
    """Chunked (or with a Content-Length) body generated on the fly; counts what was actually sent."""
    def make(server: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            server.requests.append(await read_request(reader))
            h = {"Content-Type": "text/plain; version=0.0.4", **(headers or {})}
            h.update({"Content-Length": str(length)} if length is not None else {"Transfer-Encoding": "chunked"})
            writer.write(response_head(200, h))
            async for chunk in chunks():
                data = chunk if length is not None else b"%x\r\n%s\r\n" % (len(chunk), chunk)
                writer.write(data)
                server.bytes_sent += len(chunk)
                await writer.drain()
            if length is None:
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        return handle
    return make


def silent(close_after: float = 60.0) -> Callable[[HostileServer], Handler]:
    """Accepts the connection, reads the request, never answers."""
    def make(server: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            server.requests.append(await read_request(reader))
            await asyncio.sleep(close_after)
        return handle
    return make


def gzip_bomb_chunks(decoded_size: int, chunk: int = 1 << 20) -> Callable[[], AsyncIterator[bytes]]:
    """A valid gzip stream that inflates to ``decoded_size`` bytes of an exposition-looking line.

    One block is deflated once with a full flush (which resets the history), so the compressed unit can be
    repeated as is; only the CRC is computed over the whole decoded size. 1 GiB costs ~3 MB on the wire and
    well under a second to build, and nothing near the decoded size is ever in memory."""
    line = b"vllm:spec_decode_num_drafts_total 1\n"
    block = line * (chunk // len(line))
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    unit = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = max(1, decoded_size // len(block))
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    tail = zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)
    tail += struct.pack("<II", crc, (count * len(block)) & 0xFFFFFFFF)
    head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"

    async def gen() -> AsyncIterator[bytes]:
        yield head
        for _ in range(count):
            yield unit
        yield tail
    return gen


def scripted(body: Callable[[], bytes], headers: dict[str, str] | None = None) -> Callable[[HostileServer], Handler]:
    """A well-behaved server whose body the test changes between collections (``body()`` per request)."""
    def make(server: HostileServer) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:  # keep-alive: the sidecar reuses its connection
                server.requests.append(await read_request(reader))
                data = body()
                all_headers = {"Content-Length": str(len(data)), "Content-Type": "text/plain; version=0.0.4"}
                all_headers.update(headers or {})
                writer.write(response_head(200, all_headers) + data)
                await writer.drain()
        return handle
    return make


def v1_body(draft_tokens: float, accepted: float, drafts: float | None = None, created: float | None = None,
            model: str = "m", engine: str = "0", extra: str = "") -> bytes:
    """A minimal vLLM V1 exposition for one (model, engine) series."""
    drafts = draft_tokens / 3 if drafts is None else drafts
    labels = f'engine="{engine}",model_name="{model}"'
    lines = []
    for name, value in (("drafts", drafts), ("draft_tokens", draft_tokens), ("accepted_tokens", accepted)):
        lines.append(f"# TYPE vllm:spec_decode_num_{name}_total counter")
        lines.append(f"vllm:spec_decode_num_{name}_total{{{labels}}} {value}")
        if created is not None:
            lines.append(f"vllm:spec_decode_num_{name}_created{{{labels}}} {created}")
    return ("\n".join(lines) + "\n" + extra).encode()
