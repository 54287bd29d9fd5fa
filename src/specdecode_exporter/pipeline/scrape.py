"""Fetch one target's /metrics over httpx: one deadline for the whole answer, no redirects, and the body read raw
and decoded here (gunzip bounded per call), so a gzip bomb stops at the size cap. Returns bytes or a typed failure,
never raises."""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from specdecode_exporter.core.contract.failure import FailureReason as FailureReason  # re-exported: its old home
from specdecode_exporter.pipeline.engines.base import FetchTiming

ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
)
USER_AGENT = "specdecode-exporter"
# How long an idle connection is kept: well past any collection interval (httpx's default, 5 s, is the default
# interval: the connection would be dropped just before each collection). Prometheus keeps its own 5 minutes.
KEEPALIVE_SECONDS = 300.0
INFLATE_STEP = 256 * 1024  # the most one decompress call inflates, whatever the compression ratio
# What a request meets when the server closed a kept connection as the request went out (uvicorn, vLLM's server,
# closes one idle for 5 s, the default interval): it is sent once more, on a new connection.
_UNANSWERED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def http_client(tls: ssl.SSLContext) -> httpx.AsyncClient:
    """A client for one target: ``tls`` verifies its https server, nothing is read from the environment (no proxy,
    no .netrc), redirects are not followed, and its connection is kept from one collection to the next."""
    return httpx.AsyncClient(verify=tls, trust_env=False, follow_redirects=False,
                             limits=httpx.Limits(max_keepalive_connections=2, keepalive_expiry=KEEPALIVE_SECONDS))


class BodyTooLarge(Exception):
    """The decoded body passed the cap."""


class UnsupportedEncoding(ValueError):
    """A Content-Encoding that is not decoded here."""


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
            self._add(self._inflater.decompress(data, INFLATE_STEP))
            data = self._inflater.unconsumed_tail

    def finish(self) -> bytes:
        if self._inflater is not None:
            self._add(self._inflater.flush())
        parts = self._parts
        return parts[0] if len(parts) == 1 else b"".join(parts)


@dataclass(frozen=True, slots=True)
class FetchResult:
    timing: FetchTiming
    body: bytes | None = None
    content_type: str = ""
    failure: FailureReason | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True, slots=True)
class _Answer:
    status_code: int
    content_type: str
    location: str
    body: bytes | None  # None unless the status is 200 (another answer's body is not read)


def valid_bearer_token(token: str) -> bool:
    """A token we can put in a header: visible ASCII only (no CR/LF injection, no spaces)."""
    return bool(token) and all(33 <= ord(c) <= 126 for c in token)


def _headers(bearer_token: str | None) -> dict[str, str]:
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": USER_AGENT}
    if bearer_token:
        headers["Authorization"] = f"Bearer {bearer_token}"
    return headers


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    timeout: float,
    max_bytes: int,
    bearer_token: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sni_hostname: str | None = None,
) -> FetchResult:
    started = clock()

    def failed(reason: FailureReason, detail: str) -> FetchResult:
        return FetchResult(FetchTiming(started, clock()), failure=reason, detail=detail)

    request = client.build_request("GET", url, headers=_headers(bearer_token), timeout=timeout,
                                   extensions={"sni_hostname": sni_hostname} if sni_hostname else None)
    try:
        async with asyncio.timeout(timeout):
            answer = await _answer(client, request, max_bytes)
    except UnsupportedEncoding as exc:
        return failed(FailureReason.PARSE, str(exc))
    except BodyTooLarge:
        return failed(FailureReason.TOO_LARGE, f"body larger than {max_bytes} bytes")
    except zlib.error as exc:
        return failed(FailureReason.PARSE, f"bad gzip body: {exc}")
    except (TimeoutError, httpx.TimeoutException):
        return failed(FailureReason.TIMEOUT, f"no complete answer within {timeout:g}s")
    except (httpx.HTTPError, OSError) as exc:
        return failed(FailureReason.CONNECT, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    if answer.body is None:
        hint = f" (redirect to {answer.location} not followed)" if answer.location else ""
        return failed(FailureReason.HTTP_STATUS, f"HTTP {answer.status_code}{hint}")
    return FetchResult(FetchTiming(started, clock()), body=answer.body, content_type=answer.content_type)


async def _answer(client: httpx.AsyncClient, request: httpx.Request, max_bytes: int) -> _Answer:
    """The answer to ``request``, its body read raw and decoded under ``max_bytes``. A connection whose answer was
    not read to its end (another status, a failure, a cancellation) is closed by httpx, not kept."""
    try:
        response = await client.send(request, stream=True)
    except _UNANSWERED:
        response = await client.send(request, stream=True)
    try:
        content_type = response.headers.get("content-type", "")
        if response.status_code != 200:
            return _Answer(response.status_code, content_type, response.headers.get("location", ""), None)
        decoder = BoundedDecoder(response.headers.get("content-encoding", ""), max_bytes)
        async for chunk in response.aiter_raw():
            decoder.feed(chunk)
        return _Answer(200, content_type, "", decoder.finish())
    finally:
        await response.aclose()
