"""The request tap's data path: an HTTP/1.1 relay in front of vLLM's OpenAI API.

Each client connection gets its own upstream connection (opened when the client connects, closed when either side
closes), so keep-alive, pipelining and connection lifetimes are the upstream's own. Bytes are relayed as they arrive
with asyncio Protocols (no streams, no tasks per message); only the heads are parsed, and only the bodies of POST
/v1/completions and /v1/chat/completions are looked at. Anything not understood is forwarded untouched.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from specdecode_exporter.core.log import event
from specdecode_exporter.tap import model
from specdecode_exporter.tap.http1 import (
    CHUNK_END,
    HEAD_END,
    MAX_HEAD,
    ChunkedDecoder,
    Head,
    PlainChunks,
    frame_chunk,
    parse_head,
    replace_content_length,
)
from specdecode_exporter.tap.model import Observer, Route, Router, TapRequest, TapResult
from specdecode_exporter.tap.openai import endpoint_of, plan_request, read_response_body
from specdecode_exporter.tap.sse import SseWatcher, StreamFindings, UsageStripper

DEFAULT_CONNECT_TIMEOUT = 3.0
DEFAULT_MAX_INSPECT_BODY = 8 * 1024 * 1024
WRITE_HIGH_WATER = 64 * 1024  # per direction and connection: reading the other side pauses above this
WRITE_LOW_WATER = 16 * 1024
SSE_HOLD_LIMIT = 256 * 1024  # the most of an unfinished SSE event the tap holds back
_LAST_CHUNK = b"0\r\n\r\n"

# Request-side states
_REQ_HEAD, _REQ_LENGTH, _REQ_CHUNKED, _REQ_INSPECT, _REQ_TUNNEL = range(5)
# Response-side states
_RESP_HEAD, _RESP_LENGTH, _RESP_CHUNKED, _RESP_UNTIL_CLOSE, _RESP_TUNNEL = range(5)
# What is done with an inspected response body
_PASS, _CAPTURE, _WATCH, _STRIP, _REFRAME = range(5)
_PLAIN_CHUNKS = PlainChunks()
SPECULATIVE_POOL, FALLBACK_POOL = 0, 1  # the upstreams of a routing tap (one pool, the first, without routing)
FALLBACK_RETRY_MIN, FALLBACK_RETRY_MAX = 0.5, 30.0  # seconds a failed fallback is not tried again (doubling)


@dataclass(frozen=True, slots=True)
class TapStats:
    connections: int
    buffered_bytes: int  # bytes held by the relay: transport write buffers plus events held back
    fallback_available: bool | None = None  # routing: whether the fallback is tried (None: no routing)


DRAIN_POLL_SECONDS = 0.05


class Tap:
    """A running tap. ``url`` is its base URL; ``close()`` stops listening, lets the requests in flight finish
    for up to ``grace`` seconds, and then drops every connection."""

    def __init__(self, server: asyncio.Server, host: str, port: int, links: set[_Link], shared: _Shared) -> None:
        self._server = server
        self._links = links
        self._shared = shared
        self.host = host
        self.port = port
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def stats(self) -> TapStats:
        return TapStats(len(self._links), sum(link.buffered_bytes() for link in self._links),
                        self._shared.fallback_available() if self._shared.router is not None else None)

    async def close(self, grace: float = 0.0) -> None:
        self._server.close()
        # The grace is a promise in real (monotonic) time. uvloop's loop.time() is the loop's cached, millisecond-
        # truncated clock and asyncio may wake a timer up to its resolution early, so the deadline is kept and
        # checked on time.monotonic(): a stream is never cut before the grace has passed.
        deadline = time.monotonic() + grace
        in_flight = sum(not link.idle() for link in self._links)
        while True:
            for link in list(self._links):
                if link.idle():  # between requests: closed now (after what it still has to write)
                    link.close_client()
            left = deadline - time.monotonic()
            if not self._links or left <= 0:
                break
            await asyncio.sleep(min(DRAIN_POLL_SECONDS, left))
        cut = len(self._links)
        for link in list(self._links):
            link.abort()
        await self._server.wait_closed()
        event(logging.WARNING if cut else logging.INFO, "request tap stopped", port=self.port,
              in_flight_at_stop=in_flight, cut=cut)


async def start_tap(
    host: str,
    port: int,
    upstream_base_url: str,
    observer: Observer,
    *,
    workload_header: str = "x-workload",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    max_inspect_body: int = DEFAULT_MAX_INSPECT_BODY,
    sock: socket.socket | None = None,
    router: Router | None = None,
    fallback_upstream: str | None = None,
) -> Tap:
    """Listen on host:port (0: any free port) and relay to ``upstream_base_url`` (http://host:port) on the
    running event loop; ``observer.observe`` is called on that loop for every inspected request.

    With a ``router``, each inspected request goes where ``router.route`` says: the upstream, or the
    ``fallback_upstream`` (a pool without speculative decoding); everything else goes to the upstream."""
    pools = [parse_upstream(upstream_base_url)]
    if router is not None:
        if fallback_upstream is None:
            raise ValueError("a routing tap needs a fallback upstream")
        pools.append(parse_upstream(fallback_upstream))
    links: set[_Link] = set()
    shared = _Shared(
        pools=tuple(pools),
        router=router,
        observer=observer,
        workload_header=workload_header.lower().encode("latin-1"),
        connect_timeout=connect_timeout,
        max_inspect_body=max_inspect_body,
        links=links,
    )
    loop = asyncio.get_running_loop()
    # A socket the caller bound already (the sidecar binds at start, so a taken port is one line and exit 1).
    server = (await loop.create_server(lambda: _Link(shared), sock=sock, backlog=1024) if sock is not None
              else await loop.create_server(lambda: _Link(shared), host, port, backlog=1024))
    bound_port = int(server.sockets[0].getsockname()[1])
    event(
        logging.INFO,
        "request tap listening",
        address=f"{host}:{bound_port}",
        upstream=":".join(map(str, pools[0])),
        **({"fallback": ":".join(map(str, pools[1]))} if router is not None else {}),
    )
    return Tap(server, host, bound_port, links, shared)


def parse_upstream(base_url: str) -> tuple[str, int]:
    """(host, port) of an http:// base URL without a path; ValueError (naming no credentials) otherwise."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError("the tap's upstream must be an http://host:port URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the tap's upstream URL must not carry credentials: the tap forwards the client's own")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("the tap's upstream URL must not have a path: paths are forwarded as the client sent them")
    return parts.hostname, parts.port or 80


class _Shared:
    """Settings and state shared by every connection of one tap."""

    def __init__(
        self,
        *,
        pools: tuple[tuple[str, int], ...],
        router: Router | None,
        observer: Observer,
        workload_header: bytes,
        connect_timeout: float,
        max_inspect_body: int,
        links: set[_Link],
    ) -> None:
        self.pools = pools  # (host, port) of the upstream, and of the fallback when routing
        self.router = router
        self.observer = observer
        self.workload_header = workload_header
        self.connect_timeout = connect_timeout
        self.max_inspect_body = max_inspect_body
        self.links = links
        self.upstream_down: str | None = None  # the last connect failure, until a connect succeeds
        self.observer_errors = 0
        self.router_errors = 0
        self.fallback_down: str | None = None
        self.fallback_retry_at = 0.0  # monotonic: before this, requests for the fallback go to the upstream
        self.fallback_backoff = 0.0

    def connect_result(self, failure: str | None, pool: int = SPECULATIVE_POOL) -> None:
        """Log transitions only: a down upstream must not write a line per request."""
        if pool == FALLBACK_POOL:
            self.fallback_result(failure)
            return
        if failure and self.upstream_down is None:
            event(logging.WARNING, "request tap upstream unavailable", reason=failure)
        elif failure is None and self.upstream_down is not None:
            event(logging.INFO, "request tap upstream reachable again")
        self.upstream_down = failure

    def fallback_result(self, failure: str | None) -> None:
        """A failed fallback is not tried again for a while (0.5 s, doubling up to 30 s): meanwhile its requests go
        to the upstream at once (fallback_down) instead of each waiting for a connect that fails."""
        if failure is None:
            if self.fallback_down is not None:
                event(logging.INFO, "request tap fallback reachable again")
            self.fallback_down, self.fallback_backoff = None, 0.0
            return
        now = time.monotonic()
        if self.fallback_down is None:
            event(logging.WARNING, "request tap fallback unavailable: its requests go to the upstream",
                  reason=failure)
        elif now < self.fallback_retry_at:
            return  # an attempt begun before this pause: one failed try doubles the pause, not each connection
        self.fallback_down = failure
        self.fallback_backoff = min(FALLBACK_RETRY_MAX, max(FALLBACK_RETRY_MIN, 2 * self.fallback_backoff))
        self.fallback_retry_at = now + self.fallback_backoff

    def fallback_available(self) -> bool:
        return self.fallback_down is None or time.monotonic() >= self.fallback_retry_at

    def route(self, request: TapRequest) -> Route | None:
        """Where the router sends ``request``; None (the upstream) if it fails: a router bug must not break the
        data path."""
        assert self.router is not None
        try:
            route = self.router.route(request)
        except Exception as exc:
            self.router_errors += 1
            if self.router_errors & (self.router_errors - 1) == 0:
                event(logging.ERROR, "request tap router failed", error=type(exc).__name__, count=self.router_errors)
            return None
        return route.failed_over() if route.to_fallback and not self.fallback_available() else route

    def observe(self, request: TapRequest, result: TapResult) -> None:
        try:
            self.observer.observe(request, result)
        except Exception as exc:  # an observer bug must not break the data path
            self.observer_errors += 1
            if self.observer_errors & (self.observer_errors - 1) == 0:  # 1st, 2nd, 4th, 8th ...
                event(
                    logging.ERROR, "request tap observer failed", error=type(exc).__name__, count=self.observer_errors
                )


class _Exchange:
    """One request and its response, from the request head to the response's end."""

    __slots__ = (
        "body",
        "body_too_large",
        "first_body",
        "first_byte",
        "method",
        "mode",
        "request",
        "request_read",
        "resend",
        "route",
        "single_prompt",
        "started",
        "status",
        "stream",
        "tunnel",
    )

    def __init__(self, method: bytes, started: float) -> None:
        self.method = method
        self.started = started
        self.request: TapRequest | None = None  # set for inspected requests only
        # Not the plan itself: it holds the request body, which need not live as long as the response.
        self.single_prompt = True
        self.request_read = False  # the whole request has been read from the client
        self.tunnel = False  # an upgrade (or CONNECT): raw bytes both ways once its response starts
        self.first_byte: float | None = None
        self.first_body: float | None = None
        self.route: Route | None = None  # routing: where it was sent
        self.resend: bytes | None = None  # sent to the fallback: the request, until its response starts
        self.status = 0
        self.mode = _PASS
        self.stream: SseWatcher | UsageStripper | None = None
        self.body: bytearray | None = None
        self.body_too_large = False

    def result(self, failure: str | None, now: float) -> TapResult:
        findings: StreamFindings | None = self.stream.findings if self.stream is not None else None
        usage = metrics = timings = None
        unparsable = self.body_too_large or (findings is not None and findings.gave_up)
        if findings is not None:
            usage, metrics, timings = findings.usage, findings.metrics, findings.timings
        elif self.body is not None and failure is None and not self.body_too_large:
            found = read_response_body(bytes(self.body))
            if found is None:
                unparsable = True
            else:
                usage, metrics, timings = found.usage, found.metrics, found.timings
        reason = failure or self._reason(metrics, findings, unparsable)
        return TapResult(self.status, metrics, timings, usage, reason, self.started, self.first_byte, now,
                         self.first_body, self.route)

    def _reason(self, metrics: object, findings: StreamFindings | None, unparsable: bool) -> str | None:
        if self.status >= 400:
            return model.HTTP_ERROR
        if metrics is not None:
            return None
        if self.request is not None and self.request.n > 1:
            return model.N_GT_1
        if not self.single_prompt:
            return model.MULTI_PROMPT
        if unparsable or self.mode == _PASS:
            return model.UNPARSABLE
        if findings is not None and not findings.saw_usage:
            return model.NO_USAGE
        return model.NOT_ENABLED


def _bad_gateway(reason: str, head_request: bool) -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": f"upstream unavailable: {reason}",
                "type": "BadGatewayError",
                "param": None,
                "code": 502,
            }
        },
        separators=(",", ":"),
    ).encode()
    head = (
        b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % len(body)
    )
    return head if head_request else head + body


