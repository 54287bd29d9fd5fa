"""A fake vLLM OpenAI server for the tap tests: raw asyncio, its own minimal HTTP/1.1 (independent of the tap's).

Streams are built from the real vLLM 0.32.0 captures in tests/fixtures/vllm_0.32.0/ and shaped the way vLLM's
serving code shapes them (completion/serving.py, chat_completion/serving.py): each SSE event is one chunk and one
write; without `stream_options.include_usage` the terminal chunk carries `system_fingerprint`; with it, the
fingerprint and `metrics` ride on a final `"choices":[]` usage event instead; `metrics` is absent when n > 1.

Request body extras steer it (vLLM accepts unknown keys): `max_tokens` (content events), `fake_interval` (s between
events), `fake_framing` ("event" | "coalesced" | "split"), `fake_status` (an error status), `fake_metrics`
(false: per-request metrics off), `fake_pad` (bytes of extra text per event), `fake_engine` ("llamacpp"; "sglang":
SGLang's shapes from tests/fixtures/sglang_openai/, its `sglext` only when the request set return_spec_tokens_details),
`fake_json` ("spaced": JSON written with Python's json.dumps defaults, `"choices": []`, as FastChat-style servers
write it), `fake_fixture` (a capture's body instead: a .json verbatim; a .sse verbatim when usage was asked, else
as vLLM would have sent it without usage), `fake_raw_body` (this text as a 200 application/json body),
`fake_abort_after` (drop the connection after this many events; 0: before the response head).
Anything that is not a JSON completion request is echoed back: the body is the raw request, head and body.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm_0.32.0"
SGLANG_FIXTURES = FIXTURES.parent / "sglang_openai"
FINGERPRINT = "vllm-0.32.0-03d32f27"
COMPLETION_ID = "cmpl-8c79809def3acc5c"
CHAT_ID = "chatcmpl-ae5d45ad6fc1da36"


def fixture_events(name: str) -> list[bytes]:
    """The events of a captured SSE body, each with its blank-line terminator."""
    body = (FIXTURES / name).read_bytes()
    return [part + b"\n\n" for part in body.split(b"\n\n") if part]


def normalise_ids(event: bytes, stream_id: str, created: int) -> bytes:
    event = re.sub(rb'"id":"(chat)?cmpl-[0-9a-f]+"', b'"id":"' + stream_id.encode() + b'"', event)
    return re.sub(rb'"created":\d+', b'"created":%d' % created, event)


def _real_stream(chat: bool) -> tuple[list[bytes], list[bytes], bytes, bytes]:
    """(opening events, content events, terminal event without fingerprint, usage event) of a real capture."""
    events = fixture_events("chat_stream_usage.sse" if chat else "completion_stream_usage.sse")
    assert events[-1] == b"data: [DONE]\n\n"
    opening = 1 if chat else 0  # chat opens with a role-only delta
    return events[:opening], events[opening:-3], events[-3], events[-2]


@dataclass
class Exchange:
    """What the fake saw of one request."""

    raw: bytes  # head and body exactly as received
    path: str
    body: dict[str, Any] | None
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    paused: bool = False  # its connection's writes were paused (the reader applied backpressure)
    events_sent: int = 0


class FakeVllm:
    def __init__(self, idle_timeout: float | None = None, max_idle_closes: int | None = None) -> None:
        self.idle_timeout = idle_timeout  # close connections idle this long, as uvicorn's timeout_keep_alive does
        self.max_idle_closes = max_idle_closes  # … but at most this many (None: any)
        self.dying = False  # drop every connection when a request has arrived on it, answering nothing
        self.exchanges: list[Exchange] = []
        self.connections = 0
        self.idle_closes = 0  # connections it closed for idling
        self.idle_closed = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> FakeVllm:
        self.server = await asyncio.get_running_loop().create_server(lambda: _Conn(self), "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    async def wait_idle_closes(self, count: int) -> None:
        while self.idle_closes < count:
            self.idle_closed.clear()
            await self.idle_closed.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


class _Conn(asyncio.Protocol):
    def __init__(self, fake: FakeVllm) -> None:
        self.fake = fake
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed = asyncio.Event()
        self.current: Exchange | None = None
        self.busy = False
        self.continued = False  # 100 Continue sent for the request being read
        self.idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=64 * 1024)
        self.fake.connections += 1
        self.start_idle_timer()

    def start_idle_timer(self) -> None:
        limit = self.fake.max_idle_closes
        if limit is not None and self.fake.idle_closes >= limit:
            return
        if self.fake.idle_timeout is not None and self.transport is not None:
            self.idle_timer = asyncio.get_running_loop().call_later(self.fake.idle_timeout, self.close_idle)

    def close_idle(self) -> None:
        limit = self.fake.max_idle_closes
        if limit is not None and self.fake.idle_closes >= limit:
            return
        assert self.transport is not None
        self.transport.close()
        self.fake.idle_closes += 1
        self.fake.idle_closed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.closed.set()
        self.writable.set()
        if self.current is not None:
            self.current.disconnected.set()

    def pause_writing(self) -> None:
        self.writable.clear()
        if self.current is not None:
            self.current.paused = True

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.buffer += data
        if not self.busy:
            self.next_request()

    def next_request(self) -> None:
        request = _take_request(self.buffer, self)
        if request is None:
            return
        raw, head, body, rest = request
        self.buffer = rest
        self.busy = True
        asyncio.get_running_loop().create_task(self.respond(raw, head, body))

    async def respond(self, raw: bytes, head: list[bytes], body: bytes) -> None:
        method, target = head[0].split(b" ")[:2]
        path = target.decode()
        parsed = _json(body)
        exchange = Exchange(raw, path, parsed)
        self.fake.exchanges.append(exchange)
        self.current = exchange
        if self.fake.dying:
            assert self.transport is not None
            self.transport.abort()
            return
        close = any(line.lower() == b"connection: close" for line in head)
        if path.startswith("/v1/upgrade"):
            self.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: echo\r\nconnection: Upgrade\r\n\r\n")
            self.busy = True  # from here the connection echoes bytes (see data_received of _Echo)
            assert self.transport is not None
            self.transport.set_protocol(_Echo(self.transport, self.buffer))
            return
        if method == b"POST" and path in ("/v1/completions", "/v1/chat/completions") and parsed is not None:
            await self.completion(exchange, parsed, chat=path.endswith("chat/completions"), close=close)
        elif method == b"GET" and path == "/v1/models":
            self.write_json(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]}, close)
        else:
            status = 400 if method == b"POST" and path.startswith("/v1/") else 200
            self.write(_head(status, b"application/octet-stream", len(raw), close) + raw)
        self.current = None
        self.busy = False
        if close:
            assert self.transport is not None
            self.transport.close()
        elif self.buffer:
            self.next_request()
        else:
            self.start_idle_timer()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def write_json(self, status: int, value: object, close: bool) -> None:
        body = json.dumps(value, separators=(",", ":")).encode()
        self.write(_head(status, b"application/json", len(body), close) + body)

    async def completion(self, exchange: Exchange, request: dict[str, Any], *, chat: bool, close: bool) -> None:
        status = request.get("fake_status")
        abort_after = request.get("fake_abort_after")
        if abort_after == 0:
            assert self.transport is not None
            self.transport.abort()
            return
        fixture = request.get("fake_fixture")
        if isinstance(fixture, str) and fixture.endswith(".json"):
            text = (FIXTURES / fixture).read_bytes()
            self.write(_head(200, b"application/json", len(text), close) + text)
            return
        if isinstance(request.get("fake_raw_body"), str):
            text = request["fake_raw_body"].encode()
            self.write(_head(200, b"application/json", len(text), close) + text)
            return
        if isinstance(status, int):
            error = {"error": {"message": "fake error", "type": "BadRequestError", "param": None, "code": status}}
            self.write_json(status, error, close)
            return
        if request.get("stream") is not True:
            if request.get("fake_json") == "spaced":
                text = json.dumps(_full_response(request, chat)).encode()
                self.write(_head(200, b"application/json", len(text), close) + text)
                return
            self.write_json(200, _full_response(request, chat), close)
            return
        self.write(_head(200, b"text/event-stream; charset=utf-8", None, close))
        events = stream_events(request, chat)
        interval = float(request.get("fake_interval", 0))
        framing = request.get("fake_framing", "event")
        if framing == "coalesced":
            # The last events in one chunk, as a server that buffers would send them.
            events = [*events[:-3], b"".join(events[-3:])]
        for index, event in enumerate(events):
            if exchange.disconnected.is_set():
                return
            await self.writable.wait()
            if framing == "split":
                half = len(event) // 2
                self.write(b"%x\r\n%b\r\n" % (half, event[:half]))
                await asyncio.sleep(0.002)
                event = event[half:]
            self.write(b"%x\r\n%b\r\n" % (len(event), event))
            exchange.events_sent = index + 1
            if exchange.events_sent == abort_after:
                assert self.transport is not None
                self.transport.abort()
                return
            if interval:
                await asyncio.sleep(interval)
            elif index % 64 == 63:
                await asyncio.sleep(0)
        self.write(b"0\r\n\r\n")


class _Echo(asyncio.Protocol):
    def __init__(self, transport: asyncio.Transport, pending: bytes) -> None:
        self.transport = transport
        if pending:
            transport.write(pending)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


def _head(status: int, content_type: bytes, length: int | None, close: bool) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error"}.get(status, b"X")
    lines = [b"HTTP/1.1 %d %b" % (status, reason), b"server: fake-vllm", b"content-type: " + content_type]
    lines.append(b"content-length: %d" % length if length is not None else b"transfer-encoding: chunked")
    if close:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _json(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _take_request(buffer: bytes, conn: _Conn) -> tuple[bytes, list[bytes], bytes, bytes] | None:
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffer[:end].split(b"\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in head[1:])}
    start = end + 4
    if fields.get(b"expect", b"").lower() == b"100-continue" and not conn.continued:
        conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        conn.continued = True
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        body, stop = _dechunk(buffer, start)
        if stop < 0:
            return None
    else:
        length = int(fields.get(b"content-length", b"0"))
        if len(buffer) < start + length:
            return None
        body, stop = buffer[start : start + length], start + length
    conn.continued = False
    return buffer[:stop], head, body, buffer[stop:]


def _dechunk(buffer: bytes, pos: int) -> tuple[bytes, int]:
    parts: list[bytes] = []
    while True:
        eol = buffer.find(b"\r\n", pos)
        if eol < 0:
            return b"", -1
        size = int(buffer[pos:eol].split(b";")[0], 16)
        if size == 0:
            end = buffer.find(b"\r\n\r\n", eol)
            return (b"".join(parts), end + 4) if end >= 0 else (b"", -1)
        if len(buffer) < eol + 2 + size + 2:
            return b"", -1
        parts.append(buffer[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2


# ---- response bodies, shaped like vLLM 0.32's ----------------------------------------------------------------


def without_usage(events: list[bytes]) -> list[bytes]:
    """A captured stream that asked for usage, as vLLM sends it without: the usage event gone, its fingerprint back
    on the terminal event (completion/serving.py stamps the terminal chunk only when no usage chunk follows)."""
    terminal, usage_event = events[-3], events[-2]
    fingerprint = json.loads(usage_event[len(b"data: ") :])["system_fingerprint"]
    member = b',"system_fingerprint":' + json.dumps(fingerprint).encode()
    stamped = terminal[: terminal.rindex(b"}")] + member + b"}\n\n"
    return [*events[:-3], stamped, events[-1]]


def stream_events(request: dict[str, Any], chat: bool) -> list[bytes]:
    """The SSE events vLLM would send for this streamed request (the [DONE] event included)."""
    events = _stream_events(request, chat)
    return [respell(e) for e in events] if request.get("fake_json") == "spaced" else events


def respell(event: bytes) -> bytes:
    """A `data: {...}` event as json.dumps writes it by default (", " and ": " separators)."""
    if not event.startswith(b"data: {"):
        return event
    return b"data: " + json.dumps(json.loads(event[len(b"data: ") :])).encode() + b"\n\n"


def sglang_events(request: dict[str, Any], chat: bool) -> list[bytes]:
    """SGLang's stream for this request (tests/fixtures/sglang_openai/README.md): the sglext event only when the
    request set return_spec_tokens_details (and speculation is on: fake_metrics), the usage event only with
    include_usage; nothing else changes."""
    body = (SGLANG_FIXTURES / ("chat_stream_usage.sse" if chat else "completion_stream_usage.sse")).read_bytes()
    events = [part + b"\n\n" for part in body.split(b"\n\n") if part]
    details = request.get("return_spec_tokens_details") is True and request.get("fake_metrics") is not False
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    return [e for e in events if (details or b'"sglext"' not in e)
            and (include_usage or not e.startswith(b'data: {') or b'"usage":{' not in e)]


def _stream_events(request: dict[str, Any], chat: bool) -> list[bytes]:
    fixture = request.get("fake_fixture")
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    if request.get("fake_engine") == "sglang":
        return sglang_events(request, chat)
    if isinstance(fixture, str):
        events = fixture_events(fixture)
        return events if include_usage else without_usage(events)
    opening, content, terminal, usage_event = _real_stream(chat)
    n = int(request.get("n") or 1)
    options = request.get("stream_options") or {}
    include_usage = bool(options.get("include_usage"))
    tokens = int(request.get("max_tokens", 5))
    pad = int(request.get("fake_pad", 0))
    body = [_for_choice(event, choice) for event in opening for choice in range(n)]
    for index in range(tokens):
        event = content[index % len(content)]
        if pad:
            event = event.replace(b'"text":"', b'"text":"' + b"x" * pad, 1).replace(
                b'"content":"', b'"content":"' + b"x" * pad, 1
            )
        body.extend(_for_choice(event, choice) for choice in range(n))
    for choice in range(n):
        last = _for_choice(terminal, choice)
        if not include_usage:
            last = last[: last.rindex(b"}")] + b',"system_fingerprint":"' + FINGERPRINT.encode() + b'"}\n\n'
        body.append(last)
    if request.get("fake_engine") == "llamacpp":
        return _llamacpp_tail(body, include_usage, usage_event)
    if include_usage:
        if n > 1 or request.get("fake_metrics") is False:
            usage_event = re.sub(rb',"metrics":\{.*\}\}\n\n$', b"}\n\n", usage_event)
        body.append(usage_event)
    body.append(b"data: [DONE]\n\n")
    return body


def _llamacpp_tail(body: list[bytes], include_usage: bool, usage_event: bytes) -> list[bytes]:
    # llama.cpp (tools/server/server-task.cpp) appends `timings` to the last event: the usage event when usage
    # was asked for, else the terminal event; its terminal event has the fingerprint either way.
    timings = b',"timings":{"prompt_n":31,"predicted_n":40,"draft_n":33,"draft_n_accepted":25}'
    terminal = body[-1]
    if include_usage:
        usage = re.sub(rb',"metrics":\{.*\}\}\n\n$', b"}\n\n", usage_event)
        body.append(usage[: usage.rindex(b"}")] + timings + b"}\n\n")
    else:
        body[-1] = terminal[: terminal.rindex(b"}")] + timings + b"}\n\n"
    body.append(b"data: [DONE]\n\n")
    return body


def _for_choice(event: bytes, choice: int) -> bytes:
    return event if choice == 0 else event.replace(b'"index":0', b'"index":%d' % choice, 1)


def _full_response(request: dict[str, Any], chat: bool) -> dict[str, Any]:
    name = "chat_nonstream.json" if chat else "completion_nonstream.json"
    if request.get("fake_engine") == "sglang":
        sglang: dict[str, Any] = json.loads((SGLANG_FIXTURES / name).read_bytes())
        if request.get("return_spec_tokens_details") is not True or request.get("fake_metrics") is False:
            del sglang["sglext"]  # SGLang's serializer drops a null sglext
        return sglang
    if int(request.get("n") or 1) > 1:
        name = "completion_n2.json"
    response: dict[str, Any] = json.loads((FIXTURES / name).read_bytes())
    if request.get("fake_metrics") is False:
        response["metrics"] = None
    if request.get("fake_engine") == "llamacpp":
        response.pop("metrics", None)
        response["timings"] = {"prompt_n": 31, "predicted_n": 40, "draft_n": 33, "draft_n_accepted": 25}
    return response
