"""The collection's HTTP client: HTTP/1.1 GETs over keep-alive connections, one asyncio Protocol per connection.

httpx cost the sidecar ~1 ms of CPU per collection of a real vLLM page (51 KiB), twice what collecting and deriving
the page took: the client built and merged the request, ran its auth, cookie and redirect flows; its transport
(httpcore) guarded a connection pool with anyio locks and events, ran the h11 state machine, and tried a failed
``import sniffio`` four times a request (a sys.path search each: a failed import is not remembered). It also made
up 2-4 MB of the process's memory. A first lean client on asyncio's streams still cost 0.37 ms per fetch after an
idle second (the StreamReader's buffer and waiters, an async generator and a context manager per request, an
asyncio.timeout): a Protocol that reads the answer as the loop delivers it, and wakes the collection once when it is
complete, costs 0.17 ms. The sidecar asks each target for one page at a time over the target's own client, so this
keeps only what that needs: the request's bytes built once, a connection reused from one collection to the next
(TLS included), the response head parsed once, and the body decoded (gunzipped, capped: a gzip bomb stops at the
cap) as the socket delivers it, framed by Content-Length, the chunked coding or the end of the connection. No
redirects are followed, no proxy is used, credentials come in the headers fetch passes.

``get`` has one deadline for the whole exchange (the connect included). A connection is reused only after its
answer was read to the end; one that the server closed while it was idle is replaced, and a request that finds it
closed before any byte of an answer is sent once more on a new one. The errors are named after httpx's (fetch
reports the name), without importing it.
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from specdecode_exporter.core.chunked import ChunkedDecoder

HEAD_LIMIT = 64 * 1024  # a response head larger than this is refused (uvicorn's h11 refuses 16 KiB requests)
REQUESTS_KEPT = 4  # requests built once and sent again (the page's, the model list's)
MAX_IDLE = 2  # connections kept per client
_INFLATE_STEP = 256 * 1024  # the most one decompress call inflates, whatever the compression ratio
ConnectionKey = tuple[str, str, int, str | None]  # scheme, host, port, TLS server name


class TransportError(Exception):
    """A request that got no usable answer."""


class ConnectError(TransportError):
    pass


class RemoteProtocolError(TransportError):
    pass


class ReadError(TransportError):
    pass


class BodyTooLarge(Exception):
    """The decoded body passed the cap."""


class UnsupportedEncoding(ValueError):
    """A Content-Encoding the client cannot decode."""


class BoundedDecoder:
    """Collects a response body, gunzipping if needed, and stops once the decoded size passes the cap."""

    def __init__(self, content_encoding: str, max_bytes: int) -> None:
        encoding = content_encoding.strip().lower()
        if encoding in ("", "identity"):
            self._inflater = None
        elif encoding in ("gzip", "x-gzip", "deflate"):
            self._inflater = zlib.decompressobj(47 if encoding != "deflate" else zlib.MAX_WBITS)
        else:
            raise UnsupportedEncoding(f"unsupported Content-Encoding {content_encoding!r}")
        self._max = max_bytes
        self._parts: list[bytes] = []
        self._size = 0

    def _add(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._max:
            raise BodyTooLarge
        self._parts.append(data)

    def feed(self, chunk: bytes) -> None:
        if self._inflater is None:
            self._add(chunk)
            return
        data = chunk
        while data:
            self._add(self._inflater.decompress(data, _INFLATE_STEP))
            data = self._inflater.unconsumed_tail

    def finish(self) -> bytes:
        if self._inflater is not None:
            self._add(self._inflater.flush())
        parts = self._parts
        return parts[0] if len(parts) == 1 else b"".join(parts)


class Fields:
    """A response's header fields by lower-case name (the last value of a repeated one)."""

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields

    def get(self, name: str, default: str = "") -> str:
        return self._fields.get(name.lower(), default)


class _Head:
    """A response's status line and header fields, and how its body is framed."""

    def __init__(self, raw: bytes, head_request: bool) -> None:
        lines = raw[:-4].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        status = rest[:3]
        if not version.startswith(b"HTTP/1.") or not status.isdigit() or rest[3:4] not in (b"", b" "):
            raise RemoteProtocolError(f"malformed status line {lines[0][:80]!r}")
        self.status = int(status)
        fields: dict[str, str] = {}
        lengths: set[bytes] = set()
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name[-1:].isspace() or line[:1].isspace():
                raise RemoteProtocolError(f"malformed header line {line[:80]!r}")
            key = name.decode("latin-1").lower()
            fields[key] = value.strip().decode("latin-1")
            if key == "content-length":
                lengths.add(value.strip())
        self.fields = Fields(fields)
        self.chunked = fields.get("transfer-encoding", "").lower().endswith("chunked")
        if len(lengths) > 1 or (lengths and not next(iter(lengths)).isdigit()):
            raise RemoteProtocolError("conflicting or malformed Content-Length")
        self.length = int(lengths.pop()) if lengths and not self.chunked else None
        if head_request or self.status in (204, 304):
            self.length, self.chunked = 0, False
        self.keep_alive = (version == b"HTTP/1.1" and "close" not in fields.get("connection", "").lower()
                           and (self.length is not None or self.chunked))  # else the body ends with the connection


