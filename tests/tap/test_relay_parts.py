"""The tap's pure parts: HTTP heads, the chunked decoder, the usage-event stripper, the request rewrite."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specdecode_exporter.tap.chunked import CHUNK_END, ChunkedDecoder
from specdecode_exporter.tap.http1 import (
    CHUNK_TAIL,
    EVENT_CHUNK_TAIL,
    cannot_begin_request,
    frame_chunk,
    parse_head,
    replace_content_length,
    whole_chunks,
)
from specdecode_exporter.tap.openai import plan_request, read_response_body
from specdecode_exporter.tap.sse import SseWatcher, UsageStripper
from tests.tap.fake_vllm import COMPLETION_ID, fixture_events, normalise_ids, respell, stream_events

# ---- heads ---------------------------------------------------------------------------------------------------


def test_head_fields_and_framing() -> None:
    head = parse_head(b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-Workload: chat\r\n\r\n")
    assert head is not None
    assert head.start == [b"POST", b"/v1/completions?x=1", b"HTTP/1.1"]
    assert head.content_length == 12 and not head.chunked
    assert head.value(b"x-workload") == b"chat"


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\r\n folded: yes\r\n\r\n",  # obs-fold
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",  # conflicting lengths
        b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",  # no chunked: framing unknown
        b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
        b"GARBAGE\r\n\r\n",
        b"POST / HTTP/1.1\nContent-Length: 2\r\n\r\n",  # a bare LF: h11 reads a Content-Length here
        b"GET / HTTP/1.1\r\nX-A: a\nContent-Length: 2\r\n\r\n",
    ],
)
def test_heads_the_relay_does_not_parse(raw: bytes) -> None:
    assert parse_head(raw) is None


@pytest.mark.parametrize(
    ("start", "cannot"),
    [
        (b"G", False),
        (b"POST", False),
        (b"POST /v1/completions HTTP/1.1\r", False),  # its LF is on its way
        (b"POST /v1/completions HTTP/1.1\r\nhost: a\r\n", False),
        (b"\x16\x03\x01\x00\xf4\x01", True),  # a TLS ClientHello
        (b"\r\nGET / HTTP/1.1\r\n", True),  # a leading empty line: parse_head would not read it either
        (b"GET\t/ HTTP/1.1\r\n", True),
        (b"GET / HTTP/1.1\nHost: a\n\n", True),  # bare LF line ends: the whole head, for a server reading them
        (b"GET / HTTP/1.1\r\nHost: a\n\r\n", True),
        (b"GET / HTTP/1.1\rHost: a\r", True),  # bare CR
    ],
)
def test_what_cannot_begin_a_request(start: bytes, cannot: bool) -> None:
    assert cannot_begin_request(start, 0) is cannot
    assert cannot_begin_request(b"GET / HTTP/1.1\r\n\r\n" + start, 18) is cannot  # after a whole request


def test_content_length_replaced_in_place() -> None:
    raw = b"POST /v1/completions HTTP/1.1\r\nHost: a\r\ncontent-LENGTH:  12 \r\nX-A: b\r\n\r\n"
    assert replace_content_length(raw, 345) == raw.replace(b"  12 ", b"  345 ")


def test_connection_tokens() -> None:
    head = parse_head(b"GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nExpect: 100-Continue\r\n\r\n")
    assert head is not None
    assert head.has_token(b"connection", b"upgrade") and head.has_token(b"expect", b"100-continue")


# ---- chunked decoder ---------------------------------------------------------------------------------------------

BODY = frame_chunk(b"data: one\n\n") + b"5;ext=1\r\nhello\r\n" + frame_chunk(b"x" * 300) + b"0\r\nTrailer: t\r\n\r\n"


def _payloads(pieces: list[bytes]) -> list[bytes]:
    """Each chunk's payload, from a decoder's pieces (CHUNK_END after each chunk)."""
    payloads: list[bytes] = []
    current = b""
    for piece in pieces:
        if piece is CHUNK_END:
            payloads.append(current)
            current = b""
        else:
            current += piece
    return payloads


def _decode(parts: list[bytes]) -> tuple[list[bytes], int, bool]:
    decoder = ChunkedDecoder()
    out: list[bytes] = []
    consumed = 0
    for part in parts:
        consumed += decoder.feed(part, 0, out)
    return out, consumed, decoder.done


@pytest.mark.parametrize("split", range(1, len(BODY)))
def test_chunked_body_split_anywhere(split: int) -> None:
    out, consumed, done = _decode([BODY[:split], BODY[split:] + b"NEXT"])
    assert _payloads(out) == [b"data: one\n\n", b"hello", b"x" * 300]
    assert done and consumed == len(BODY)  # "NEXT" (the next message) is left alone


def test_whole_chunks_fast_path() -> None:
    event = frame_chunk(b"data: x\n\n")
    assert whole_chunks(event) and whole_chunks(event, EVENT_CHUNK_TAIL)
    # Several chunks in one read (a loaded relay reads a stream's chunks together): whole, they go as they are.
    assert whole_chunks(frame_chunk(b"a") + frame_chunk(b"b")) and whole_chunks(event * 7, EVENT_CHUNK_TAIL)
    assert not whole_chunks(frame_chunk(b"a") + frame_chunk(b"b"), EVENT_CHUNK_TAIL)  # not whole events
    assert not whole_chunks(event + frame_chunk(b"data: x"), EVENT_CHUNK_TAIL)  # the last event unfinished
    assert not whole_chunks(event + event[:-1]) and not whole_chunks(event[:-1])  # the last chunk cut short
    assert not whole_chunks(event + event[:3]) and not whole_chunks(b"")
    assert not whole_chunks(b"0\r\n\r\n") and not whole_chunks(event + b"0\r\n\r\n")  # the body's end
    assert not whole_chunks(b"zz\r\nab\r\n") and not whole_chunks(event + b"zz\r\nab\r\n")
    assert not whole_chunks(b"2;x=1\r\nab\r\n")
    assert not whole_chunks(b"1\r\n\n\r\n", EVENT_CHUNK_TAIL)  # the tail overlaps the size line's CRLF
    decoder = ChunkedDecoder()
    seen = [decoder.at_boundary]
    decoder.feed(b"5\r\nab", 0, [])  # in the middle of a chunk: never the fast path
    seen.append(decoder.at_boundary)
    decoder.feed(b"cde\r\n", 0, [])
    seen.append(decoder.at_boundary)
    assert seen == [True, False, True]


def test_stream_readers_pass_only_chunks_with_nothing_to_see() -> None:
    plain = frame_chunk(b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n')
    terminal = frame_chunk(b'data: {"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}\n\n')
    usage = frame_chunk(b'data: {"choices":[],"usage":{}}\n\n')
    partial = frame_chunk(b'data: {"choices":[{"index":0,')
    stripper, watcher = UsageStripper(1 << 20), SseWatcher(1 << 20)
    assert stripper.passes(plain) and watcher.passes(plain) and watcher.passes(terminal)
    assert not stripper.passes(terminal) and not stripper.passes(usage) and not watcher.passes(usage)
    assert not stripper.passes(partial) and not watcher.passes(partial)
    # A read of several chunks passes when each chunk alone would, and not when any one would not.
    assert stripper.passes(plain * 5) and watcher.passes(plain + terminal + plain)
    assert not stripper.passes(plain * 3 + terminal) and not watcher.passes(plain + usage)
    assert not stripper.passes(plain + partial) and not watcher.passes(plain * 2 + partial)
    # llama.cpp's last event carries its timings: the watcher reads it (the stripper's terminal check covers it).
    timed = frame_chunk(b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}],"timings": {"draft_n":3}}\n\n')
    assert not watcher.passes(timed) and not watcher.passes(plain + timed) and stripper.passes(plain)


def test_bad_chunk_size_fails_the_decoder() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(b"xyz\r\nabc\r\n", 0, [])
    assert decoder.failed and decoder.done


# ---- SSE: the usage event -----------------------------------------------------------------------------------------


def _strip(events: list[bytes], cuts: list[int] | None = None) -> tuple[bytes, UsageStripper]:
    stripper = UsageStripper(1 << 20)
    body = b"".join(events)
    pieces = [body[a:b] for a, b in zip([0, *(cuts or [])], [*(cuts or []), len(body)], strict=True)]
    out = b"".join(stripper.feed(piece) for piece in pieces) + stripper.finish()
    return out, stripper


def test_real_capture_with_usage_becomes_the_capture_without() -> None:
    """vLLM 0.32.0, same prompt: the stream asked for usage, stripped, equals the stream that did not ask."""
    with_usage = fixture_events("completion_stream_usage.sse")
    without = [normalise_ids(e, COMPLETION_ID, 1795364486) for e in fixture_events("completion_stream_nousage.sse")]
    out, stripper = _strip(with_usage)
    assert out == b"".join(without)
    assert stripper.findings.metrics is not None
    assert stripper.findings.metrics["speculative_decoding"]["num_draft_tokens"] == 33
    assert stripper.findings.usage == {"prompt_tokens": 31, "total_tokens": 71, "completion_tokens": 40}


@pytest.mark.parametrize("chat", [False, True])
def test_stripping_survives_any_split(chat: bool) -> None:
    request = {"max_tokens": 3, "stream": True}
    with_usage = stream_events({**request, "stream_options": {"include_usage": True}}, chat)
    expected = b"".join(stream_events(request, chat))
    body = b"".join(with_usage)
    for cut in range(1, len(body), 7):
        out, stripper = _strip(with_usage, [cut])
        assert out == expected, cut
        assert stripper.findings.metrics is not None


def test_llamacpp_timings_move_back_to_the_terminal_event() -> None:
    request = {"max_tokens": 2, "stream": True, "fake_engine": "llamacpp"}
    with_usage = stream_events({**request, "stream_options": {"include_usage": True}}, True)
    out, stripper = _strip(with_usage)
    assert out == b"".join(stream_events(request, True))
    assert stripper.findings.timings is not None and stripper.findings.timings["draft_n"] == 33


def test_server_forcing_usage_keeps_the_usage_event() -> None:
    """--enable-force-include-usage: every chunk has usage, so the client sees it without the tap too."""
    events = [
        b'data: {"id":"a","choices":[{"index":0,"text":"x","finish_reason":"stop"}],"usage":{"total_tokens":2}}\n\n',
        b'data: {"id":"a","choices":[],"usage":{"total_tokens":2},"metrics":{"queue_time_ms":1.0}}\n\n',
        b"data: [DONE]\n\n",
    ]
    out, stripper = _strip(events)
    assert out == b"".join(events)
    assert stripper.findings.metrics == {"queue_time_ms": 1.0}


def test_stream_without_recognisable_events_is_held_back_only_so_far() -> None:
    """Bare-CR line ends (allowed by SSE, used by neither vLLM nor llama.cpp): no event end is found, so the
    stripper holds at most its limit, then passes everything on unchanged."""
    events = [b'data: {"choices":[{"index":0,"text":"%d","finish_reason":null}]}\r\r' % i for i in range(50)]
    stripper = UsageStripper(1000)
    out = [stripper.feed(event) for event in events]
    assert b"".join(out) + stripper.finish() == b"".join(events)
    assert sum(1 for piece in out if not piece) < 1000 // len(events[0]) + 2  # held back only until the limit
    assert stripper.findings.gave_up
    watcher = SseWatcher(1000)
    for event in events:
        watcher.feed(event)
    assert watcher.findings.gave_up and watcher.held_bytes() < 1000


def test_a_stripper_given_up_hands_over_what_it_holds_and_passes_the_rest() -> None:
    """The relay gives up on a stream whose HTTP chunk is larger than it inspects: the held terminal event goes out
    then, and the usage event that follows is no longer dropped."""
    events = stream_events({"max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}, False)
    terminal = next(i for i, event in enumerate(events) if b'"finish_reason":"' in event)
    stripper = UsageStripper(1 << 20)
    out = [stripper.feed(event) for event in events[: terminal + 1]]
    assert out[-1] == b""  # the terminal event is held until the next one
    out.append(stripper.give_up())
    assert stripper.findings.gave_up
    out += [stripper.feed(event) for event in events[terminal + 1 :]]
    assert b"".join(out) + stripper.finish() == b"".join(events)


def test_watcher_reads_usage_split_across_pieces() -> None:
    events = stream_events({"max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}, False)
    body = b"".join(events)
    watcher = SseWatcher(1 << 20)
    for start in range(0, len(body), 50):
        watcher.feed(body[start : start + 50])
    assert watcher.findings.saw_usage and watcher.findings.metrics is not None


def test_moved_members_keep_their_raw_spelling() -> None:
    events = [
        b'data: {"id":"a","choices":[{"index":0,"text":"x","finish_reason":"stop"}]}\n\n',
        b'data: {"id":"a","choices":[],"usage":{"total_tokens":2},"extra":{"x":{"timings":1}},'
        b'"timings":{"draft_n":1.50,"s":"\\u00e9"}}\n\n',
    ]
    out, _ = _strip(events)
    assert out == events[0][:-3] + b',"extra":{"x":{"timings":1}},"timings":{"draft_n":1.50,"s":"\\u00e9"}}\n\n'


@pytest.mark.parametrize("chat", [False, True])
def test_usage_event_recognised_in_any_json_spelling(chat: bool) -> None:
    """A server writing `"choices": []` (json.dumps' spacing): its usage event is found by parsing, removed, and
    its moved members go back onto the terminal event, as for vLLM's compact spelling."""
    request = {"max_tokens": 3, "stream": True}
    with_usage = [respell(e) for e in stream_events({**request, "stream_options": {"include_usage": True}}, chat)]
    assert any(b'"choices": []' in e for e in with_usage)
    out, stripper = _strip(with_usage)
    assert out == b"".join(respell(e) for e in stream_events(request, chat))
    assert stripper.findings.metrics is not None and stripper.findings.saw_usage
    for cut in range(1, len(b"".join(with_usage)), 11):
        assert _strip(with_usage, [cut])[0] == out, cut


def test_stream_readers_find_marks_in_any_spelling() -> None:
    spaced_terminal = frame_chunk(b'data: {"choices": [{"index": 0, "text": "a", "finish_reason": "stop"}]}\n\n')
    spaced_plain = frame_chunk(b'data: {"choices": [{"index": 0, "text": "a", "finish_reason": null}]}\n\n')
    spaced_usage = frame_chunk(b'data: {"choices": [ ], "usage": {"total_tokens": 2}}\n\n')
    forced_usage = frame_chunk(b'data: {"choices": [{"index": 0, "finish_reason": null}], "usage": {"a": 1}}\n\n')
    stripper, watcher = UsageStripper(1 << 20), SseWatcher(1 << 20)
    assert stripper.passes(spaced_plain) and watcher.passes(spaced_plain) and stripper.passes(forced_usage)
    assert not stripper.passes(spaced_terminal) and not stripper.passes(spaced_usage)
    assert not watcher.passes(spaced_usage)
    # Text that looks like a mark is only a candidate: parsed, it is not the usage event, and it is kept.
    lookalike = b'data: {"say \\"choices": [], "choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
    assert not stripper.passes(frame_chunk(lookalike))
    out, found = _strip([lookalike, b"data: [DONE]\n\n"])
    assert out == lookalike + b"data: [DONE]\n\n" and not found.findings.saw_usage


# ---- requests --------------------------------------------------------------------------------------------------------


def test_stream_without_usage_gets_usage_appended_keeping_every_byte() -> None:
    body = b'{"model":"m","prompt":"hi","stream":true,"temperature":0.7}\n'
    plan = plan_request("completions", body)
    assert plan is not None and plan.usage_injected
    assert (
        plan.body == b'{"model":"m","prompt":"hi","stream":true,"temperature":0.7,'
        b'"stream_options":{"include_usage":true}}\n'
    )
    assert (plan.model, plan.temperature, plan.stream, plan.n) == ("m", 0.7, True, 1)


def test_existing_stream_options_are_kept() -> None:
    body = json.dumps(
        {
            "messages": [],
            "stream": True,
            "stream_options": {"include_usage": False, "continuous_usage_stats": True, "x": 1},
        }
    )
    plan = plan_request("chat_completions", body.encode())
    assert plan is not None and plan.usage_injected
    options = json.loads(plan.body)["stream_options"]
    # continuous_usage_stats only counts with include_usage: forced off so every chunk stays as it was.
    assert options == {"include_usage": True, "continuous_usage_stats": False, "x": 1}


@pytest.mark.parametrize(
    "request_body",
    [
        {"prompt": "a", "stream": False},
        {"prompt": "a", "stream": True, "stream_options": {"include_usage": True}},
        {"prompt": "a", "stream": True, "stream_options": {"include_usage": "yes"}},  # vLLM may read it as true
        {"prompt": "a", "stream": True, "n": 2},  # no metrics for n > 1 anyway
        {"prompt": ["a", "b"], "stream": True},  # nor for several prompts
        {"prompt": "a", "stream": "true"},
    ],
)
def test_no_injection(request_body: dict[str, object]) -> None:
    raw = json.dumps(request_body).encode()
    plan = plan_request("completions", raw)
    assert plan is not None and not plan.usage_injected and plan.body is raw


@pytest.mark.parametrize("body", [b"{not json", b"[1,2]", b"\xff\xfe{}", "{}".encode("utf-16")])
def test_bodies_not_understood_are_not_planned(body: bytes) -> None:
    assert plan_request("completions", body) is None


def test_prompt_counting() -> None:
    for prompt, single in (("a", True), ([1, 2, 3], True), (["a"], True), ([[1, 2]], True), (["a", "b"], False)):
        plan = plan_request("completions", json.dumps({"prompt": prompt}).encode())
        assert plan is not None and plan.single_prompt is single, prompt


def test_response_body_findings() -> None:
    found = read_response_body(b'{"usage":{"total_tokens":3},"metrics":null,"timings":{"draft_n":4}}')
    assert found is not None and found.metrics is None and found.timings == {"draft_n": 4}
    assert read_response_body(b"<html>") is None


def _whole_chunks_by_decoding(data: bytes, tail: bytes) -> bool:
    """The reference: decode ``data`` with the chunked decoder; whole when it ends at a chunk boundary, every
    chunk non-empty, each payload ending with ``tail``'s payload part, the body not ended."""
    decoder, pieces = ChunkedDecoder(), list[bytes]()
    if decoder.feed(data, 0, pieces) != len(data) or decoder.failed or decoder.done or not decoder.at_boundary:
        return False
    payloads = _payloads(pieces)
    want = tail[:-2]
    return bool(payloads) and all(p and len(p) >= len(want) and p.endswith(want) for p in payloads)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"", b"a", b"data: x"]) | st.binary(max_size=40),
                          st.sampled_from([b"", b"\n\n", b"\n"])), min_size=1, max_size=4),
       st.sampled_from([CHUNK_TAIL, EVENT_CHUNK_TAIL]), st.integers(min_value=0, max_value=12))
@example([(b"", b"\n")], EVENT_CHUNK_TAIL, 0)  # a one-byte payload: the tail's last bytes overlap its size line
def test_whole_chunks_agrees_with_decoding(parts: list[tuple[bytes, bytes]], tail: bytes, cut: int) -> None:
    """whole_chunks says what decoding the read says, whole reads and cut ones alike."""
    data = b"".join(frame_chunk(payload + end) if payload + end else b"0\r\n\r\n" for payload, end in parts)
    for read in (data, data[:-cut] if cut else data):
        assert whole_chunks(read, tail) == _whole_chunks_by_decoding(read, tail), read
