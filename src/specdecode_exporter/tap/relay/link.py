"""One client connection of the tap: the protocol the client talks to, joining its request reader, its response
reader and its upstream side, and reporting each inspected exchange when it ends."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import cast

from specdecode_exporter.tap import model
from specdecode_exporter.tap.relay.exchange import Exchange, bad_gateway
from specdecode_exporter.tap.relay.pools import SPECULATIVE_POOL
from specdecode_exporter.tap.relay.requests import RequestReader
from specdecode_exporter.tap.relay.responses import ResponseReader
from specdecode_exporter.tap.relay.shared import Shared, tune
from specdecode_exporter.tap.relay.upstream import Upstreams


class Link(asyncio.Protocol):
    """One client connection (this protocol) and the upstream connection it owns. Requests and responses share
    ``exchanges``, oldest first: the request reader appends what it forwards, the response reader takes the
    oldest off when its response ends."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._client: asyncio.Transport | None = None
        self._closed = False
        self._read_pauses: set[str] = set()
        self._exchanges: collections.deque[Exchange] = collections.deque()
        self._responses = ResponseReader(self._exchanges, shared.max_inspect_body, self)
        self._upstreams = Upstreams(shared, self, self._exchanges, self._responses)
        self._requests = RequestReader(self._exchanges, self._upstreams.outbox, shared.max_inspect_body,
                                       shared.workload_header, self)

    # ---- the client connection --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._client = transport = cast(asyncio.Transport, transport)
        self._responses.attach(transport)
        tune(transport)
        self._shared.links.add(self)
        self._upstreams.connect()

    def data_received(self, data: bytes) -> None:
        self._requests.feed(data)
        if self._upstreams.outbox:
            self._upstreams.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        """The client is gone: close the upstream at once, so that vLLM aborts what it is generating."""
        self._closed = True
        self._shared.links.discard(self)
        self._upstreams.close()
        self._observe_all(model.CLIENT_DISCONNECTED, time.monotonic())

    def pause_writing(self) -> None:  # the client reads slower than the upstream writes
        self._upstreams.pause_reading()

    def resume_writing(self) -> None:
        self._upstreams.resume_reading()

    def pause_client_reading(self, cause: str) -> None:
        if not self._read_pauses and self._client is not None and not self._client.is_closing():
            self._client.pause_reading()
        self._read_pauses.add(cause)

    def resume_client_reading(self, cause: str) -> None:
        self._read_pauses.discard(cause)
        if not self._read_pauses and self._client is not None and not self._client.is_closing():
            self._client.resume_reading()

    # ---- what the tap asks of a connection ---------------------------------------------------------------------

    def idle(self) -> bool:
        """No request in flight and none half read: closing now loses nothing."""
        return not self._exchanges and self._requests.idle() and not self._upstreams.blocked

    def close_client(self) -> None:
        if self._client is not None and not self._client.is_closing():
            self._client.close()

    def abort(self) -> None:
        if self._client is not None:
            self._client.abort()
        self._upstreams.abort()

    def abandon_fallback(self) -> None:
        self._upstreams.abandon_fallback()

    def buffered_bytes(self) -> int:
        """Bytes the relay holds for this connection: write buffers, bodies and events held back."""
        client = self._client
        total = self._upstreams.buffered_bytes() + self._requests.held_bytes() + self._responses.held_bytes()
        if client is not None and not client.is_closing():
            total += client.get_write_buffer_size()
        return total

    # ---- what the request reader asks -------------------------------------------------------------------------

    def closing(self) -> bool:
        assert self._client is not None
        return self._client.is_closing()

    def held(self) -> bool:
        return self._upstreams.blocked

    def wait_for_upstream(self) -> bool:
        return self._upstreams.hold(SPECULATIVE_POOL)

    def request_begins(self) -> None:
        self._upstreams.reconnect_if_down()

    def send(self, exchange: Exchange, data: bytes) -> bool:
        return self._upstreams.send(exchange, data)

    def request_read(self) -> None:
        if self._upstreams.failed():
            self.connect_failed()

    # ---- what the response reader tells -----------------------------------------------------------------------

    def finished(self, exchanges: list[Exchange], now: float) -> None:
        self._observe(exchanges, None, now)

    def response_ended(self) -> None:
        if self._upstreams.blocked and not self._exchanges:
            # After this response is written (unblock may write the next request's, and read on).
            asyncio.get_running_loop().call_soon(self._unblock)

    def _unblock(self) -> None:
        """The requests in flight are answered: send the one that waited, and read on."""
        if self._closed or self._exchanges or not self._upstreams.blocked:
            return
        if self._upstreams.release():
            self._requests.release()
        self.resume_client_reading("route")
        self.data_received(b"")  # what the client sent meanwhile, from the stash

    # ---- what the upstream side tells -------------------------------------------------------------------------

    def connect_failed(self) -> None:
        """After a failed connect: answer the oldest request with a 502 once it has been read, then close."""
        if not self._exchanges or not self._exchanges[0].request_read or self._closed:
            return
        exchange = self._exchanges[0]
        exchange.status = 502
        failure = self._upstreams.failure
        assert self._client is not None and failure is not None
        self._responses.write([bad_gateway(failure, exchange.method == b"HEAD")])
        self._observe_all(model.UPSTREAM_FAILED, time.monotonic())
        self._client.close()

    def upstream_closed(self) -> None:
        if not self._exchanges and self._requests.unsent() and not self._responses.close_announced:
            # Closed as idle (uvicorn's keep-alive timeout) while the tap was still reading a request none of which
            # it has sent (a head, or an inspected body): a new connection carries it. Any other close ends the
            # client's connection too, as it would end a direct one: after a Connection: close answer, in a
            # tunnel (a request the tap could not read), or with part of a request already sent.
            self._upstreams.connect()
            return
        now = time.monotonic()
        if not self._responses.end_at_close(now) and self._exchanges:
            exchange = self._exchanges[0]
            if exchange.first_byte is None and not exchange.tunnel:
                exchange.status = 502
                self._responses.write([bad_gateway("connection closed", exchange.method == b"HEAD")])
        self._observe_all(model.UPSTREAM_FAILED, now)
        # Mirror the upstream's close (its keep-alive timeout, or Connection: close) on the client side.
        assert self._client is not None
        self._client.close()

    # ---- reports ----------------------------------------------------------------------------------------------

    def _observe_all(self, failure: str, now: float) -> None:
        finished = list(self._exchanges)
        self._exchanges.clear()
        self._observe(finished, failure, now)

    def _observe(self, finished: list[Exchange], failure: str | None, now: float) -> None:
        for exchange in finished:
            if exchange.request is not None:
                self._shared.observe(exchange.request, exchange.result(failure, now))
