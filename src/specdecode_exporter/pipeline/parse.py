"""Selective parser for the Prometheus text format (0.0.4) and OpenMetrics text (1.0.0).

A vLLM exposition with several engines is about 1 MB and the sidecar needs a few dozen of its lines.
Instead of tokenising every family, we jump straight to the lines whose metric name starts with one of
the wanted prefixes (``str.find`` runs in C) and parse only those, and only when the decoder has not seen
their layout before.
"""

from __future__ import annotations

import functools
import math
import operator
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


class LineCache:
    """Heads of the plain lines parsed before: "name{labels}" (everything before the single space that precedes
    the value) → (name, labels). Between two scrapes of one target only the values change, so after the first
    scrape each selected line costs one dict lookup and one float(). Only lines without timestamp or exemplar
    are cached (their head is then exactly name+labels). One per target, so one target's label churn never
    evicts another's; bounded: cleared when it grows past ``max_entries``."""

    __slots__ = ("heads", "max_entries")

    def __init__(self, max_entries: int = 20_000) -> None:
        self.heads: dict[str, tuple[str, Labels]] = {}
        self.max_entries = max_entries

    def remember(self, head: str, name: str, labels: Labels) -> None:
        if len(self.heads) >= self.max_entries:
            self.heads.clear()
        self.heads[head] = (name, labels)


def _parse_and_cache(line: str, head: str, cache: LineCache) -> tuple[Sample, bool]:
    """Strict parse of one line; also says whether the line is plain "head value" (its head then names it)."""
    stripped = line.rstrip("\r")
    match = _LINE.fullmatch(stripped)
    if match is None:
        raise ParseError(f"malformed sample line {stripped[:120]!r}")
    name, label_body, value = match.group(1, 2, 3)
    sample = Sample(name, parse_labels(label_body) if label_body else (), parse_value(value))
    # Plain only when the value token is the last thing on the line and follows the head's single space.
    plain = match.end(3) == len(stripped) and match.start(3) == len(head) + 1 and line[len(head)] == " "
    if plain:
        cache.remember(head, sample.name, sample.labels)
    return sample, plain


class TextLayout(NamedTuple):
    """Every line of a selection's regions (the selected lines and the others between them) as a %-template
    with one ``%s`` per value: ``template % values`` rebuilds the regions' text exactly, so one comparison
    proves that a new text has this layout. ``wanted``: which region lines are the selected ones."""

    template: str
    lines: int
    wanted: tuple[int, ...] | None  # None: every region line is selected


def _picked(values: list[str], indices: tuple[int, ...]) -> Sequence[str]:
    """values[i] for each index, in C (an itemgetter of one index gives the item itself, not a tuple)."""
    return operator.itemgetter(*indices)(values) if len(indices) > 1 else [values[i] for i in indices]


class Layout(NamedTuple):
    """What a decoder remembers of the lines it decoded: their heads, and the regions' template when they
    have one (every region line exactly "head value", with no space in the head)."""

    heads: tuple[str, ...]
    text: TextLayout | None


def _text_layout(region_lines: list[str], wanted: list[int], selected: int) -> TextLayout | None:
    if any(line.count(" ") != 1 for line in region_lines):
        return None  # a space in a label value, a timestamp or a blank line: the heads are compared instead
    template = "\n".join([line.partition(" ")[0].replace("%", "%%") + " %s" for line in region_lines])
    return TextLayout(template, len(region_lines), None if selected == len(region_lines) else tuple(wanted))


