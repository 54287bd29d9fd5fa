"""Just enough HTTP/1.1 to relay messages byte for byte: heads, body framing and the chunked transfer coding.

Anything this module cannot read returns None, and the relay then forwards the connection's bytes untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEAD_END = b"\r\n\r\n"
MAX_HEAD = 64 * 1024  # uvicorn (h11) refuses heads beyond 16 KiB; past this the relay stops parsing

_TOKEN_CHARS = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]*")


@dataclass(slots=True)
class Head:
    """A request or response head: the raw bytes plus the few fields framing needs."""

    raw: bytes  # start line and headers, CRLF CRLF included
    start: list[bytes]  # the start line split on single spaces (at most 3 parts)
    fields: dict[bytes, list[bytes]]  # lower-cased name -> values in order
    content_length: int | None
    chunked: bool

    def value(self, name: bytes) -> bytes | None:
        values = self.fields.get(name)
        return values[-1] if values else None

    def has_token(self, name: bytes, token: bytes) -> bool:
        """Whether a comma-separated header such as Connection lists ``token`` (case-insensitive)."""
        return any(token == part.strip().lower() for value in self.fields.get(name, ()) for part in value.split(b","))


def parse_head(raw: bytes) -> Head | None:
    """``raw`` ends with CRLF CRLF. None for anything malformed or ambiguous (obs-fold, conflicting lengths, a bare
    LF, which h11 reads as a line end; a bare CR makes servers refuse the head, so it needs no check)."""
    lines = raw[:-4].split(b"\r\n")
    if raw.count(b"\n") != len(lines) + 1:  # each line's CRLF, and the empty line's
        return None
    start = lines[0].split(b" ", 2)
    if len(start) < 2:
        return None
    fields: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or not _TOKEN_CHARS.issuperset(name):
            return None
        fields.setdefault(name.lower(), []).append(value.strip(b" \t"))
    chunked = False
    if b"transfer-encoding" in fields:
        codings = b",".join(fields[b"transfer-encoding"]).lower().split(b",")
        if codings[-1].strip() != b"chunked":
            return None
        chunked = True
    content_length: int | None = None
    lengths = {v for value in fields.get(b"content-length", ()) for v in value.split(b",")}
    if lengths:
        if len(lengths) > 1 or chunked:
            return None
        text = lengths.pop().strip()
        if not text.isdigit():
            return None
        content_length = int(text)
    return Head(raw, start, fields, content_length, chunked)


def cannot_begin_request(data: bytes, pos: int) -> bool:
    """Whether ``data[pos:]``, the start of a request head whose CRLF CRLF has not come, can already not be one
    ``parse_head`` reads: it does not begin with a method (a token) and a space, or it has a bare LF (a server
    reading LF line ends may have the whole head already: ``GET / HTTP/1.1\\n\\n``) or a bare CR. Such bytes are
    for the upstream to answer now, not for the tap to wait on."""
    method = _TOKEN.match(data, pos)
    method_end = method.end() if method is not None else pos
    if method_end < len(data) and (method_end == pos or data[method_end] != 0x20):
        return True
    crlf = data.count(b"\r\n", pos)
    return data.count(b"\n", pos) != crlf or data.count(b"\r", pos) != crlf + data.endswith(b"\r")


def replace_content_length(raw_head: bytes, length: int) -> bytes:
    """The same head with its Content-Length value replaced, every other byte kept."""
    lines = raw_head.split(b"\r\n")
    for index, line in enumerate(lines):
        name, colon, value = line.partition(b":")
        if colon and name.lower() == b"content-length":
            lead = len(value) - len(value.lstrip(b" \t"))
            trail = len(value) - len(value.rstrip(b" \t"))
            lines[index] = name + b":" + value[:lead] + b"%d" % length + value[len(value) - trail :]
    return b"\r\n".join(lines)


def frame_chunk(payload: bytes) -> bytes:
    """One chunk of the chunked transfer coding, written as uvicorn writes it (lower-case hex, no extensions)."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


CHUNK_TAIL = b"\r\n"
EVENT_CHUNK_TAIL = b"\n\n\r\n"  # a chunk whose payload ends an SSE event


def whole_chunks(data: bytes, tail: bytes = CHUNK_TAIL) -> bool:
    """Whether ``data``, read at a chunk boundary, is one or more whole non-empty chunks, each ending with ``tail``
    (EVENT_CHUNK_TAIL: each payload ends an SSE event). A loaded relay reads several of a stream's chunks at once;
    this walks their size lines only (a find and an int a chunk), so such a read is forwarded as it is instead of
    being decoded and framed again. Nothing but the size lines is copied. Every forwarded read passes here: a
    one-chunk read costs 0.5 µs (1.25 when the least size came from a max() call)."""
    pos, end, least = 0, len(data), len(tail) - 2 if len(tail) > 3 else 1
    while True:
        eol = data.find(b"\r\n", pos, pos + 18)
        if eol <= pos:
            return False
        try:
            size = int(data[pos:eol], 16)
        except ValueError:
            return False
        pos = eol + 4 + size
        if size < least or pos > end or not data.startswith(tail, pos - len(tail)):
            return False
        if pos == end:
            return True


class PlainChunks:
    """The fast-path check for a chunked body the tap only forwards: any whole chunks go through as they are."""

    __slots__ = ()

    @staticmethod
    def passes(chunk: bytes) -> bool:
        return whole_chunks(chunk)
