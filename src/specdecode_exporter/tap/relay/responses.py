"""The upstream -> client direction of one link: response heads read, bodies framed, the inspected ones watched,
captured or stripped of the usage event the tap asked for, everything else relayed untouched."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Protocol

from specdecode_exporter.tap.chunked import CHUNK_END, ChunkedDecoder
from specdecode_exporter.tap.http1 import (
    HEAD_END,
    MAX_HEAD,
    Head,
    PlainChunks,
    frame_chunk,
    parse_head,
)
from specdecode_exporter.tap.relay.exchange import CAPTURE, PASS, REFRAME, STRIP, WATCH, Exchange
from specdecode_exporter.tap.sse import SseWatcher, UsageStripper

SSE_HOLD_LIMIT = 256 * 1024  # the most of an unfinished SSE event the tap holds back
_LAST_CHUNK = b"0\r\n\r\n"
_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _TUNNEL = range(5)
_PLAIN_CHUNKS = PlainChunks()


class ResponseEnds(Protocol):
    """What the response reader tells its link."""

    def finished(self, exchanges: list[Exchange], now: float) -> None:
        """These exchanges' responses ended (or their framing broke): report them."""

    def response_ended(self) -> None:
        """A response came to its end (the next one may be a request held back for another pool)."""

    def abandon_fallback(self) -> None:
        """Drop the connection to the fallback if none of its requests has an answer started, so that they go to the
        upstream as when the fallback closes unanswered (it answered with bytes that are not an HTTP response)."""


def _drop(data: bytes) -> None:
    """Where upstream bytes go before there is a client transport (never, in practice)."""