class Selection:
    """The lines of one exposition whose metric name starts with a wanted prefix, in exposition order.

    ``heads[i]`` is line i up to its last space (``name{labels}`` on a plain line) and ``values[i]`` the text
    after it. Two scrapes of one target usually have identical heads, which lets a decoder that has seen
    the layout before skip parsing altogether (see ``Decoder.decode_known``); ``samples()`` parses strictly.
    A selection made by ``select`` keeps the regions of text it took its lines from: ``known_values`` then
    checks a remembered layout against them without splitting them into lines at all.
    """

    __slots__ = ("_cache", "_heads", "_lines", "_plain", "_samples", "_values", "regions")

    def __init__(self, lines: list[str] | None, cache: LineCache | None = None,
                 regions: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> None:
        self._lines = lines
        self.regions = regions  # (text, the prefixes wanted in it): where ``lines`` come from when not given
        self._cache = cache if cache is not None else LineCache()
        self._heads: tuple[str, ...] | None = None
        self._values: tuple[str, ...] | None = None
        self._samples: list[Sample] | None = None
        self._plain = False

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = [line for region, wanted in self.regions for line in _wanted_lines(region, wanted)]
        return self._lines

    def _split(self) -> None:
        parts = [line.rpartition(" ") for line in self.lines]
        # Not zip(*parts): transposing thousands of 3-tuples through argument unpacking costs 3× as much.
        self._heads = tuple([part[0] for part in parts])
        self._values = tuple([part[2] for part in parts])

    @property
    def heads(self) -> tuple[str, ...]:
        if self._heads is None:
            self._split()
        assert self._heads is not None
        return self._heads

    @property
    def values(self) -> tuple[str, ...]:
        if self._values is None:
            self._split()
        assert self._values is not None
        return self._values

    def layout(self) -> Layout:
        """This selection's layout, for ``known_values`` on the next one."""
        region_lines: list[str] = []
        wanted: list[int] = []
        for region, prefixes in self.regions:
            first = len(region_lines)
            region_lines += region.split("\n")
            wanted += [i for i in range(first, len(region_lines)) if region_lines[i].startswith(prefixes)]
        text = _text_layout(region_lines, wanted, len(self.lines)) if self.regions else None
        return Layout(self.heads, text if text is not None and len(wanted) == len(self.lines) else None)

    def known_values(self, layout: Layout) -> Sequence[str] | None:
        """The value of each line when this selection has ``layout``'s lines (else None). From the regions'
        text when the layout has a template (a few calls in C, whatever the number of lines), else by heads."""
        text = layout.text
        if text is not None and self.regions:
            joined = "\n".join([region for region, _ in self.regions])
            # Split at any whitespace: no value token then holds a newline, so a text that the template rebuilds
            # exactly has each value where the layout's line has it (a head with other whitespace fails the check).
            tokens = joined.split()
            if len(tokens) == 2 * text.lines:
                values = tokens[1::2]
                if text.template % tuple(values) == joined:
                    return values if text.wanted is None else _picked(values, text.wanted)
        if self.heads != layout.heads:
            return None
        # float() reads "3\v" or "\u20033" (it strips any whitespace), the strict parser does not: such a value
        # must take the strict path and fail there, as it would on a first scrape.
        return self.values if "".join(self.values).isprintable() else None

    def samples(self) -> list[Sample]:
        """Every selected line as a Sample; raises ParseError on the first malformed line."""
        if self._samples is None:
            cache = self._cache
            heads = cache.heads
            out: list[Sample] = []
            append = out.append
            plain = True
            for line, head, value in zip(self.lines, self.heads, self.values, strict=True):
                hit = heads.get(head)
                if hit is not None:
                    try:
                        append(Sample(hit[0], hit[1], float(value)))
                        continue
                    except ValueError:
                        pass  # not a plain value after all: take the strict path for the message
                sample, line_plain = _parse_and_cache(line, head, cache)
                plain = plain and line_plain
                append(sample)
            self._samples, self._plain = out, plain
        return self._samples

    @property
    def plain(self) -> bool:
        """Every line is exactly "name{labels} value": the heads alone identify the samples' names and labels."""
        self.samples()
        return self._plain


@functools.lru_cache(maxsize=16)
def _common_start(words: tuple[str, ...]) -> str:
    low, high = min(words), max(words)  # the common start of the extremes is everyone's
    size = 0
    while size < len(low) and low[size] == high[size]:
        size += 1
    return low[:size]


def _wanted_lines(text: str, wanted: tuple[str, ...]) -> list[str]:
    """The lines of a region that start with a wanted prefix."""
    region = text.split("\n")
    first = region[0]
    for prefix in wanted:
        if first.startswith(prefix):
            # Usually the region is this one family: a C-level count proves it and spares the check per line.
            if text.count("\n" + prefix) == len(region) - 1:
                return region
            break
    return [line for line in region if line.startswith(wanted)]


MIN_NEEDLE = 16  # prefixes that share at least this many characters are found in one pass


@functools.lru_cache(maxsize=16)
def needle_groups(prefixes: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The prefixes in groups that share a long common start, each with that start: one str.find pass per
    group jumps only to that group's families (a single pass on "vllm:" would visit every vLLM family)."""
    groups: list[list[str]] = []
    for prefix in sorted(set(prefixes)):
        if groups and len(_common_start((groups[-1][0], prefix))) >= min(MIN_NEEDLE, len(groups[-1][0])):
            groups[-1].append(prefix)
        else:
            groups.append([prefix])
    return tuple((_common_start(tuple(group)), tuple(group)) for group in groups)


@functools.lru_cache(maxsize=16)
def _family_start(prefixes: tuple[str, ...]) -> tuple[re.Pattern[str], tuple[str, ...]]:
    """A pattern for the newline before a line that starts with any group's common start (one pass over the text
    finds the next wanted family, whichever group it is in), and those starts."""
    starts = tuple(common for common, _ in needle_groups(prefixes))
    return re.compile("\n(?:" + "|".join(re.escape(start) for start in starts) + ")"), starts


def select(text: str, prefixes: Sequence[str], cache: LineCache | None = None) -> Selection:
    """Find the lines whose metric name starts with one of ``prefixes``; raises ParseError when the body is
    not an exposition at all.

    The text format keeps each family's samples together, after its ``# HELP``/``# TYPE`` lines. So one
    pattern (in C) jumps to the next line with a group of prefixes' common start, and everything up to the
    next comment is that region, split into lines only when they are read. Lines come in exposition order.
    """
    if not looks_like_exposition(text):
        raise ParseError("body is not a Prometheus exposition (first line: " + repr(text.lstrip()[:40]) + ")")
    if text and text[-1] != "\n":
        # The format ends every line with a newline: without it the body was cut (a server dying mid-write),
        # and its last value may be a prefix of the real one, which a counter would read as a restart.
        raise ParseError("exposition cut short: its last line has no newline (" + repr(text[-40:]) + ")")
    wanted = tuple(prefixes)
    regions: list[tuple[str, tuple[str, ...]]] = []
    if not wanted:
        return Selection(None, cache, ())
    pattern, starts = _family_start(wanted)
    start: int | None = 0 if text.startswith(starts) else None
    position = 0
    while True:
        if start is None:
            found = pattern.search(text, position)
            if found is None:
                break
            start = found.start() + 1
        end = text.find("\n#", start)
        if end == -1:
            end = len(text)
        regions.append((text[start:end], wanted))
        position, start = end, None
    return Selection(None, cache, tuple(regions))


def select_samples(text: str, prefixes: Sequence[str]) -> list[Sample]:
    """Return the samples whose metric name starts with one of ``prefixes``, in exposition order.

    Raises ParseError when the body is not an exposition at all, or when a selected line is malformed
    (Prometheus rejects a whole scrape for one bad line; so do we, for the lines we read).
    """
    return select(text, prefixes).samples()


def is_finite_count(value: float) -> bool:
    """A usable counter reading: a finite, non-negative number."""
    return math.isfinite(value) and value >= 0