@dataclass(frozen=True, slots=True)
class Answer:
    """A response: its status and header fields, and its decoded body (None unless the status is 200: another
    answer's body is not read, and its connection not kept)."""

    status_code: int
    headers: Fields
    body: bytes | None


class _Unanswered(Exception):
    """The connection closed before any byte of an answer came (a kept connection the server closed meanwhile)."""


_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)


class _Exchange:
    """One request on a connection: what its answer may be, and where it goes once read (or failed)."""

    __slots__ = ("answered", "decoder", "future", "head", "head_request", "max_bytes", "remaining", "state")

    def __init__(self, future: asyncio.Future[Answer], head_request: bool, max_bytes: int) -> None:
        self.future = future
        self.head_request = head_request
        self.max_bytes = max_bytes
        self.answered = False  # a byte of the answer came
        self.state = _HEAD
        self.head: _Head | None = None
        self.decoder: BoundedDecoder | None = None
        self.remaining = 0


class _Connection(asyncio.Protocol):
    """One keep-alive connection, reading the answer to the request in flight as the loop delivers it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False  # the last answer was read to its end, and the connection may carry another
        self._exchange: _Exchange | None = None
        self._buffer = b""  # a response head not complete yet
        self._chunks = ChunkedDecoder()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def open(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def ask(self, request: bytes, exchange: _Exchange) -> None:
        assert self.transport is not None
        self._exchange, self.reusable, self._buffer = exchange, False, b""
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None:  # bytes nobody asked for: the connection cannot be trusted with another request
            self.close()
            return
        exchange.answered = True
        try:
            self._read(exchange, data)
        except (TransportError, BodyTooLarge, UnsupportedEncoding, zlib.error) as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        exchange = self._exchange
        if exchange is not None and exchange.state == _UNTIL_CLOSE:
            try:
                self._complete(exchange, reusable=False)
            except (BodyTooLarge, zlib.error) as exc:
                self._fail(exc)
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange = self._exchange
        if exchange is None:
            return
        if not exchange.answered:
            self._fail(_Unanswered())
        elif exchange.state == _HEAD:
            self._fail(RemoteProtocolError("the server closed the connection within the response head"))
        else:
            self._fail(RemoteProtocolError("the server closed the connection before the whole body was sent"))

    def _fail(self, exc: BaseException) -> None:
        exchange, self._exchange = self._exchange, None
        self.close()
        if exchange is not None and not exchange.future.done():
            exchange.future.set_exception(exc)

    def _read(self, exchange: _Exchange, data: bytes) -> None:
        if exchange.state == _HEAD:
            data = self._read_head(exchange, self._buffer + data if self._buffer else data)
            if self._exchange is not exchange:  # answered by its head alone
                if data:  # and more came after it: the connection's next answer would start with these
                    self.reusable = False
                    self.close()
                return
            if not data:
                return
        decoder = exchange.decoder
        assert decoder is not None
        if exchange.state == _LENGTH:
            take = exchange.remaining
            decoder.feed(data if len(data) <= take else data[:take])
            exchange.remaining -= min(take, len(data))
            if not exchange.remaining:
                self._complete(exchange, reusable=len(data) == take)  # bytes past the body: not kept
        elif exchange.state == _CHUNKED:
            self._read_chunked(exchange, decoder, data)
        else:
            decoder.feed(data)

    def _read_head(self, exchange: _Exchange, data: bytes) -> bytes:
        """Reads heads (1xx interim ones skipped) until the final one; returns what follows it."""
        while True:
            end = data.find(b"\r\n\r\n", 0, HEAD_LIMIT)
            if end < 0:
                if len(data) >= HEAD_LIMIT:
                    raise RemoteProtocolError("response head too large")
                self._buffer = data
                return b""
            head = _Head(data[:end + 4], exchange.head_request)
            data = data[end + 4:]
            if not 100 <= head.status < 200:
                self._buffer = b""
                self._begin_body(exchange, head)
                return data

    def _begin_body(self, exchange: _Exchange, head: _Head) -> None:
        exchange.head = head
        if head.status != 200:
            self._complete(exchange, reusable=False)
            return
        exchange.decoder = BoundedDecoder(head.fields.get("content-encoding"), exchange.max_bytes)
        if head.chunked:
            exchange.state, self._chunks = _CHUNKED, ChunkedDecoder()
        elif head.length is not None:
            exchange.state, exchange.remaining = _LENGTH, head.length
            if not head.length:
                self._complete(exchange, reusable=True)
        else:
            exchange.state = _UNTIL_CLOSE

    def _read_chunked(self, exchange: _Exchange, decoder: BoundedDecoder, data: bytes) -> None:
        pieces: list[bytes] = []
        end = self._chunks.feed(data, 0, pieces)
        for piece in pieces:
            if piece:
                decoder.feed(piece)
        if self._chunks.failed:
            raise RemoteProtocolError("malformed chunked body")
        if self._chunks.done:
            self._complete(exchange, reusable=end == len(data))

    def _complete(self, exchange: _Exchange, reusable: bool) -> None:
        head = exchange.head
        assert head is not None
        body = exchange.decoder.finish() if exchange.decoder is not None else None
        self._exchange = None
        self.reusable = reusable and head.keep_alive
        if not self.reusable:
            self.close()
        if not exchange.future.done():
            exchange.future.set_result(Answer(head.status, head.fields, body))


class LeanClient:
    """What fetch needs of an HTTP client (``get``), for one target: TLS with the given context."""

    def __init__(self, verify: ssl.SSLContext | None = None) -> None:
        self._ssl = verify
        self._idle: dict[ConnectionKey, list[_Connection]] = {}
        self._requests: dict[tuple[Any, ...], tuple[ConnectionKey, bytes]] = {}

    def _release(self, key: ConnectionKey, connection: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if connection.reusable and connection.open() and len(idle) < MAX_IDLE:
            idle.append(connection)
        else:
            connection.close()

    def _take(self, key: ConnectionKey) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.open():
                return connection
            connection.close()
        return None

    def _request(self, method: str, url: str, headers: dict[str, str],
                 server_name: str | None) -> tuple[ConnectionKey, bytes]:
        """Where to send a request and its bytes, built once for the same arguments."""
        cache_key = (method, url, tuple(headers.items()), server_name)
        built = self._requests.get(cache_key)
        if built is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConnectError(f"unsupported URL {url!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}",
                     *(f"{name}: {value}" for name, value in headers.items())]
            built = (parts.scheme, parts.hostname, port, server_name), ("\r\n".join(lines) + "\r\n\r\n").encode()
            if len(self._requests) >= REQUESTS_KEPT:
                self._requests.clear()
            self._requests[cache_key] = built
        return built

    async def _connect(self, key: ConnectionKey, timeout: float) -> _Connection:
        scheme, host, port, server_name = key
        tls = scheme == "https"
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(
                    _Connection, host, port, ssl=(self._ssl or ssl.create_default_context()) if tls else None,
                    server_hostname=(server_name or host) if tls else None)
        except (OSError, ssl.SSLError) as exc:  # TimeoutError (the connect timeout) goes on as it is
            if isinstance(exc, TimeoutError):
                raise
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        return connection

    @staticmethod
    async def _ask(connection: _Connection, request: bytes, head_request: bool, max_bytes: int,
                   deadline: float) -> Answer:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        connection.ask(request, _Exchange(future, head_request, max_bytes))
        timer = loop.call_at(deadline, _expire, future)
        try:
            return await future
        except BaseException:  # failed, timed out or cancelled: what the connection holds is unknown
            connection.close()
            raise
        finally:
            timer.cancel()

    async def get(self, url: str, *, headers: dict[str, str], timeout: float, max_bytes: int,
                  sni_hostname: str | None = None, method: str = "GET") -> Answer:
        """The answer to ``method url`` within ``timeout`` seconds (TimeoutError past it); a body of a 200 answer
        decoded to at most ``max_bytes`` (BodyTooLarge past it; UnsupportedEncoding, zlib.error); TransportError
        when no usable answer came."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        key, request = self._request(method, url, headers, sni_hostname)
        head_request = method == "HEAD"
        connection = self._take(key)
        reused = connection is not None
        if connection is None:
            connection = await self._connect(key, timeout)
        try:
            try:
                answer = await self._ask(connection, request, head_request, max_bytes, deadline)
            except _Unanswered:
                if not reused:
                    raise
                # Closed by the server while idle: once more, on a new connection.
                connection = await self._connect(key, deadline - loop.time())
                answer = await self._ask(connection, request, head_request, max_bytes, deadline)
        except _Unanswered:
            raise RemoteProtocolError("the server closed the connection without a response") from None
        self._release(key, connection)
        return answer

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


def _expire(future: asyncio.Future[Answer]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
