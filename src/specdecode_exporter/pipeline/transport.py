"""The collection's HTTP client: HTTP/1.1 GETs over keep-alive connections on plain asyncio streams.

httpx cost the sidecar ~1 ms of CPU per collection of a real vLLM page (51 KiB), twice what collecting and deriving
the page took: the client built and merged the request, ran its auth, cookie and redirect flows; its transport
(httpcore) guarded a connection pool with anyio locks and events, ran the h11 state machine, and tried a failed
``import sniffio`` four times a request (a sys.path search each: a failed import is not remembered). It also made
up 2-4 MB of the process's memory. The sidecar asks each target for one page at a time over the target's own
client, so this keeps only what that needs: the request's bytes built once, a connection reused from one collection
to the next (TLS included), the response head parsed once, and the body handed on as the socket delivers it
(fetch's BoundedDecoder caps and gunzips it), framed by Content-Length, the chunked coding or the end of the
connection. No redirects are followed, no proxy is used, credentials come in the headers fetch passes.

It has no timeout of its own beyond the connect timeout: fetch puts one deadline around the whole exchange. A
connection is reused only after its response was read to the end; one that the server closed while it was idle
is replaced, and a request that finds it closed before any byte of an answer is sent once more on a new one.
The errors are named after httpx's (fetch reports the name), without importing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

READ_SIZE = 64 * 1024  # the most one read hands on: a body larger than the cap stops within this much of it
HEAD_LIMIT = 64 * 1024  # a response head larger than this is refused (uvicorn's h11 refuses 16 KiB requests)
REQUESTS_KEPT = 4  # requests built once and sent again (the page's, the model list's)
MAX_IDLE = 2  # connections kept per client
ConnectionKey = tuple[str, str, int, str | None]  # scheme, host, port, TLS server name


class TransportError(Exception):
    """A request that got no usable answer."""


class ConnectError(TransportError):
    pass


class RemoteProtocolError(TransportError):
    pass


class ReadError(TransportError):
    pass


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def open(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


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


class Response:
    """A response whose body is read from its connection as the socket delivers it (``aiter_raw``, once). The
    connection goes back to its client once the body has been read to its end, and is closed otherwise."""

    def __init__(self, client: LeanClient, key: ConnectionKey, connection: _Connection, head: _Head) -> None:
        self._client, self._key, self._connection, self._head = client, key, connection, head
        self.status_code = head.status
        self.headers = head.fields
        self._complete = False
        self._closed = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        reader, head = self._connection.reader, self._head
        try:
            if head.chunked:
                async for piece in _chunks(reader):
                    yield piece
            elif head.length is not None:
                remaining = head.length
                while remaining:
                    data = await reader.read(min(remaining, READ_SIZE))
                    if not data:
                        raise RemoteProtocolError("the server closed the connection before the whole body was sent")
                    remaining -= len(data)
                    yield data
            else:
                while data := await reader.read(READ_SIZE):
                    yield data
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ReadError(str(exc) or type(exc).__name__) from exc
        except (asyncio.LimitOverrunError, ValueError) as exc:
            raise RemoteProtocolError(f"malformed chunked body: {exc}") from exc
        self._complete = True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._complete and self._head.keep_alive:
                self._client.release(self._key, self._connection)
            else:
                self._connection.close()


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The chunked coding's data, as it arrives."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, none kept
                pass
            return
        while size:
            data = await reader.read(min(size, READ_SIZE))
            if not data:
                raise asyncio.IncompleteReadError(b"", size)
            size -= len(data)
            yield data
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("no CRLF after a chunk")


class LeanClient:
    """What fetch needs of an HTTP client (``stream``), for one target: TLS with the given context."""

    def __init__(self, verify: ssl.SSLContext | None = None) -> None:
        self._ssl = verify
        self._idle: dict[ConnectionKey, list[_Connection]] = {}
        self._requests: dict[tuple[Any, ...], tuple[ConnectionKey, bytes]] = {}

    def release(self, key: ConnectionKey, connection: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if connection.open() and len(idle) < MAX_IDLE:
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
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=(self._ssl or ssl.create_default_context()) if tls else None,
                    server_hostname=(server_name or host) if tls else None, limit=HEAD_LIMIT)
        except (OSError, ssl.SSLError) as exc:  # TimeoutError (the connect timeout) goes on as it is
            if isinstance(exc, TimeoutError):
                raise
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(reader, writer)

    @staticmethod
    async def _exchange(connection: _Connection, request: bytes, head_request: bool) -> _Head:
        connection.writer.write(request)
        while True:
            try:
                raw = await connection.reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError as exc:
                raise RemoteProtocolError("response head too large") from exc
            head = _Head(raw, head_request)
            if not 100 <= head.status < 200:
                return head  # an interim 1xx answer is followed by the response

    async def _send(self, key: ConnectionKey, request: bytes, head_request: bool,
                    timeout: float) -> tuple[_Connection, _Head]:
        connection = self._take(key)
        reused = connection is not None
        if connection is None:
            connection = await self._connect(key, timeout)
        try:
            try:
                return connection, await self._exchange(connection, request, head_request)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    raise
                connection.close()  # closed by the server while idle: once more, on a new connection
                connection = await self._connect(key, timeout)
                return connection, await self._exchange(connection, request, head_request)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            connection.close()
            raise RemoteProtocolError(f"the server closed the connection without a response "
                                      f"({type(exc).__name__})") from exc
        except BaseException:
            connection.close()
            raise

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, *, headers: dict[str, str], timeout: float,
                     extensions: dict[str, Any] | None = None) -> AsyncIterator[Response]:
        """The response to ``method url`` (``extensions``: httpx's, of which only ``sni_hostname`` is read)."""
        key, request = self._request(method, url, headers, (extensions or {}).get("sni_hostname"))
        connection, head = await self._send(key, request, method == "HEAD", timeout)
        response = Response(self, key, connection, head)
        try:
            yield response
        finally:
            response.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