class ResponseReader:
    """Reads the responses to ``exchanges`` (oldest first) as the upstream sends them, and writes them to the client.

    The hot path is outside: for a read that is one whole chunk the stream's checker (``fast``) passes, the
    upstream's protocol writes it with ``client_write`` and never calls ``feed``."""

    def __init__(self, exchanges: collections.deque[Exchange], max_inspect_body: int, ends: ResponseEnds) -> None:
        self.fast: PlainChunks | SseWatcher | UsageStripper | None = None  # see _fast_path()
        self.client_write: Callable[[bytes], None] = _drop
        self._client: asyncio.Transport | None = None
        self._exchanges = exchanges
        self._max_inspect_body = max_inspect_body
        self._ends = ends
        self._state = _HEAD
        self._stash = b""
        self._remaining = 0
        self._decoder = ChunkedDecoder()
        self._chunk: list[bytes] = []  # pieces of a chunk being assembled (STRIP only)
        # The last final response head said Connection: close: the upstream ends the connection after it.
        self.close_announced = False

    def attach(self, client: asyncio.Transport) -> None:
        self._client = client
        self.client_write = client.write

    def restart(self) -> None:
        """The requests in flight are sent again elsewhere: part of a response head, if any, is dropped (the new
        upstream answers afresh)."""
        self._stash = b""

    def held_bytes(self) -> int:
        return sum(map(len, self._chunk)) + sum(exchange.held_bytes() for exchange in self._exchanges)

    def write(self, out: list[bytes]) -> None:
        if not out or self._client is None or self._client.is_closing():
            return
        self._client.write(out[0] if len(out) == 1 else b"".join(out))

    def end_at_close(self, now: float) -> bool:
        """The upstream closed: a response framed by the connection's end ends here (True); else False."""
        if not self._exchanges or self._state != _UNTIL_CLOSE:
            return False
        out: list[bytes] = []
        finished: list[Exchange] = []
        self._end_response(out, finished)
        self.write(out)
        self._ends.finished(finished, now)
        return True

    def feed(self, data: bytes) -> None:
        if self._stash:
            data, self._stash = self._stash + data, b""
        out: list[bytes] = []
        finished: list[Exchange] = []
        pos, end = 0, len(data)
        while pos < end:
            state = self._state
            if state == _HEAD:
                pos = self._read_head(data, pos, out, finished)
            elif state == _CHUNKED:
                pos = self._read_chunked(data, pos, out, finished)
            elif state == _LENGTH:
                take = min(self._remaining, end - pos)
                self._body_piece(data[pos : pos + take], out)
                self._remaining -= take
                pos += take
                if not self._remaining:
                    self._end_response(out, finished)
            elif state == _UNTIL_CLOSE:
                self._body_piece(data[pos:], out)
                pos = end
            else:
                out.append(data[pos:])
                pos = end
        self.write(out)
        self.fast = self._fast_path()
        if finished:
            self._ends.finished(finished, time.monotonic())

    def _fast_path(self) -> PlainChunks | SseWatcher | UsageStripper | None:
        """What checks a read for the hot path, when the response is between two chunks of a chunked body."""
        if self._state != _CHUNKED or self._stash or not self._decoder.at_boundary:
            return None
        exchange = self._exchanges[0]
        if exchange.mode == PASS:
            return _PLAIN_CHUNKS
        # The first body chunk takes the slow path, which notes when it came (a stream's time per output token).
        return exchange.stream if exchange.mode in (WATCH, STRIP) and exchange.first_body is not None else None

    def _read_head(self, data: bytes, pos: int, out: list[bytes], finished: list[Exchange]) -> int:
        end = data.find(HEAD_END, pos)
        if end < 0:
            if len(data) - pos > MAX_HEAD:
                return self._tunnel(data, pos, out)
            self._stash = data[pos:]
            return len(data)
        head = parse_head(data[pos : end + 4])
        status = _status(head)
        if head is None or status is None or not self._exchanges:
            oldest = self._exchanges[0] if self._exchanges else None
            if oldest is not None and oldest.resend is not None and oldest.first_byte is None:
                self._ends.abandon_fallback()  # sent to the fallback, and nothing of it shown to the client yet
                return len(data)
            return self._tunnel(data, pos, out)
        exchange = self._exchanges[0]
        if exchange.first_byte is None:
            exchange.first_byte = time.monotonic()
            exchange.resend = None
        if 100 <= status < 200 and status != 101:
            out.append(head.raw)
            return end + 4  # an interim response (100 Continue, 103 Early Hints): the final one follows
        # Routing: the one change to a response, a header that says where the request went.
        out.append(head.raw if exchange.route is None else head.raw[:-2] + exchange.route.header() + b"\r\n")
        if status == 101 or exchange.tunnel:
            self._exchanges.popleft()
            return self._tunnel(data, end + 4, out)
        exchange.status = status
        self.close_announced = b"connection" in head.fields and head.has_token(b"connection", b"close")
        if exchange.method == b"HEAD" or status in (204, 304):
            self._end_response(out, finished)
        elif head.chunked:
            self._state, self._decoder = _CHUNKED, ChunkedDecoder()
        elif head.content_length is not None:
            self._state, self._remaining = _LENGTH, head.content_length
            if not head.content_length:
                self._end_response(out, finished)
        else:
            self._state = _UNTIL_CLOSE
        if exchange.request is not None and self._state != _HEAD:
            self._choose_mode(exchange, head)
        return end + 4

    def _tunnel(self, data: bytes, pos: int, out: list[bytes]) -> int:
        self._state = _TUNNEL
        out.append(data[pos:])
        return len(data)

    def _choose_mode(self, exchange: Exchange, head: Head) -> None:
        # An incomplete event is held until its end arrives: cap it, so a stream whose events the tap cannot find
        # (bare-CR line ends) is only held back that far before it is passed on as it comes.
        limit = min(self._max_inspect_body, SSE_HOLD_LIMIT)
        encoding = head.value(b"content-encoding")
        content_type = (head.value(b"content-type") or b"").lower()
        if exchange.status >= 400 or (encoding is not None and encoding.lower() != b"identity"):
            exchange.mode = PASS
        elif content_type.startswith(b"text/event-stream"):
            assert exchange.request is not None
            if exchange.request.usage_injected and self._state != _LENGTH:
                exchange.mode, exchange.stream = STRIP, UsageStripper(limit)
            else:
                exchange.mode, exchange.stream = WATCH, SseWatcher(limit)
        else:
            exchange.mode, exchange.body = CAPTURE, bytearray()

    def _read_chunked(self, data: bytes, pos: int, out: list[bytes], finished: list[Exchange]) -> int:
        exchange = self._exchanges[0]
        if exchange.first_body is None:
            exchange.first_body = time.monotonic()
        decoder = self._decoder
        if exchange.mode not in (STRIP, REFRAME):
            pieces: list[bytes] | None = [] if exchange.mode != PASS else None
            end = decoder.feed(data, pos, pieces)
            out.append(data[pos:end])
            for piece in pieces or ():
                if piece:
                    self._observed_piece(exchange, piece)
        else:
            pieces = []
            end = decoder.feed(data, pos, pieces)
            if decoder.failed:
                out.append(data[pos:])
            else:
                self._strip_pieces(exchange, pieces, out)
        if decoder.failed:
            self._state = _TUNNEL
            self._exchanges.popleft()
            finished.append(exchange)
        elif decoder.done:
            self._end_response(out, finished)
        return end

    def _strip_pieces(self, exchange: Exchange, pieces: list[bytes], out: list[bytes]) -> None:
        """Whole chunks go through the stripper and are framed again; a chunk too large to hold is given up on."""
        stripper = exchange.stream
        assert isinstance(stripper, UsageStripper)
        for piece in pieces:
            if exchange.mode == REFRAME:
                if piece:
                    out.append(frame_chunk(piece))
            elif piece is CHUNK_END:
                payload = b"".join(self._chunk)
                self._chunk.clear()
                kept = stripper.feed(payload)
                if kept:
                    if stripper.released:  # a held event let go before this chunk's events: in a chunk of its own
                        cut, stripper.released = stripper.released, 0
                        out.append(frame_chunk(kept[:cut]))
                        kept = kept[cut:]
                    out.append(frame_chunk(kept))
            else:
                self._chunk.append(piece)
                if sum(map(len, self._chunk)) > self._max_inspect_body:
                    rest = stripper.give_up() + b"".join(self._chunk)
                    self._chunk.clear()
                    out.append(frame_chunk(rest))
                    exchange.mode = REFRAME

    def _body_piece(self, piece: bytes, out: list[bytes]) -> None:
        """A piece of a body framed by Content-Length or by the connection's end."""
        exchange = self._exchanges[0]
        if exchange.first_body is None:
            exchange.first_body = time.monotonic()
        if exchange.mode == STRIP:
            assert isinstance(exchange.stream, UsageStripper)
            out.append(exchange.stream.feed(piece))
            return
        out.append(piece)
        if exchange.mode != PASS:
            self._observed_piece(exchange, piece)

    def _observed_piece(self, exchange: Exchange, piece: bytes) -> None:
        if exchange.mode == CAPTURE:
            self._capture(exchange, piece)
        elif exchange.stream is not None:
            exchange.stream.feed(piece)

    def _capture(self, exchange: Exchange, piece: bytes) -> None:
        body = exchange.body
        assert body is not None
        if exchange.body_too_large:
            return
        if len(body) + len(piece) > self._max_inspect_body:
            exchange.body_too_large = True
            body.clear()
        else:
            body += piece

    def _end_response(self, out: list[bytes], finished: list[Exchange]) -> None:
        exchange = self._exchanges.popleft()
        if exchange.mode == STRIP:
            assert isinstance(exchange.stream, UsageStripper)
            rest = exchange.stream.finish()
            if rest:
                out.append(frame_chunk(rest) if self._state == _CHUNKED else rest)
            if self._state == _CHUNKED:
                # The last chunk: trailers, which uvicorn never sends, are not carried over.
                out.append(_LAST_CHUNK)
        elif exchange.mode == REFRAME:
            out.append(_LAST_CHUNK)
        self._state = _HEAD
        finished.append(exchange)
        self._ends.response_ended()


def _status(head: Head | None) -> int | None:
    if head is None or len(head.start) < 2 or not head.start[0].startswith(b"HTTP/"):
        return None
    code = head.start[1]
    return int(code) if len(code) == 3 and code.isdigit() else None
