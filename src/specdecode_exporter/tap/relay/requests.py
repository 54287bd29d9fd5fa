"""The client -> upstream direction of one link: request heads read, bodies forwarded as they come, the bodies of
completions held until whole (to read them, and to ask for usage), anything not understood tunnelled untouched."""

from __future__ import annotations

import collections
import time
from typing import Protocol

from specdecode_exporter.tap.chunked import ChunkedDecoder
from specdecode_exporter.tap.http1 import (
    HEAD_END,
    MAX_HEAD,
    Head,
    cannot_begin_request,
    parse_head,
    replace_content_length,
)
from specdecode_exporter.tap.model import TapRequest
from specdecode_exporter.tap.openai import endpoint_of, plan_request
from specdecode_exporter.tap.relay.exchange import Exchange

_HEAD, _LENGTH, _CHUNKED, _INSPECT, _TUNNEL = range(5)
_VERSIONS = frozenset((b"HTTP/1.1", b"HTTP/1.0"))


class RequestTarget(Protocol):
    """What the request reader asks of its link."""

    def closing(self) -> bool:
        """The client connection is closing (a 502 went out): the rest of what it sent is moot."""

    def held(self) -> bool:
        """Routing: a request waits for another pool; what the client sends meanwhile is kept, not read."""

    def wait_for_upstream(self) -> bool:
        """Routing: whether a request only the upstream takes must wait (True: the reader stops before it)."""

    def request_begins(self) -> None:
        """A request head was read: it needs an upstream connection (the one opened at connect may have failed)."""

    def send(self, exchange: Exchange, data: bytes) -> bool:
        """An inspected request, read whole: route and send it (True), or hold it until the requests in flight are
        answered (False; the link calls ``release`` once it is sent)."""

    def request_read(self) -> None:
        """A whole request was read (and sent)."""


class RequestReader:
    """Reads the client's requests and puts what goes to the upstream in ``outbox`` (the link flushes it after each
    read); every request it forwards joins ``exchanges``, where the response reader finds it."""

    def __init__(self, exchanges: collections.deque[Exchange], outbox: list[bytes], max_inspect_body: int,
                 workload_header: bytes, target: RequestTarget) -> None:
        self._exchanges = exchanges
        self._outbox = outbox
        self._max_inspect_body = max_inspect_body
        self._workload_header = workload_header
        self._target = target
        self._state = _HEAD
        self._stash = b""
        self._remaining = 0
        self._decoder = ChunkedDecoder()
        self._body = bytearray()
        self._head: Head | None = None
        self._exchange: Exchange | None = None

    def idle(self) -> bool:
        """Between requests: nothing half read."""
        return self._state == _HEAD and not self._stash

    def unsent(self) -> bool:
        """A request is half read and nothing of it has gone to the upstream yet (its head, or its inspected
        body, is still being read)."""
        return self._state == _INSPECT or (self._state == _HEAD and bool(self._stash))

    def held_bytes(self) -> int:
        return len(self._body)

    def feed(self, data: bytes) -> None:
        if self._state == _TUNNEL:
            self._outbox.append(data)
            return
        if self._stash:
            data, self._stash = self._stash + data, b""
        pos, end = 0, len(data)
        target = self._target
        while pos < end and not target.closing():
            pos = self._step(data, pos)
            if target.held():  # routing: the rest waits until the requests in flight are answered
                self._stash = data[pos:]
                break

    def release(self) -> None:
        """The request held for another pool was sent: the next one is read."""
        self._request_read()

    def _step(self, data: bytes, pos: int) -> int:
        state = self._state
        if state == _HEAD:
            return self._read_head(data, pos)
        if state == _INSPECT:
            return self._read_inspected_body(data, pos)
        if state == _LENGTH:
            take = min(self._remaining, len(data) - pos)
            self._outbox.append(data[pos : pos + take])
            self._remaining -= take
            if not self._remaining:
                self._request_read()
            return pos + take
        if state == _CHUNKED:
            end = self._decoder.feed(data, pos, None)
            self._outbox.append(data[pos:end])
            if self._decoder.failed:
                self._state = _TUNNEL
            elif self._decoder.done:
                self._request_read()
            return end
        self._outbox.append(data[pos:])
        return len(data)

    def _read_head(self, data: bytes, pos: int) -> int:
        end = data.find(HEAD_END, pos)
        if end < 0:
            # Not a head the tap will ever read (too long, or not one from its first bytes): the upstream answers
            # it, as it would without the tap; waiting for a CRLF CRLF that may never come would hang the client.
            if len(data) - pos > MAX_HEAD or cannot_begin_request(data, pos):
                return pos if self._target.wait_for_upstream() else self._tunnel(data, pos)
            self._stash = data[pos:]
            return len(data)
        head = parse_head(data[pos : end + 4])
        if head is None or len(head.start) != 3 or head.start[2] not in _VERSIONS:
            return pos if self._target.wait_for_upstream() else self._tunnel(data, pos)
        method = head.start[0]
        tunnel = method == b"CONNECT" or head.value(b"upgrade") is not None
        endpoint = endpoint_of(head.start[1]) if method == b"POST" and not tunnel else None
        length = head.content_length
        inspect = (
            endpoint is not None
            and length is not None
            and length <= self._max_inspect_body
            and not head.has_token(b"expect", b"100-continue")
        )
        # Routing: only inspected requests can go to the fallback; everything else goes to the upstream.
        if not inspect and self._target.wait_for_upstream():
            return pos
        self._target.request_begins()
        exchange = self._exchange = Exchange(method, time.monotonic())
        if tunnel:
            exchange.tunnel = True
            self._exchanges.append(exchange)
            self._outbox.append(head.raw)
            return self._tunnel(data, end + 4)
        if inspect:
            assert length is not None
            self._state, self._head, self._remaining = _INSPECT, head, length
            return end + 4 if length else self._read_inspected_body(data, end + 4)
        self._exchanges.append(exchange)
        self._outbox.append(head.raw)
        if head.chunked:
            self._state, self._decoder = _CHUNKED, ChunkedDecoder()
        elif length:
            self._state, self._remaining = _LENGTH, length
        else:
            self._request_read()
        return end + 4

    def _tunnel(self, data: bytes, pos: int) -> int:
        self._state = _TUNNEL
        self._outbox.append(data[pos:])
        return len(data)

    def _read_inspected_body(self, data: bytes, pos: int) -> int:
        need = self._remaining - len(self._body)
        piece = data[pos : pos + need]
        if len(piece) < need:
            self._body += piece
            return len(data)
        body = piece if not self._body else bytes(self._body) + piece
        self._body = bytearray()
        head, exchange = self._head, self._exchange
        assert head is not None and exchange is not None
        self._head = None
        if self._target.send(exchange, self._inspected(head, exchange, body)):
            self._request_read()
        return pos + len(piece)

    def _inspected(self, head: Head, exchange: Exchange, body: bytes) -> bytes:
        """The request as it goes to the upstream (usage asked for, when the client did not); ``exchange.request``
        is what the tap read of it, when it could."""
        endpoint = endpoint_of(head.start[1])
        assert endpoint is not None
        plan = plan_request(endpoint, body)
        raw_head = head.raw
        if plan is None:
            return raw_head + body
        if plan.body is not body:
            raw_head, body = replace_content_length(raw_head, len(plan.body)), plan.body
        workload = head.value(self._workload_header)
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
            spec_details_requested=plan.spec_details_requested,
        )
        return raw_head + body

    def _request_read(self) -> None:
        self._state = _HEAD
        if self._exchange is not None:
            self._exchange.request_read = True
            self._exchange = None
        self._target.request_read()
