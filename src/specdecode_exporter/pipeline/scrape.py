"""Fetch one target's /metrics: total deadline, size cap on the decoded body, our own bounded gzip
decoding (a gzip bomb stops at the cap), no redirects. Returns bytes or a typed failure, never raises."""

from __future__ import annotations

import asyncio
import sys
import time
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from specdecode_exporter.core.failure import FailureReason as FailureReason  # re-exported: its old home
from specdecode_exporter.pipeline.engines.base import FetchTiming
from specdecode_exporter.pipeline.transport import (
    Answer,
    BodyTooLarge,
    BoundedDecoder,
    Fields,
    LeanClient,
    TransportError,
    UnsupportedEncoding,
)

ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
)
USER_AGENT = "specdecode-exporter"


class HeaderFields(Protocol):
    def get(self, name: str, default: str = ..., /) -> str: ...


class StreamedResponse(Protocol):
    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> HeaderFields: ...
    def aiter_raw(self) -> AsyncIterator[bytes]: ...


class StreamingClient(Protocol):
    """What fetch asks of a client other than the sidecar's own (pipeline/transport.py's LeanClient, asked with
    ``get``): httpx.AsyncClient (check, the tests)."""

    def stream(self, method: str, url: str, *, headers: dict[str, str], timeout: float,
               extensions: dict[str, Any] | None) -> AbstractAsyncContextManager[StreamedResponse]: ...


FetchClient = LeanClient | StreamingClient  # the sidecar's own client, or httpx (check, the tests)


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


def valid_bearer_token(token: str) -> bool:
    """A token we can put in a header: visible ASCII only (no CR/LF injection, no spaces)."""
    return bool(token) and all(33 <= ord(c) <= 126 for c in token)


def _headers(bearer_token: str | None) -> dict[str, str]:
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": USER_AGENT}
    if bearer_token:
        headers["Authorization"] = f"Bearer {bearer_token}"
    return headers


async def fetch(
    client: FetchClient,
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

    try:
        if isinstance(client, LeanClient):
            answer = await client.get(url, headers=_headers(bearer_token), timeout=timeout, max_bytes=max_bytes,
                                      sni_hostname=sni_hostname)
        else:
            async with asyncio.timeout(timeout):
                answer = await _streamed(client, url, _headers(bearer_token), timeout, sni_hostname, max_bytes)
        if answer.body is None:
            location = answer.headers.get("location")
            hint = f" (redirect to {location} not followed)" if location else ""
            return failed(FailureReason.HTTP_STATUS, f"HTTP {answer.status_code}{hint}")
    except UnsupportedEncoding as exc:
        return failed(FailureReason.PARSE, str(exc))
    except BodyTooLarge:
        return failed(FailureReason.TOO_LARGE, f"body larger than {max_bytes} bytes")
    except zlib.error as exc:
        return failed(FailureReason.PARSE, f"bad gzip body: {exc}")
    except TimeoutError:
        return failed(FailureReason.TIMEOUT, f"no complete answer within {timeout:g}s")
    except OSError as exc:
        return failed(FailureReason.CONNECT, str(exc))
    except Exception as exc:
        reason = client_failure(exc)
        if reason is None:
            raise
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return failed(reason, f"no complete answer within {timeout:g}s" if reason is FailureReason.TIMEOUT else detail)
    return FetchResult(FetchTiming(started, clock()), body=answer.body,
                       content_type=answer.headers.get("content-type", ""))


async def _streamed(client: StreamingClient, url: str, headers: dict[str, str], timeout: float,
                    sni_hostname: str | None, max_bytes: int) -> Answer:
    """The answer through a streaming client (httpx: check's, the tests'), its body decoded as the lean client's is
    (None unless the status is 200)."""
    extensions = {"sni_hostname": sni_hostname} if sni_hostname else None  # httpx's name for it
    async with client.stream("GET", url, headers=headers, timeout=timeout, extensions=extensions) as response:
        fields = Fields({name: response.headers.get(name, "") for name in ("content-type", "location")})
        if response.status_code != 200:
            return Answer(response.status_code, fields, None)
        decoder = BoundedDecoder(response.headers.get("content-encoding", ""), max_bytes)
        async for chunk in response.aiter_raw():
            decoder.feed(chunk)
        return Answer(200, fields, decoder.finish())


def client_failure(exc: Exception) -> FailureReason | None:
    """What an HTTP client's error means: the lean client's, or httpx's (check's and the tests' client). httpx is
    loaded whenever one of its errors is raised; the sidecar's own process never loads it."""
    if isinstance(exc, TransportError):
        return FailureReason.CONNECT
    httpx: Any = sys.modules.get("httpx")
    if httpx is not None and isinstance(exc, httpx.TimeoutException):
        return FailureReason.TIMEOUT
    if httpx is not None and isinstance(exc, httpx.HTTPError):
        return FailureReason.CONNECT
    return None