def _connect_failure(exc: BaseException | None) -> str:
    if isinstance(exc, TimeoutError):
        return "connect timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return type(exc).__name__


class _UpstreamProtocol(asyncio.Protocol):
    __slots__ = ("link", "pool")

    def __init__(self, link: _Link, pool: int = SPECULATIVE_POOL) -> None:
        self.link = link
        self.pool = pool

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.link.upstream_made(self, cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        # The hot path: the read is one whole chunk (one SSE event, as uvicorn writes them) that needs no change.
        link = self.link
        fast = link.fast
        if fast is not None and fast.passes(data):
            link.client_write(data)
        else:
            link.upstream_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.upstream_lost(self)

    def pause_writing(self) -> None:
        self.link.pause_client_reading("upstream")

    def resume_writing(self) -> None:
        self.link.resume_client_reading("upstream")


class _Parked(asyncio.Protocol):
    """An idle upstream connection of a routing link to the pool it is not using now, kept for its next request
    (the transport's protocol is swapped, so the hot path needs no check of which connection is in use)."""

    __slots__ = ("link", "pool", "transport")

    def __init__(self, link: _Link, pool: int, transport: asyncio.Transport) -> None:
        self.link = link
        self.pool = pool
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        """An idle connection has nothing to say; a server closing it may (a 408), which no client awaits."""

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.parked_lost(self)


class _Link(asyncio.Protocol):
    """One client connection (this protocol) and the upstream connection it owns."""

    def __init__(self, shared: _Shared) -> None:
        self.shared = shared
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.connecting: asyncio.Task[tuple[asyncio.Transport, _UpstreamProtocol]] | None = None
        self.upstream_failure: str | None = None
        # Routing: the pool of self.upstream / self.connecting, the protocol of that connection (events of any
        # other are stale), idle connections to the other pool, and a request waiting until the requests in
        # flight on the current pool are answered (responses go back in order).
        self.pool = SPECULATIVE_POOL
        self.current: _UpstreamProtocol | None = None
        self.parked: dict[int, asyncio.Transport] = {}
        self.blocked = False
        self.blocked_send: tuple[_Exchange, bytes, int] | None = None
        self.closed = False
        self.exchanges: collections.deque[_Exchange] = collections.deque()
        self.read_pauses: set[str] = set()
        # request side
        self.req_state = _REQ_HEAD
        self.req_stash = b""
        self.req_remaining = 0
        self.req_decoder = ChunkedDecoder()
        self.req_body = bytearray()
        self.req_head: Head | None = None
        self.req_exchange: _Exchange | None = None
        self.to_upstream: list[bytes] = []
        self.pending_upstream = 0  # bytes waiting for the upstream connection
        # response side
        self.resp_state = _RESP_HEAD
        self.resp_stash = b""
        self.resp_remaining = 0
        self.resp_decoder = ChunkedDecoder()
        self.resp_chunk: list[bytes] = []  # pieces of a chunk being assembled (_STRIP only)
        self.fast: PlainChunks | SseWatcher | UsageStripper | None = None  # see fast_path()
        self.client_write: Callable[[bytes], None] = _drop

    # ---- connection lifecycle -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.client = transport = cast(asyncio.Transport, transport)
        self.client_write = transport.write
        _no_delay(transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.shared.links.add(self)
        self.start_connect()

    def start_connect(self) -> None:
        # No asyncio.wait_for: its extra task would cost a loop iteration on every new connection's first byte.
        loop = asyncio.get_running_loop()
        shared = self.shared
        self.upstream_failure = None
        protocol = self.current = _UpstreamProtocol(self, self.pool)
        host, port = shared.pools[self.pool]
        connecting = loop.create_task(loop.create_connection(lambda: protocol, host, port))
        timer = loop.call_later(shared.connect_timeout, connecting.cancel)
        connecting.add_done_callback(lambda task: self.connect_done(task, timer, protocol))
        self.connecting = connecting

    def upstream_made(self, protocol: _UpstreamProtocol, transport: asyncio.Transport) -> None:
        if self.closed or protocol is not self.current:  # closed, or a connect the link no longer waits for
            self.stray_connection(protocol.pool, transport)
            return
        _no_delay(transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.upstream = transport
        if self.to_upstream:
            self.flush_upstream()
        self.resume_client_reading("connect")

    def connect_done(self, task: asyncio.Task[tuple[asyncio.Transport, _UpstreamProtocol]],
                     timer: asyncio.TimerHandle, protocol: _UpstreamProtocol) -> None:
        timer.cancel()
        if protocol is not self.current:
            return
        self.connecting = None
        if self.closed:
            return
        error = None if task.cancelled() else task.exception()
        if not task.cancelled() and error is None:
            self.shared.connect_result(None, self.pool)
            return
        failure = "connect timeout" if task.cancelled() else _connect_failure(error)
        self.shared.connect_result(failure, self.pool)
        if self.pool == FALLBACK_POOL:
            self.fail_over()
            return
        self.upstream_failure = failure
        self.fail_if_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        """The client is gone: close the upstream at once, so that vLLM aborts what it is generating."""
        self.closed = True
        self.shared.links.discard(self)
        if self.connecting is not None:
            self.connecting.cancel()
        if self.upstream is not None:
            if self.exchanges:
                self.upstream.abort()
            else:
                self.upstream.close()
        for parked in self.parked.values():
            parked.close()
        self.observe_all(model.CLIENT_DISCONNECTED, time.monotonic())

    def upstream_lost(self, protocol: _UpstreamProtocol) -> None:
        if protocol is not self.current:
            return
        self.upstream = None
        if self.closed:
            return
        if self.pool == FALLBACK_POOL and (self.resend_elsewhere() or not self.exchanges):
            return  # requests the fallback did not answer went to the upstream; an idle one just closed
        if not self.exchanges and (self.req_state != _REQ_HEAD or self.req_stash):
            # Closed as idle (uvicorn's keep-alive timeout) while the tap was still reading a request it holds back
            # (an inspected body): nothing of it reached the upstream, so a new connection carries it.
            self.start_connect()
            return
        now = time.monotonic()
        finished: list[_Exchange] = []
        if self.exchanges and self.resp_state == _RESP_UNTIL_CLOSE:
            out: list[bytes] = []
            self.end_response(out, finished)
            self.write_client(out)
            self.observe(finished, None, now)
        elif self.exchanges and self.exchanges[0].first_byte is None and not self.exchanges[0].tunnel:
            exchange = self.exchanges[0]
            exchange.status = 502
            self.write_client([_bad_gateway("connection closed", exchange.method == b"HEAD")])
        self.observe_all(model.UPSTREAM_FAILED, now)
        # Mirror the upstream's close (its keep-alive timeout, or Connection: close) on the client side.
        assert self.client is not None
        self.client.close()

    def fail_if_waiting(self) -> None:
        """After a failed connect: answer the oldest request with a 502 once it has been read, then close."""
        if not self.exchanges or not self.exchanges[0].request_read or self.closed:
            return
        exchange = self.exchanges[0]
        exchange.status = 502
        assert self.client is not None and self.upstream_failure is not None
        self.write_client([_bad_gateway(self.upstream_failure, exchange.method == b"HEAD")])
        self.observe_all(model.UPSTREAM_FAILED, time.monotonic())
        self.client.close()

    def idle(self) -> bool:
        """No request in flight and none half read: closing now loses nothing."""
        return not self.exchanges and self.req_state == _REQ_HEAD and not self.req_stash and not self.blocked

    def close_client(self) -> None:
        if self.client is not None and not self.client.is_closing():
            self.client.close()

    def abort(self) -> None:
        if self.client is not None:
            self.client.abort()
        if self.upstream is not None:
            self.upstream.abort()
        for parked in list(self.parked.values()):
            parked.abort()

    # ---- routing: which pool carries the next request ---------------------------------------------------------

    def switch_to(self, pool: int) -> None:
        """Carry the next requests on ``pool``'s connection: the current one is parked (kept for later, idle),
        the other pool's parked one reused, or a new one opened. Only between responses."""
        if pool == self.pool:
            return
        if self.upstream is not None and not self.upstream.is_closing():
            self.upstream.set_protocol(_Parked(self, self.pool, self.upstream))
            self.upstream.resume_reading()  # paused for a slow client, it would not notice its server closing it
            self.parked[self.pool] = self.upstream
        # A connect still under way is left to finish; upstream_made closes it, as it is no longer current.
        self.upstream, self.connecting, self.current, self.upstream_failure = None, None, None, None
        self.pool = pool
        self.resume_client_reading("upstream")  # a pause the parked connection asked for is its own
        transport = self.parked.pop(pool, None)
        if transport is None or transport.is_closing():
            self.start_connect()
            return
        protocol = self.current = _UpstreamProtocol(self, pool)
        transport.set_protocol(protocol)
        transport.resume_reading()
        self.upstream = transport
        if self.to_upstream:
            self.flush_upstream()
        self.resume_client_reading("connect")

    def stray_connection(self, pool: int, transport: asyncio.Transport) -> None:
        """A connection made after the link switched away from its pool: kept for that pool, if it has none."""
        if self.closed or pool == self.pool or pool in self.parked:
            transport.close()
            return
        _no_delay(transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        transport.set_protocol(_Parked(self, pool, transport))
        self.parked[pool] = transport

    def parked_lost(self, parked: _Parked) -> None:
        if self.parked.get(parked.pool) is parked.transport:
            del self.parked[parked.pool]

    def fail_over(self) -> None:
        """The fallback refused or did not answer the connect: the requests waiting for it go to the upstream."""
        for exchange in self.exchanges:
            exchange.resend = None
            if exchange.route is not None:
                exchange.route = exchange.route.failed_over()
        self.switch_to(SPECULATIVE_POOL)

    def resend_elsewhere(self) -> bool:
        """The fallback closed before answering: its requests (none of whose response has started) go to the
        upstream, which is then used for what follows. False when a response had started (it is cut short)."""
        if not self.exchanges or any(e.first_byte is not None or e.resend is None for e in self.exchanges):
            return False
        self.to_upstream[:0] = [exchange.resend for exchange in self.exchanges if exchange.resend is not None]
        self.resp_stash = b""  # part of a response head, if any: the upstream answers afresh
        self.shared.connect_result("connection closed", FALLBACK_POOL)
        self.fail_over()
        return True

    def needs_pool(self, pool: int) -> bool:
        """Whether the next request must wait for another pool (routing: the current pool still has requests in
        flight, whose responses must come first); else switch to ``pool`` now."""
        if self.shared.router is None or pool == self.pool:
            return False
        if self.exchanges:
            self.blocked = True
            self.pause_client_reading("route")
            return True
        self.switch_to(pool)
        return False

    def unblock(self) -> None:
        """The requests in flight are answered: send the one that waited, and read on."""
        if self.closed or self.exchanges or not self.blocked:
            return
        self.blocked = False
        if self.blocked_send is not None:
            exchange, data, pool = self.blocked_send
            self.blocked_send = None
            self.switch_to(pool)
            self.send_exchange(exchange, data, pool)
        self.resume_client_reading("route")
        self.data_received(b"")  # what the client sent meanwhile, from the stash

    def observe_all(self, failure: str, now: float) -> None:
        finished = list(self.exchanges)
        self.exchanges.clear()
        self.observe(finished, failure, now)

    def observe(self, finished: list[_Exchange], failure: str | None, now: float) -> None:
        for exchange in finished:
            if exchange.request is not None:
                self.shared.observe(exchange.request, exchange.result(failure, now))

    def buffered_bytes(self) -> int:
        total = self.pending_upstream + len(self.req_body) + sum(map(len, self.resp_chunk))
        for exchange in self.exchanges:
            total += len(exchange.body or b"") + (exchange.stream.held_bytes() if exchange.stream else 0)
        for transport in (self.client, self.upstream):
            if transport is not None and not transport.is_closing():
                total += transport.get_write_buffer_size()
        return total

    # ---- flow control -----------------------------------------------------------------------------------------

    def pause_writing(self) -> None:  # the client reads slower than the upstream writes
        if self.upstream is not None and not self.upstream.is_closing():
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and not self.upstream.is_closing():
            self.upstream.resume_reading()

    def pause_client_reading(self, cause: str) -> None:
        if not self.read_pauses and self.client is not None and not self.client.is_closing():
            self.client.pause_reading()
        self.read_pauses.add(cause)

    def resume_client_reading(self, cause: str) -> None:
        self.read_pauses.discard(cause)
        if not self.read_pauses and self.client is not None and not self.client.is_closing():
            self.client.resume_reading()

    # ---- client -> upstream -----------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.req_state == _REQ_TUNNEL:
            self.to_upstream.append(data)
        else:
            if self.req_stash:
                data, self.req_stash = self.req_stash + data, b""
            pos, end = 0, len(data)
            assert self.client is not None
            while pos < end and not self.client.is_closing():  # closing: a 502 went out, the rest is moot
                pos = self.request_step(data, pos)
                if self.blocked:  # routing: the rest waits until the requests in flight are answered
                    self.req_stash = data[pos:]
                    break
        if self.to_upstream:
            self.flush_upstream()

    def request_step(self, data: bytes, pos: int) -> int:
        state = self.req_state
        if state == _REQ_HEAD:
            return self.read_request_head(data, pos)
        if state == _REQ_INSPECT:
            return self.read_inspected_body(data, pos)
        if state == _REQ_LENGTH:
            take = min(self.req_remaining, len(data) - pos)
            self.to_upstream.append(data[pos : pos + take])
            self.req_remaining -= take
            if not self.req_remaining:
                self.request_read()
            return pos + take
        if state == _REQ_CHUNKED:
            end = self.req_decoder.feed(data, pos, None)
            self.to_upstream.append(data[pos:end])
            if self.req_decoder.failed:
                self.req_state = _REQ_TUNNEL
            elif self.req_decoder.done:
                self.request_read()
            return end
        self.to_upstream.append(data[pos:])
        return len(data)

    def read_request_head(self, data: bytes, pos: int) -> int:
        end = data.find(HEAD_END, pos)
        if end < 0:
            if len(data) - pos > MAX_HEAD:
                return pos if self.needs_pool(SPECULATIVE_POOL) else self.tunnel_requests(data, pos)
            self.req_stash = data[pos:]
            return len(data)
        head = parse_head(data[pos : end + 4])
        if head is None or len(head.start) != 3 or not head.start[2].startswith(b"HTTP/1."):
            return pos if self.needs_pool(SPECULATIVE_POOL) else self.tunnel_requests(data, pos)
        method = head.start[0]
        tunnel = method == b"CONNECT" or head.value(b"upgrade") is not None
        endpoint = endpoint_of(head.start[1]) if method == b"POST" and not tunnel else None
        length = head.content_length
        inspect = (
            endpoint is not None
            and length is not None
            and length <= self.shared.max_inspect_body
            and not head.has_token(b"expect", b"100-continue")
        )
        # Routing: only inspected requests can go to the fallback; everything else goes to the upstream.
        if not inspect and self.needs_pool(SPECULATIVE_POOL):
            return pos
        if self.upstream is None and self.connecting is None and not self.exchanges:
            self.start_connect()  # the connect made when the client arrived failed: try again for this request
        exchange = _Exchange(method, time.monotonic())
        self.req_exchange = exchange
        if tunnel:
            exchange.tunnel = True
            self.exchanges.append(exchange)
            self.to_upstream.append(head.raw)
            return self.tunnel_requests(data, end + 4)
        if inspect:
            assert length is not None
            self.req_state, self.req_head, self.req_remaining = _REQ_INSPECT, head, length
            return end + 4 if length else self.read_inspected_body(data, end + 4)
        self.exchanges.append(exchange)
        self.to_upstream.append(head.raw)
        if head.chunked:
            self.req_state, self.req_decoder = _REQ_CHUNKED, ChunkedDecoder()
        elif length:
            self.req_state, self.req_remaining = _REQ_LENGTH, length
        else:
            self.request_read()
        return end + 4

    def tunnel_requests(self, data: bytes, pos: int) -> int:
        self.req_state = _REQ_TUNNEL
        self.to_upstream.append(data[pos:])
        return len(data)

    def read_inspected_body(self, data: bytes, pos: int) -> int:
        need = self.req_remaining - len(self.req_body)
        piece = data[pos : pos + need]
        if len(piece) < need:
            self.req_body += piece
            return len(data)
        body = piece if not self.req_body else bytes(self.req_body) + piece
        self.req_body = bytearray()
        head, exchange = self.req_head, self.req_exchange
        assert head is not None and exchange is not None
        self.req_head = None
        self.send_inspected(head, exchange, body)
        return pos + len(piece)

    def send_inspected(self, head: Head, exchange: _Exchange, body: bytes) -> None:
        endpoint = endpoint_of(head.start[1])
        assert endpoint is not None
        plan = plan_request(endpoint, body)
        raw_head = head.raw
        if plan is not None:
            if plan.body is not body:
                raw_head, body = replace_content_length(raw_head, len(plan.body)), plan.body
            workload = head.value(self.shared.workload_header)
            exchange.single_prompt = plan.single_prompt
            exchange.request = TapRequest(
                method="POST",
                path=head.start[1].split(b"?", 1)[0].decode("latin-1"),
                endpoint=plan.endpoint,
                model=plan.model,
                temperature=plan.temperature,
                stream=plan.stream,
                n=plan.n,
                workload=workload.decode("latin-1") if workload is not None else None,
                usage_injected=plan.usage_injected,
                prompt_chars=plan.prompt_chars,
                prompt_tokens=plan.prompt_tokens,
            )
        pool = SPECULATIVE_POOL
        if self.shared.router is not None and exchange.request is not None:
            exchange.route = self.shared.route(exchange.request)
            if exchange.route is not None and exchange.route.to_fallback:
                pool = FALLBACK_POOL
        if self.needs_pool(pool):
            self.blocked_send = (exchange, raw_head + body, pool)
            return
        self.send_exchange(exchange, raw_head + body, pool)

    def send_exchange(self, exchange: _Exchange, data: bytes, pool: int) -> None:
        if pool == FALLBACK_POOL:
            exchange.resend = data  # until its response starts: if the fallback dies first, the upstream gets it
        self.exchanges.append(exchange)
        self.to_upstream.append(data)
        self.request_read()

    def request_read(self) -> None:
        self.req_state = _REQ_HEAD
        if self.req_exchange is not None:
            self.req_exchange.request_read = True
            self.req_exchange = None
        if self.upstream_failure is not None and self.connecting is None:
            self.fail_if_waiting()

    def flush_upstream(self) -> None:
        data = self.to_upstream[0] if len(self.to_upstream) == 1 else b"".join(self.to_upstream)
        if self.upstream is None and self.connecting is None and self.shared.router is not None and (
                self.upstream_failure is None and not self.closed):
            self.start_connect()  # routing: the pool's connection closed while idle (the fallback's keep-alive)
        if self.upstream is not None:
            self.to_upstream.clear()
            self.pending_upstream = 0
            self.upstream.write(data)
        elif self.connecting is not None:
            # Held until the connection is up; stop reading a client that sends a lot meanwhile.
            self.to_upstream[:] = [data]
            self.pending_upstream = len(data)
            if self.pending_upstream > WRITE_HIGH_WATER:
                self.pause_client_reading("connect")
        else:
            self.to_upstream.clear()  # the upstream is gone; the 502 (or the close) is on its way

    # ---- upstream -> client -----------------------------------------------------------------------------------

    def write_client(self, out: list[bytes]) -> None:
        if not out or self.client is None or self.client.is_closing():
            return
        self.client.write(out[0] if len(out) == 1 else b"".join(out))

    def fast_path(self) -> PlainChunks | SseWatcher | UsageStripper | None:
        """What checks a read for the hot path, when the response is between two chunks of a chunked body."""
        if self.resp_state != _RESP_CHUNKED or self.resp_stash or not self.resp_decoder.at_boundary:
            return None
        exchange = self.exchanges[0]
        if exchange.mode == _PASS:
            return _PLAIN_CHUNKS
        # The first body chunk takes the slow path, which notes when it came (a stream's time per output token).
        return exchange.stream if exchange.mode in (_WATCH, _STRIP) and exchange.first_body is not None else None

    def upstream_data(self, data: bytes) -> None:
        if self.resp_stash:
            data, self.resp_stash = self.resp_stash + data, b""
        out: list[bytes] = []
        finished: list[_Exchange] = []
        pos, end = 0, len(data)
        while pos < end:
            state = self.resp_state
            if state == _RESP_HEAD:
                pos = self.read_response_head(data, pos, out, finished)
            elif state == _RESP_CHUNKED:
                pos = self.read_chunked(data, pos, out, finished)
            elif state == _RESP_LENGTH:
                take = min(self.resp_remaining, end - pos)
                self.body_piece(data[pos : pos + take], out)
                self.resp_remaining -= take
                pos += take
                if not self.resp_remaining:
                    self.end_response(out, finished)
            elif state == _RESP_UNTIL_CLOSE:
                self.body_piece(data[pos:], out)
                pos = end
            else:
                out.append(data[pos:])
                pos = end
        self.write_client(out)
        self.fast = self.fast_path()
        if finished:
            self.observe(finished, None, time.monotonic())

    def read_response_head(self, data: bytes, pos: int, out: list[bytes], finished: list[_Exchange]) -> int:
        end = data.find(HEAD_END, pos)
        if end < 0:
            if len(data) - pos > MAX_HEAD:
                return self.tunnel_responses(data, pos, out)
            self.resp_stash = data[pos:]
            return len(data)
        head = parse_head(data[pos : end + 4])
        status = _status(head)
        if head is None or status is None or not self.exchanges:
            return self.tunnel_responses(data, pos, out)
        exchange = self.exchanges[0]
        if exchange.first_byte is None:
            exchange.first_byte = time.monotonic()
            exchange.resend = None
        if 100 <= status < 200 and status != 101:
            out.append(head.raw)
            return end + 4  # an interim response (100 Continue, 103 Early Hints): the final one follows
        # Routing: the one change to a response, a header that says where the request went.
        out.append(head.raw if exchange.route is None else head.raw[:-2] + exchange.route.header() + b"\r\n")
        if status == 101 or exchange.tunnel:
            self.exchanges.popleft()
            return self.tunnel_responses(data, end + 4, out)
        exchange.status = status
        if exchange.method == b"HEAD" or status in (204, 304):
            self.end_response(out, finished)
        elif head.chunked:
            self.resp_state, self.resp_decoder = _RESP_CHUNKED, ChunkedDecoder()
        elif head.content_length is not None:
            self.resp_state, self.resp_remaining = _RESP_LENGTH, head.content_length
            if not head.content_length:
                self.end_response(out, finished)
        else:
            self.resp_state = _RESP_UNTIL_CLOSE
        if exchange.request is not None and self.resp_state != _RESP_HEAD:
            self.choose_mode(exchange, head)
        return end + 4

    def tunnel_responses(self, data: bytes, pos: int, out: list[bytes]) -> int:
        self.resp_state = _RESP_TUNNEL
        out.append(data[pos:])
        return len(data)

    def choose_mode(self, exchange: _Exchange, head: Head) -> None:
        # An incomplete event is held until its end arrives: cap it, so a stream whose events the tap cannot find
        # (bare-CR line ends) is only held back that far before it is passed on as it comes.
        limit = min(self.shared.max_inspect_body, SSE_HOLD_LIMIT)
        encoding = head.value(b"content-encoding")
        content_type = (head.value(b"content-type") or b"").lower()
        if exchange.status >= 400 or (encoding is not None and encoding.lower() != b"identity"):
            exchange.mode = _PASS
        elif content_type.startswith(b"text/event-stream"):
            assert exchange.request is not None
            if exchange.request.usage_injected and self.resp_state != _RESP_LENGTH:
                exchange.mode, exchange.stream = _STRIP, UsageStripper(limit)
            else:
                exchange.mode, exchange.stream = _WATCH, SseWatcher(limit)
        else:
            exchange.mode, exchange.body = _CAPTURE, bytearray()

    def read_chunked(self, data: bytes, pos: int, out: list[bytes], finished: list[_Exchange]) -> int:
        exchange = self.exchanges[0]
        if exchange.first_body is None:
            exchange.first_body = time.monotonic()
        decoder = self.resp_decoder
        if exchange.mode not in (_STRIP, _REFRAME):
            pieces: list[bytes] | None = [] if exchange.mode != _PASS else None
            end = decoder.feed(data, pos, pieces)
            out.append(data[pos:end])
            for piece in pieces or ():
                if piece:
                    self.body_piece_observed(exchange, piece)
        else:
            pieces = []
            end = decoder.feed(data, pos, pieces)
            if decoder.failed:
                out.append(data[pos:])
            else:
                self.strip_pieces(exchange, pieces, out)
        if decoder.failed:
            self.resp_state = _RESP_TUNNEL
            self.exchanges.popleft()
            finished.append(exchange)
        elif decoder.done:
            self.end_response(out, finished)
        return end

    def strip_pieces(self, exchange: _Exchange, pieces: list[bytes], out: list[bytes]) -> None:
        """Whole chunks go through the stripper and are framed again; a chunk too large to hold is given up on."""
        stripper = exchange.stream
        assert isinstance(stripper, UsageStripper)
        for piece in pieces:
            if exchange.mode == _REFRAME:
                if piece:
                    out.append(frame_chunk(piece))
            elif piece is CHUNK_END:
                payload = b"".join(self.resp_chunk)
                self.resp_chunk.clear()
                kept = stripper.feed(payload)
                if kept:
                    out.append(frame_chunk(kept))
            else:
                self.resp_chunk.append(piece)
                if sum(map(len, self.resp_chunk)) > self.shared.max_inspect_body:
                    rest = stripper.give_up() + b"".join(self.resp_chunk)
                    self.resp_chunk.clear()
                    out.append(frame_chunk(rest))
                    exchange.mode = _REFRAME

    def body_piece(self, piece: bytes, out: list[bytes]) -> None:
        """A piece of a body framed by Content-Length or by the connection's end."""
        exchange = self.exchanges[0]
        if exchange.first_body is None:
            exchange.first_body = time.monotonic()
        if exchange.mode == _STRIP:
            assert isinstance(exchange.stream, UsageStripper)
            out.append(exchange.stream.feed(piece))
            return
        out.append(piece)
        if exchange.mode != _PASS:
            self.body_piece_observed(exchange, piece)

    def body_piece_observed(self, exchange: _Exchange, piece: bytes) -> None:
        if exchange.mode == _CAPTURE:
            self.capture(exchange, piece)
        elif exchange.stream is not None:
            exchange.stream.feed(piece)

    def capture(self, exchange: _Exchange, piece: bytes) -> None:
        body = exchange.body
        assert body is not None
        if exchange.body_too_large:
            return
        if len(body) + len(piece) > self.shared.max_inspect_body:
            exchange.body_too_large = True
            body.clear()
        else:
            body += piece

    def end_response(self, out: list[bytes], finished: list[_Exchange]) -> None:
        exchange = self.exchanges.popleft()
        if exchange.mode == _STRIP:
            assert isinstance(exchange.stream, UsageStripper)
            rest = exchange.stream.finish()
            if rest:
                out.append(frame_chunk(rest) if self.resp_state == _RESP_CHUNKED else rest)
            if self.resp_state == _RESP_CHUNKED:
                # The last chunk: trailers, which uvicorn never sends, are not carried over.
                out.append(_LAST_CHUNK)
        elif exchange.mode == _REFRAME:
            out.append(_LAST_CHUNK)
        self.resp_state = _RESP_HEAD
        finished.append(exchange)
        if self.blocked and not self.exchanges:
            # After this response is written (unblock may write the next request's, and read on).
            asyncio.get_running_loop().call_soon(self.unblock)


def _drop(data: bytes) -> None:
    """Where client bytes go before there is a client transport (never, in practice)."""


def _status(head: Head | None) -> int | None:
    if head is None or len(head.start) < 2 or not head.start[0].startswith(b"HTTP/"):
        return None
    code = head.start[1]
    return int(code) if len(code) == 3 and code.isdigit() else None


def _no_delay(transport: asyncio.Transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
