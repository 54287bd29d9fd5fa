"""A lean HTTP/1.1 transport for httpx: keep-alive connections on plain asyncio streams, nothing else.

httpx's default transport (httpcore) cost the sidecar ~1 ms of CPU per collection of a real vLLM page (51 KiB):
a connection pool guarded by anyio locks and events, the h11 state machine, and a failed ``import sniffio`` four
times a request (a sys.path search each, as a failed import is not remembered). The page itself took 0.5 ms to
collect and derive. The sidecar asks each target for one page at a time over its own client, so this transport
keeps what that needs: a connection reused from one collection to the next (TLS included), the response head
parsed once, the body handed on as the socket delivers it (fetch's BoundedDecoder caps and gunzips it), framed by
Content-Length, the chunked coding or the end of the connection.

It has no timeouts of its own beyond the connect timeout: fetch puts one deadline around the whole exchange. A
connection is reused only after its response was read to the end; one that the server closed while it was idle
is replaced, and a request that finds it closed before any byte of an answer is sent once more on a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx

REQUESTS_KEPT = 4  # requests built once and sent again (the page's, the model list's)
READ_SIZE = 64 * 1024  # the most one read hands on: a body larger than the cap stops within this much of it
HEAD_LIMIT = 64 * 1024  # a response head larger than this is refused (uvicorn's h11 refuses 16 KiB requests)
ConnectionKey = tuple[str, str, int, str | None]  # scheme, host, port, TLS server name


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def open(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class _Head:
    """A response's status line and header fields, and how its body is framed."""

    def __init__(self, raw: bytes, request: httpx.Request) -> None:
        lines = raw[:-4].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        status, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(status) != 3 or not status.isdigit():
            raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}", request=request)
        self.version, self.status, self.reason = version, int(status), reason
        self.fields: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name[-1:].isspace() or line[:1].isspace():
                raise httpx.RemoteProtocolError(f"malformed header line {line[:80]!r}", request=request)
            self.fields.append((name, value.strip()))
        self.chunked = self.length = None
        self.keep_alive = version == b"HTTP/1.1"
        lengths = set()
        for name, value in self.fields:
            lower = name.lower()
            if lower == b"transfer-encoding":
                self.chunked = value.lower().endswith(b"chunked")
            elif lower == b"content-length":
                lengths.add(value)
            elif lower == b"connection" and b"close" in value.lower():
                self.keep_alive = False
        if len(lengths) > 1 or (lengths and not next(iter(lengths)).isdigit()):
            raise httpx.RemoteProtocolError("conflicting or malformed Content-Length", request=request)
        if lengths and not self.chunked:
            self.length = int(lengths.pop())
        if request.method == "HEAD" or self.status in (204, 304):
            self.length, self.chunked = 0, None
        if self.length is None and not self.chunked:
            self.keep_alive = False  # the body ends with the connection


