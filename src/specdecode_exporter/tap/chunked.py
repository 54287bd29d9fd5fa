"""The chunked transfer coding, read incrementally: the tap's relay reads chunked request and response bodies with it
(http1 says which bodies are chunked)."""

from __future__ import annotations

CHUNK_END = b""  # marker appended to a decoder's output after the last payload piece of each chunk

_SIZE, _DATA, _DATA_CRLF, _TRAILER, _DONE = range(5)
_MAX_LINE = 4096


class ChunkedDecoder:
    """Incremental reader of a chunked body: payload pieces as they arrive, chunk ends, and the body's end.

    ``feed`` never copies more than a partial size or trailer line; payload pieces are slices of the input.
    """

    __slots__ = ("_line", "_remaining", "_state", "failed")

    def __init__(self) -> None:
        self._state = _SIZE
        self._remaining = 0
        self._line = b""
        self.failed = False

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def at_boundary(self) -> bool:
        """Between two chunks, with nothing of the next one read: where a read of whole chunks can start."""
        return self._state == _SIZE and not self._line

    def feed(self, data: bytes, pos: int, out: list[bytes] | None) -> int:
        """Consume ``data[pos:]`` up to the body's end; append payload pieces and CHUNK_END markers to ``out``.
        Returns the index just past the consumed bytes (``len(data)`` unless the body ended earlier)."""
        end = len(data)
        while pos < end and self._state != _DONE:
            state = self._state
            if state == _DATA:
                take = min(self._remaining, end - pos)
                if out is not None:
                    out.append(data[pos : pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state, self._remaining = _DATA_CRLF, 2
                    if out is not None:
                        out.append(CHUNK_END)
            elif state == _DATA_CRLF:
                take = min(self._remaining, end - pos)
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _SIZE
            else:
                pos = self._read_line(data, pos)
        return pos

    def _read_line(self, data: bytes, pos: int) -> int:
        eol = data.find(b"\n", pos)
        if eol < 0:
            self._line += data[pos:]
            if len(self._line) > _MAX_LINE:
                self._fail()
            return len(data)
        line = (self._line + data[pos:eol]).rstrip(b"\r")
        self._line = b""
        if self._state == _TRAILER:
            if not line:
                self._state = _DONE
            return eol + 1
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            self._fail()
            return len(data)
        if size:
            self._state, self._remaining = _DATA, size
        else:
            self._state = _TRAILER
        return eol + 1

    def _fail(self) -> None:
        # A framing error: the relay forwards the rest untouched; the collection's client gives the answer up.
        self.failed = True
        self._state = _DONE
