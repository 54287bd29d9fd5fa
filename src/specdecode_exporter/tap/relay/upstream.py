"""One link's side toward its upstreams: the connection its requests go out on, and routing between the two pools
(which pool carries the next request, idle connections parked for later, fail-over to the upstream when the
fallback refuses a connect or closes before it answers)."""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol, cast

from specdecode_exporter.tap.relay.exchange import Exchange
from specdecode_exporter.tap.relay.pools import FALLBACK_POOL, SPECULATIVE_POOL
from specdecode_exporter.tap.relay.responses import ResponseReader
from specdecode_exporter.tap.relay.shared import WRITE_HIGH_WATER, Shared, tune


class UpstreamOwner(Protocol):
    """What the upstream side asks of its link."""

    def pause_client_reading(self, cause: str) -> None: ...

    def resume_client_reading(self, cause: str) -> None: ...

    def connect_failed(self) -> None:
        """The connect to the upstream failed: a request waiting for it is answered with a 502."""

    def upstream_closed(self) -> None:
        """The upstream closed the connection, and no fail-over carries on: what it was answering ends here."""


class _UpstreamProtocol(asyncio.Protocol):
    __slots__ = ("pool", "responses", "upstreams")

    def __init__(self, upstreams: Upstreams, responses: ResponseReader, pool: int) -> None:
        self.upstreams = upstreams
        self.responses = responses
        self.pool = pool

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.upstreams.made(self, cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        # The hot path: the read is one whole chunk (one SSE event, as uvicorn writes them) that needs no change.
        responses = self.responses
        fast = responses.fast
        if fast is not None and fast.passes(data):
            responses.client_write(data)
        else:
            responses.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.upstreams.lost(self)

    def pause_writing(self) -> None:
        self.upstreams.pause_client("upstream")

    def resume_writing(self) -> None:
        self.upstreams.resume_client("upstream")


class _Parked(asyncio.Protocol):
    """An idle upstream connection of a routing link to the pool it is not using now, kept for its next request
    (the transport's protocol is swapped, so the hot path needs no check of which connection is in use)."""

    __slots__ = ("pool", "transport", "upstreams")

    def __init__(self, upstreams: Upstreams, pool: int, transport: asyncio.Transport) -> None:
        self.upstreams = upstreams
        self.pool = pool
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        """An idle connection has nothing to say; a server closing it may (a 408), which no client awaits."""

    def connection_lost(self, exc: Exception | None) -> None:
        self.upstreams.parked_lost(self.pool, self.transport)


def connect_failure(exc: BaseException | None) -> str:
    if isinstance(exc, TimeoutError):
        return "connect timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return type(exc).__name__


class Upstreams:
    """The upstream connection of one link (opened when the client connects), the bytes waiting for it in
    ``outbox``, and, with routing, which pool it goes to: requests for the other pool wait until those in flight
    are answered (responses go back in order), then the connection is parked and the other pool's one used."""

    def __init__(self, shared: Shared, owner: UpstreamOwner, exchanges: collections.deque[Exchange],
                 responses: ResponseReader) -> None:
        self.outbox: list[bytes] = []  # what goes upstream next; flush() sends it
        self._shared = shared
        self._owner = owner
        self._exchanges = exchanges
        self._responses = responses
        self._pending = 0  # bytes waiting for the upstream connection
        self._transport: asyncio.Transport | None = None
        self._connecting: asyncio.Task[tuple[asyncio.Transport, _UpstreamProtocol]] | None = None
        self._failure: str | None = None
        # Routing: the pool of the transport (or the connect), the protocol of that connection (events of any other
        # are stale), idle connections to the other pool, and a request waiting until the requests in flight on the
        # current pool are answered.
        self._pool = SPECULATIVE_POOL
        self._current: _UpstreamProtocol | None = None
        self._parked: dict[int, asyncio.Transport] = {}
        self._blocked = False
        self._held: tuple[Exchange, bytes, int] | None = None
        self._closed = False

    @property
    def failure(self) -> str | None:
        """Why the last connect failed, until the next one starts."""
        return self._failure

    @property
    def blocked(self) -> bool:
        """A request waits for the requests in flight on the other pool to be answered."""
        return self._blocked

    def failed(self) -> bool:
        """The connect failed and no other is under way."""
        return self._failure is not None and self._connecting is None

    # ---- the connection -----------------------------------------------------------------------------------------

    def connect(self) -> None:
        # No asyncio.wait_for: its extra task would cost a loop iteration on every new connection's first byte.
        loop = asyncio.get_running_loop()
        self._failure = None
        protocol = self._current = _UpstreamProtocol(self, self._responses, self._pool)
        host, port = self._shared.pools[self._pool]
        connecting = loop.create_task(loop.create_connection(lambda: protocol, host, port))
        timer = loop.call_later(self._shared.connect_timeout, connecting.cancel)
        connecting.add_done_callback(lambda task: self._connect_done(task, timer, protocol))
        self._connecting = connecting

    def reconnect_if_down(self) -> None:
        """A request begins: the connect made when the client arrived failed, so try again for it."""
        if self._transport is None and self._connecting is None and not self._exchanges:
            self.connect()

    def made(self, protocol: _UpstreamProtocol, transport: asyncio.Transport) -> None:
        if self._closed or protocol is not self._current:  # closed, or a connect the link no longer waits for
            self._stray_connection(protocol.pool, transport)
            return
        tune(transport)
        self._transport = transport
        if self.outbox:
            self.flush()
        self._owner.resume_client_reading("connect")

    def _connect_done(self, task: asyncio.Task[tuple[asyncio.Transport, _UpstreamProtocol]],
                      timer: asyncio.TimerHandle, protocol: _UpstreamProtocol) -> None:
        timer.cancel()
        if protocol is not self._current:
            return
        self._connecting = None
        if self._closed:
            return
        error = None if task.cancelled() else task.exception()
        if not task.cancelled() and error is None:
            self._shared.health.connect_result(None, self._pool)
            return
        failure = "connect timeout" if task.cancelled() else connect_failure(error)
        self._shared.health.connect_result(failure, self._pool)
        if self._pool == FALLBACK_POOL:
            self._fail_over()
            return
        self._failure = failure
        self._owner.connect_failed()

    def lost(self, protocol: _UpstreamProtocol) -> None:
        if protocol is not self._current:
            return
        self._transport = None
        if self._closed:
            return
        if self._pool == FALLBACK_POOL and (self._resend_elsewhere() or not self._exchanges):
            return  # requests the fallback did not answer went to the upstream; an idle one just closed
        self._owner.upstream_closed()

    def flush(self) -> None:
        outbox = self.outbox
        data = outbox[0] if len(outbox) == 1 else b"".join(outbox)
        if self._transport is None and self._connecting is None and self._shared.router is not None and (
                self._failure is None and not self._closed):
            self.connect()  # routing: the pool's connection closed while idle (the fallback's keep-alive)
        if self._transport is not None:
            outbox.clear()
            self._pending = 0
            self._transport.write(data)
        elif self._connecting is not None:
            # Held until the connection is up; stop reading a client that sends a lot meanwhile.
            outbox[:] = [data]
            self._pending = len(data)
            if self._pending > WRITE_HIGH_WATER:
                self._owner.pause_client_reading("connect")
        else:
            outbox.clear()  # the upstream is gone; the 502 (or the close) is on its way

    def pause_client(self, cause: str) -> None:
        self._owner.pause_client_reading(cause)

    def resume_client(self, cause: str) -> None:
        self._owner.resume_client_reading(cause)

    def pause_reading(self) -> None:  # the client reads slower than the upstream writes
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def buffered_bytes(self) -> int:
        transport = self._transport
        held = transport.get_write_buffer_size() if transport is not None and not transport.is_closing() else 0
        return self._pending + held

    def close(self) -> None:
        """The client is gone: close at once (abort, with a request in flight), so that vLLM stops generating."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._transport is not None:
            if self._exchanges:
                self._transport.abort()
            else:
                self._transport.close()
        for parked in self._parked.values():
            parked.close()

    def abandon_fallback(self) -> None:
        """The fallback stopped answering health checks: close the connection to it if none of its requests has
        an answer started, so that they go to the upstream (``lost``, as when the fallback closes it itself)."""
        if (self._pool == FALLBACK_POOL and self._transport is not None and self._exchanges
                and all(exchange.first_byte is None for exchange in self._exchanges)):
            self._transport.abort()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        for parked in list(self._parked.values()):
            parked.abort()

    # ---- routing: which pool carries the next request ---------------------------------------------------------

    def hold(self, pool: int) -> bool:
        """Whether the next request must wait for another pool (routing: the current pool still has requests in
        flight, whose responses must come first); else switch to ``pool`` now."""
        if self._shared.router is None or pool == self._pool:
            return False
        if self._exchanges:
            self._blocked = True
            self._owner.pause_client_reading("route")
            return True
        self._switch_to(pool)
        return False

    def send(self, exchange: Exchange, data: bytes) -> bool:
        """An inspected request: to the pool the router names (False: held until the requests in flight on the
        other pool are answered)."""
        pool = SPECULATIVE_POOL
        if self._shared.router is not None and exchange.request is not None:
            exchange.route = self._shared.health.route(exchange.request)
            if exchange.route is not None and exchange.route.to_fallback:
                pool = FALLBACK_POOL
        if self.hold(pool):
            self._held = (exchange, data, pool)
            return False
        self._send(exchange, data, pool)
        return True

    def release(self) -> bool:
        """The requests in flight are answered: the held request, if any, is sent (True)."""
        self._blocked = False
        if self._held is None:
            return False
        exchange, data, pool = self._held
        self._held = None
        self._switch_to(pool)
        self._send(exchange, data, pool)
        return True

    def _send(self, exchange: Exchange, data: bytes, pool: int) -> None:
        if pool == FALLBACK_POOL:
            exchange.resend = data  # until its response starts: if the fallback dies first, the upstream gets it
        self._exchanges.append(exchange)
        self.outbox.append(data)

    def _switch_to(self, pool: int) -> None:
        """Carry the next requests on ``pool``'s connection: the current one is parked (kept for later, idle),
        the other pool's parked one reused, or a new one opened. Only between responses."""
        if pool == self._pool:
            return
        if self._transport is not None and not self._transport.is_closing():
            self._transport.set_protocol(_Parked(self, self._pool, self._transport))
            self._transport.resume_reading()  # paused for a slow client, it would not notice its server closing it
            self._parked[self._pool] = self._transport
        # A connect still under way is left to finish; made() closes it, as it is no longer current.
        self._transport, self._connecting, self._current, self._failure = None, None, None, None
        self._responses.close_announced = False  # said on the connection just parked, which ends by itself
        self._pool = pool
        self._owner.resume_client_reading("upstream")  # a pause the parked connection asked for is its own
        transport = self._parked.pop(pool, None)
        if transport is None or transport.is_closing():
            self.connect()
            return
        protocol = self._current = _UpstreamProtocol(self, self._responses, pool)
        transport.set_protocol(protocol)
        transport.resume_reading()
        self._transport = transport
        if self.outbox:
            self.flush()
        self._owner.resume_client_reading("connect")

    def _stray_connection(self, pool: int, transport: asyncio.Transport) -> None:
        """A connection made after the link switched away from its pool: kept for that pool, if it has none."""
        if self._closed or pool == self._pool or pool in self._parked:
            transport.close()
            return
        tune(transport)
        transport.set_protocol(_Parked(self, pool, transport))
        self._parked[pool] = transport

    def parked_lost(self, pool: int, transport: asyncio.Transport) -> None:
        if self._parked.get(pool) is transport:
            del self._parked[pool]

    def _fail_over(self) -> None:
        """The fallback refused or did not answer the connect: the requests waiting for it go to the upstream."""
        for exchange in self._exchanges:
            exchange.resend = None
            if exchange.route is not None:
                exchange.route = exchange.route.failed_over()
        self._switch_to(SPECULATIVE_POOL)

    def _resend_elsewhere(self) -> bool:
        """The fallback closed before answering: its requests (none of whose response has started) go to the
        upstream, which is then used for what follows. False when a response had started (it is cut short)."""
        if not self._exchanges or any(e.first_byte is not None or e.resend is None for e in self._exchanges):
            return False
        self.outbox[:0] = [exchange.resend for exchange in self._exchanges if exchange.resend is not None]
        self._responses.restart()
        self._shared.health.connect_result("connection closed", FALLBACK_POOL)
        self._fail_over()
        return True
