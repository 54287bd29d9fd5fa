"""Server-sent events of an OpenAI-style completion stream: find the final usage event, and remove it when the tap
asked for it on the client's behalf.

Each forwarded chunk is checked with a few substring searches only; events are split and parsed as JSON only
around the end of a stream (the terminal event, the events with `"choices":[]`: the usage event and SGLang's sglext
event, llama.cpp's timings).
"""

from __future__ import annotations

import json
import re
from typing import Any

from specdecode_exporter.tap.http1 import EVENT_CHUNK_TAIL, whole_chunks
from specdecode_exporter.tap.openai import sglang_shaped

# What marks the events the tap reads, in any JSON spelling ("choices":[] as vLLM writes it, "choices": [] as
# Python's json.dumps does). A match only makes an event a candidate: it is parsed before anything is decided, so a
# text that happens to look like one costs a parse, never a wrong answer. Inside a JSON string every quote is
# escaped, so these hardly ever match text. A compiled search costs what a substring test does (~0.15 µs a chunk).
FINISH_MARK = re.compile(rb'"finish_reason"\s*:\s*"').search  # a terminal chunk (finish_reason set); null elsewhere
EMPTY_CHOICES_MARK = re.compile(rb'"choices"\s*:\s*\[\s*\]').search  # the usage event
TIMINGS_MARK = re.compile(rb'"timings"\s*:\s*\{').search  # llama.cpp's per-request timings, on the last event
# The hot path's checks, each one search for either of its marks (one pass costs half of two: 0.47 µs a chunk).
_STRIPPER_MARKS = re.compile(rb'"finish_reason"\s*:\s*"|"choices"\s*:\s*\[\s*\]').search
_WATCHER_MARKS = re.compile(rb'"choices"\s*:\s*\[\s*\]|"timings"\s*:\s*\{').search
_EVENT_END = re.compile(rb"\r?\n\r?\n")
_DATA_PREFIX = b"data:"
_DECODER = json.JSONDecoder()


class StreamFindings:
    """What the end of a stream said: usage, metrics, timings, SGLang's sglext, and whether it was SGLang's."""

    __slots__ = ("gave_up", "metrics", "saw_usage", "sglang", "sglext", "timings", "usage")

    def __init__(self) -> None:
        self.saw_usage = False
        self.usage: dict[str, Any] | None = None
        self.metrics: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.sglext: dict[str, Any] | None = None
        self.sglang = False
        self.gave_up = False

    def record(self, event: dict[str, Any]) -> None:
        usage, metrics, timings = event.get("usage"), event.get("metrics"), event.get("timings")
        if event.get("choices") == []:
            if isinstance(usage, dict):
                self.saw_usage = True
                self.usage = usage
                self.metrics = metrics if isinstance(metrics, dict) else None
            sglext = event.get("sglext")  # SGLang sends it in an event of its own, before the usage event
            if isinstance(sglext, dict):
                self.sglext = sglext
            self.sglang = self.sglang or sglang_shaped(event, usage if isinstance(usage, dict) else None)
        if isinstance(timings, dict):
            self.timings = timings


def split_events(text: bytes) -> tuple[list[bytes], bytes]:
    """Complete events (each with its blank-line terminator) and the incomplete rest."""
    events: list[bytes] = []
    start = 0
    for match in _EVENT_END.finditer(text):
        events.append(text[start : match.end()])
        start = match.end()
    return events, text[start:]


def event_json(event: bytes) -> dict[str, Any] | None:
    """The JSON object of a one-line ``data: {...}`` event, else None."""
    if not event.startswith(_DATA_PREFIX):
        return None
    try:
        value = json.loads(event[len(_DATA_PREFIX) :])
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class SseWatcher:
    """Reads a stream that is forwarded untouched; records the usage event and timings."""

    __slots__ = ("_carry", "_limit", "findings")

    def __init__(self, limit: int) -> None:
        self._carry = b""
        self._limit = limit
        self.findings = StreamFindings()

    def held_bytes(self) -> int:
        return len(self._carry)

    def passes(self, chunk: bytes) -> bool:
        """Whether a read (at a chunk boundary) is whole HTTP chunks of whole events with nothing to read in them.
        The patterns contain a quote, which a chunk's size line and CRLFs never do, so the read is searched as is."""
        return not self._carry and not _WATCHER_MARKS(chunk) and whole_chunks(chunk, EVENT_CHUNK_TAIL)

    def feed(self, payload: bytes) -> None:
        if not self._carry and payload.endswith(b"\n\n"):
            if not EMPTY_CHOICES_MARK(payload) and not TIMINGS_MARK(payload):
                return
            events, self._carry = split_events(payload)
        elif self.findings.gave_up:
            return
        else:
            events, self._carry = split_events(self._carry + payload)
            if len(self._carry) > self._limit:
                self._carry = b""
                self.findings.gave_up = True
        for event in events:
            if EMPTY_CHOICES_MARK(event) or TIMINGS_MARK(event):
                parsed = event_json(event)
                if parsed is not None:
                    self.findings.record(parsed)