class _Body(httpx.AsyncByteStream):
    """A response body read from its connection as the socket delivers it; the connection goes back to the
    transport once the body has been read to its end, and is closed otherwise."""

    def __init__(self, transport: LeanTransport, key: ConnectionKey, connection: _Connection, head: _Head,
                 request: httpx.Request) -> None:
        self._transport, self._key, self._connection, self._head = transport, key, connection, head
        self._request = request
        self._complete = False
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader, head = self._connection.reader, self._head
        try:
            if head.chunked:
                async for piece in self._chunks(reader):
                    yield piece
            elif head.length is not None:
                remaining = head.length
                while remaining:
                    data = await reader.read(min(remaining, READ_SIZE))
                    if not data:
                        raise httpx.RemoteProtocolError("the server closed the connection before the whole body "
                                                        "was sent", request=self._request)
                    remaining -= len(data)
                    yield data
            else:
                while data := await reader.read(READ_SIZE):
                    yield data
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__, request=self._request) from exc
        except (asyncio.LimitOverrunError, ValueError) as exc:
            raise httpx.RemoteProtocolError(f"malformed chunked body: {exc}", request=self._request) from exc
        self._complete = True

    async def _chunks(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
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

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._complete and self._head.keep_alive:
            self._transport.release(self._key, self._connection)
        else:
            self._connection.close()


class LeanTransport(httpx.AsyncBaseTransport):
    """httpx's transport interface over asyncio streams: HTTP/1.1, keep-alive, TLS with the given context."""

    def __init__(self, verify: ssl.SSLContext | None = None, max_idle: int = 2) -> None:
        self._ssl = verify
        self._max_idle = max_idle
        self._idle: dict[ConnectionKey, list[_Connection]] = {}

    def release(self, key: ConnectionKey, connection: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if connection.open() and len(idle) < self._max_idle:
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

    async def _connect(self, key: ConnectionKey, request: httpx.Request) -> _Connection:
        scheme, host, port, server_name = key
        timeout = request.extensions.get("timeout", {}).get("connect")
        tls = scheme == "https"
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=(self._ssl or ssl.create_default_context()) if tls else None,
                    server_hostname=(server_name or host) if tls else None, limit=HEAD_LIMIT)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"no connection within {timeout:g}s", request=request) from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return _Connection(reader, writer)

    async def _exchange(self, connection: _Connection, request: httpx.Request, body: bytes) -> _Head:
        url = request.url
        lines = [request.method.encode("ascii"), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            lines += [name, b": ", value, b"\r\n"]
        lines.append(b"\r\n")
        connection.writer.write(b"".join(lines) + body)
        while True:
            try:
                raw = await connection.reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError as exc:
                raise httpx.RemoteProtocolError("response head too large", request=request) from exc
            head = _Head(raw, request)
            if not 100 <= head.status < 200:
                return head  # an interim 1xx answer is followed by the response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        key = (url.scheme, url.host, port, request.extensions.get("sni_hostname"))
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {url.scheme!r}", request=request)
        body = await request.aread()
        connection = self._take(key)
        reused = connection is not None
        if connection is None:
            connection = await self._connect(key, request)
        try:
            try:
                head = await self._exchange(connection, request, body)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    raise
                connection.close()  # closed by the server while idle: once more, on a new connection
                connection = await self._connect(key, request)
                head = await self._exchange(connection, request, body)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            connection.close()
            raise httpx.RemoteProtocolError(f"the server closed the connection without a response "
                                            f"({type(exc).__name__})", request=request) from exc
        except BaseException:
            connection.close()
            raise
        return httpx.Response(head.status, headers=head.fields, stream=_Body(self, key, connection, head, request),
                              extensions={"http_version": head.version, "reason_phrase": head.reason})

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


class LeanClient:
    """What fetch needs of an HTTP client (``stream``), straight to a LeanTransport: a request is built once and
    sent again at every collection, with no auth, cookie, redirect or event-hook machinery around it (the
    collection uses none of it: no redirects followed, no proxy, credentials in the headers fetch passes). httpx's
    AsyncClient around the same transport cost ~0.3 ms a fetch in building and wrapping."""

    def __init__(self, transport: LeanTransport) -> None:
        self._transport = transport
        self._requests: dict[tuple[Any, ...], httpx.Request] = {}

    def _request(self, method: str, url: str, headers: dict[str, str], timeout: float,
                 extensions: dict[str, Any] | None) -> httpx.Request:
        key = (method, url, tuple(headers.items()), timeout, tuple((extensions or {}).items()))
        request = self._requests.get(key)
        if request is None:
            if len(self._requests) >= REQUESTS_KEPT:
                self._requests.clear()
            request = self._requests[key] = httpx.Request(
                method, url, headers=headers, extensions={**(extensions or {}), "timeout": {"connect": timeout}})
        return request

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, *, headers: dict[str, str], timeout: float,
                     extensions: dict[str, Any] | None = None) -> AsyncIterator[httpx.Response]:
        request = self._request(method, url, headers, timeout, extensions)
        response = await self._transport.handle_async_request(request)
        response.request = request
        try:
            yield response
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
