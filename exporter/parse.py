"""Selective parser for the Prometheus text format (0.0.4) and OpenMetrics text (1.0.0).

A vLLM exposition with several engines is about 1 MB and the sidecar needs a few dozen of its lines.
Instead of tokenising every family, we jump straight to the lines whose metric name starts with one of
the wanted prefixes (``str.find`` runs in C) and parse only those.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

Labels = tuple[tuple[str, str], ...]


class ParseError(ValueError):
    """The body is not a Prometheus/OpenMetrics exposition, or a selected line is malformed."""


class Sample(NamedTuple):
    name: str
    labels: Labels  # sorted by label name
    value: float

    def label(self, name: str) -> str | None:
        for key, value in self.labels:
            if key == name:
                return value
        return None


_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# Label bodies are matched quote-aware so that a '}' inside a value, or an OpenMetrics exemplar after the
# value, cannot end them early or late.
_LINE = re.compile(
    rf'({_METRIC_NAME})(?:\{{((?:[^"}}]++|"(?:[^"\\]++|\\.)*+")*+)\}})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*(?:#.*)?'
)
# Possessive quantifiers (++, *+): without them a long label body makes the regex engine keep backtracking
# state per character (hundreds of MiB for a few MiB of hostile labels).
_LABEL_PAIR = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]++|\\.)*+)"[ \t]*(,|$)')
MAX_LABELS_PER_SAMPLE = 64
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r"\\[\\\"n]")
_FIRST_CHAR = re.compile(r"[#a-zA-Z_:]")


def looks_like_exposition(text: str) -> bool:
    """Cheap sanity check: the first non-blank line is a comment or starts with a metric name."""
    stripped = text.lstrip()
    if not stripped:
        return True  # an empty exposition is valid; it just has no spec-decode metrics
    return bool(_FIRST_CHAR.match(stripped))


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], value)


def parse_labels(body: str) -> Labels:
    """Parse the text between ``{`` and ``}``; raises ParseError on anything but well-formed pairs."""
    if not body.strip():
        return ()
    pairs: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        match = _LABEL_PAIR.match(body, pos)
        if match is None:
            raise ParseError(f"malformed labels {{{body[:80]}}}")
        pairs.append((match.group(1), _unescape(match.group(2))))
        if len(pairs) > MAX_LABELS_PER_SAMPLE:
            raise ParseError(f"more than {MAX_LABELS_PER_SAMPLE} labels on one sample")
        pos = match.end()
        if match.group(3) == "" and pos < len(body):
            raise ParseError(f"malformed labels {{{body[:80]}}}")
    pairs.sort()
    return tuple(pairs)


def parse_value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ParseError(f"invalid sample value {text[:40]!r}") from None


def parse_line(line: str) -> Sample:
    match = _LINE.fullmatch(line)
    if match is None:
        raise ParseError(f"malformed sample line {line[:120]!r}")
    name, label_body, value = match.groups()
    return Sample(name, parse_labels(label_body) if label_body else (), parse_value(value))


# Line cache: "name{labels}" (everything before the single space that precedes the value) → (name, labels).
# Between two scrapes of the same target only the values change, so after the first scrape each selected
# line costs one rpartition, one dict lookup and one float(). Only lines without timestamp or exemplar are
# cached (their head is then exactly name+labels); everything else takes the strict regex path every time.
# Bounded: cleared when it grows past _HEAD_CACHE_MAX (label churn cannot grow it without limit).
_HEAD_CACHE_MAX = 20_000
_head_cache: dict[str, tuple[str, Labels]] = {}
_selectors: dict[tuple[str, ...], re.Pattern[str]] = {}


def _selector(prefixes: Sequence[str]) -> re.Pattern[str]:
    """One regex that returns every line starting with one of the prefixes (one C-level scan of the body)."""
    key = tuple(prefixes)
    pattern = _selectors.get(key)
    if pattern is None:
        alternatives = "|".join(re.escape(p) for p in sorted(set(key), key=len, reverse=True))
        # A literal "\n" first lets the regex engine use its fast literal search.
        pattern = _selectors[key] = re.compile(rf"\n((?:{alternatives})[^\n]*)")
    return pattern


def _parse_and_cache(line: str, head: str, cache: dict[str, tuple[str, Labels]]) -> Sample:
    stripped = line.rstrip("\r")
    match = _LINE.fullmatch(stripped)
    if match is None:
        raise ParseError(f"malformed sample line {stripped[:120]!r}")
    name, label_body, value = match.group(1, 2, 3)
    sample = Sample(name, parse_labels(label_body) if label_body else (), parse_value(value))
    # Cacheable only when the value token is the last thing on the line and follows the head's single space.
    if match.end(3) == len(stripped) and match.start(3) == len(head) + 1 and line[len(head)] == " ":
        if len(cache) >= _HEAD_CACHE_MAX:
            cache.clear()
        cache[head] = (sample.name, sample.labels)
    return sample


def select_samples(text: str, prefixes: Sequence[str]) -> list[Sample]:
    """Return the samples whose metric name starts with one of ``prefixes``, in exposition order.

    Raises ParseError when the body is not an exposition at all, or when a selected line is malformed
    (Prometheus rejects a whole scrape for one bad line; so do we, for the lines we read).
    """
    if not looks_like_exposition(text):
        raise ParseError("body is not a Prometheus exposition (first line: " + repr(text.lstrip()[:40]) + ")")
    if not prefixes:
        return []
    lines = _selector(prefixes).findall(text if text.startswith("\n") else "\n" + text)
    cache = _head_cache
    out: list[Sample] = []
    append = out.append
    for line in lines:
        head, _, value = line.rpartition(" ")
        hit = cache.get(head)
        if hit is not None:
            try:
                append(Sample(hit[0], hit[1], float(value)))
                continue
            except ValueError:
                pass  # not a plain value after all: take the strict path for the message
        append(_parse_and_cache(line, head, cache))
    return out


def is_finite_count(value: float) -> bool:
    """A usable counter reading: a finite, non-negative number."""
    return math.isfinite(value) and value >= 0