class UsageStripper:
    """Rewrites a stream whose usage event the client did not ask for, so it reads as if never requested.

    vLLM (and llama.cpp) shape the end of a stream differently when usage is on: the terminal chunk loses
    `system_fingerprint` (vLLM) or `timings` (llama.cpp), which ride on the usage event instead. The terminal event
    is therefore held until the next event; if that is the usage event, the fields it carries and the terminal
    event lacks (other than usage and metrics) are appended to the terminal event, and the usage event is dropped.
    """

    __slots__ = ("_carry", "_held", "_limit", "findings", "released")

    def __init__(self, limit: int) -> None:
        self._carry = b""
        self._held: bytes | None = None
        self._limit = limit
        self.findings = StreamFindings()
        # Bytes at the start of feed()'s last output that are an event held from an earlier payload and let go
        # because an event other than the usage event followed it (SGLang's sglext event): in the chunk it came in,
        # apart from this payload's events. 0 otherwise; the reader that frames chunks takes it (and sets it to 0).
        self.released = 0

    def held_bytes(self) -> int:
        return len(self._carry) + len(self._held or b"")

    def passes(self, chunk: bytes) -> bool:
        """Whether a read (at a chunk boundary) is whole HTTP chunks of whole events that go to the client unchanged
        (none is a terminal or usage event: each chunk alone would pass feed() as it is)."""
        return (
            not self._carry
            and self._held is None
            and not _STRIPPER_MARKS(chunk)
            and whole_chunks(chunk, EVENT_CHUNK_TAIL)
        )

    def feed(self, payload: bytes) -> bytes:
        """The bytes to send for this payload: itself (the common case), a rewritten version, or b""."""
        if (
            not self._carry
            and self._held is None
            and payload.endswith(b"\n\n")
            and not FINISH_MARK(payload)
            and not EMPTY_CHOICES_MARK(payload)
        ):
            return payload
        if self.findings.gave_up:
            return payload
        held = self._held
        events, self._carry = split_events(self._carry + payload)
        out = [piece for event in events for piece in self._event(event)]
        self.released = len(held) if held is not None and len(out) > 1 and out[0] is held else 0
        if len(self._carry) > self._limit:
            # Not a stream this class understands: hand over what is held, and pass the rest as it comes.
            out.append(self.finish())
        return b"".join(out)

    def give_up(self) -> bytes:
        """Stop rewriting (the stream is not one this class can inspect): what is held; later payloads pass as
        they come."""
        rest = self.finish()
        self.findings.gave_up = True
        return rest

    def finish(self) -> bytes:
        """Whatever is still held, at the end of the stream (or when giving up)."""
        if self._carry:
            self.findings.gave_up = True
        rest = (self._held or b"") + self._carry
        self._held, self._carry = None, b""
        return rest

    def _event(self, event: bytes) -> list[bytes]:
        out: list[bytes] = []
        if EMPTY_CHOICES_MARK(event):
            parsed = event_json(event)
            if parsed is not None and parsed.get("choices") == []:
                self.findings.record(parsed)  # the usage event, or SGLang's sglext event (forwarded as it is)
            # SGLang writes "usage":null on every event, its sglext event included: only a usage object makes one
            if parsed is not None and parsed.get("choices") == [] and isinstance(parsed.get("usage"), dict):
                if self._held is None:
                    return out
                held, self._held = self._held, None
                return [_merge_terminal(held, event, parsed)]
        if self._held is not None:
            out.append(self._held)
            self._held = None
        if FINISH_MARK(event):
            self._held = event
            if TIMINGS_MARK(event):
                parsed = event_json(event)
                if parsed is not None:
                    self.findings.record(parsed)
        else:
            out.append(event)
        return out


def _merge_terminal(held: bytes, usage_event: bytes, usage: dict[str, Any]) -> bytes:
    terminal = event_json(held)
    if terminal is None or isinstance(terminal.get("usage"), dict):
        # Usage on the terminal chunk: the server sends it on every chunk (--enable-force-include-usage), so the
        # client sees the usage event without the tap too. ("usage":null, as SGLang writes on every chunk, is not.)
        return held + usage_event
    moved = [key for key in usage if key not in terminal and key not in ("usage", "metrics")]
    members = [_raw_member(usage_event, key, usage[key]) for key in moved]
    if any(member is None for member in members):
        return held + usage_event  # cannot be moved byte for byte: better the usage event than a wrong one
    close = held.rindex(b"}")
    # The separator the server writes between members (json.dumps' ", " or the compact ","), so the terminal event
    # reads as the server would have written it without usage.
    comma = b", " if b', "' in held else b","
    return held[:close] + b"".join(comma + member for member in members if member) + held[close:]


def _raw_member(event: bytes, key: str, value: object) -> bytes | None:
    """``"key":value`` exactly as ``event`` spells it (``"key": value`` too): the occurrence whose value is the
    top-level ``value``."""
    text = event.decode("utf-8", "replace")
    for match in re.finditer(re.escape(json.dumps(key)) + r"\s*:\s*", text):
        try:
            found, end = _DECODER.raw_decode(text, match.end())
        except ValueError:
            continue
        if found == value:
            return text[match.start() : end].encode("utf-8")
    return None
