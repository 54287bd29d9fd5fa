"""The one exposition writer: Prometheus text 0.0.4 and OpenMetrics 1.0.0, byte for byte as prometheus_client's
encoders (generate_latest, openmetrics.exposition.generate_latest) write them (tests hold them equal). The sidecar's
/metrics page (sidecar/page.py), its tap families and the simulated engines' pages (simulator/text_format.py) are
all written here.

Why not prometheus_client's own families: a family of ours carries series with different label names (a target's
own labels), which the public helpers (GaugeMetricFamily, HistogramMetricFamily: one list of label names per
family) cannot hold; and building a family object per sample and then formatting it cost the page about three
times what writing each line straight away does (PageLines in sidecar/page.py). Families of prometheus_client's
own collectors (process, platform, GC) are written from their public attributes (``FamilyLike``).

A sample line is ``name{labels} value``; its ``name{labels} `` part never changes between renders, so
``LineFormat`` remembers it from one render to the next and a render only formats the values.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from specdecode_exporter.core.metrics import go_float

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OPENMETRICS_EOF = "# EOF\n"
LINES_PER_STEP = 100  # sample lines written between two looks at the clock (family_pieces)
PREFIXES_KEPT_ANYWAY = 64  # a small page's remembered prefixes are never dropped for being twice its lines

# Name escaping schemes a scraper may ask for (Accept: ...; escaping=...), as prometheus_client names them.
UNDERSCORES, DOTS, VALUES, ALLOW_UTF8 = "underscores", "dots", "values", "allow-utf-8"
_LEGACY_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The text format's names and types for OpenMetrics' types (prometheus_client's munging).
_TEXT_TYPES = {"info": ("_info", "gauge"), "stateset": ("", "gauge"), "gaugehistogram": ("", "histogram"),
               "unknown": ("", "untyped"), "counter": ("_total", "counter")}
_OPENMETRICS_ONLY = ("_created", "_gcount", "_gsum")  # the text format moves these to gauge families of their own


@dataclass(frozen=True, slots=True)
class TextFormat:
    """Which of the two text formats, and how names are escaped (only names outside the legacy character set
    change, except under ``dots``, which doubles every underscore)."""

    openmetrics: bool = False
    escaping: str = UNDERSCORES

    @property
    def eof(self) -> str:
        """What closes a page: OpenMetrics' # EOF, or nothing."""
        return OPENMETRICS_EOF if self.openmetrics else ""

    @property
    def content_type(self) -> str:
        return CONTENT_TYPE_OPENMETRICS if self.openmetrics else CONTENT_TYPE_TEXT


TEXT = TextFormat()
OPENMETRICS = TextFormat(openmetrics=True)


class SampleLike(Protocol):
    """One sample as prometheus_client's Sample holds it (and ``Sample`` below)."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def value(self) -> float: ...
    @property
    def timestamp(self) -> object: ...


class FamilyLike(Protocol):
    """One family as prometheus_client's Metric holds it (and ``Family`` below)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def documentation(self) -> str: ...
    @property
    def unit(self) -> str: ...
    @property
    def samples(self) -> Sequence[SampleLike]: ...


class Sample(NamedTuple):
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class Family:
    """A family in the writer's own neutral form (counters named without their _total suffix)."""

    name: str
    type: str
    documentation: str
    samples: Sequence[Sample]
    unit: str = ""


def escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def escape_help(text: str, openmetrics: bool) -> str:
    out = text.replace("\\", r"\\").replace("\n", r"\n")
    return out.replace('"', r"\"") if openmetrics else out


def _valid_rune(char: str, i: int, metric: bool) -> bool:
    return char == "_" or (char.isascii() and (char.isalpha() or (char.isdigit() and i > 0) or
                                               (char == ":" and metric)))


def _escape(name: str, escaping: str, metric: bool) -> str:
    """Each character the scheme's way (prometheus_client's _escape)."""
    out = ["U__"] if escaping == VALUES else []
    for i, char in enumerate(name):
        if escaping in (DOTS, VALUES) and char == "_":
            out.append("__")
        elif escaping == DOTS and char == ".":
            out.append("_dot_")
        elif _valid_rune(char, i, metric):
            out.append(char)
        else:
            out.append({DOTS: "__", VALUES: f"_{ord(char):x}_"}.get(escaping, "_"))
    return "".join(out)


@functools.cache
def escape_name(name: str, escaping: str, kind: str = "metric") -> str:
    """A name as prometheus_client's encoders write it under the scheme: a family's (``metric``), a label's
    (``label``), or an OpenMetrics sample line's (``sample``: escaped character by character, as a label name
    is, under every scheme). Only legacy names can be written unquoted under ``allow-utf-8``: any other is refused
    (the contract's names and the config's label names are all legacy)."""
    metric = kind != "label"
    legacy = (_LEGACY_METRIC if metric else _LEGACY_LABEL).fullmatch(name) is not None
    if escaping == ALLOW_UTF8 or not name:
        if not legacy and name:
            raise ValueError(f"not a legacy Prometheus name: {name!r}")
        return name
    if kind == "sample":
        return _escape(name, escaping, metric=False)
    return name if legacy and escaping != DOTS else _escape(name, escaping, metric)


def labels_text(labels: Mapping[str, str], escaping: str = UNDERSCORES) -> str:
    """``{a="x",b="y"}``, sorted by label name; nothing for no labels."""
    if not labels:
        return ""
    return "{" + ",".join(f'{escape_name(k, escaping, "label")}="{escape_label_value(v)}"'
                          for k, v in sorted(labels.items())) + "}"


def header(fmt: TextFormat, name: str, type_: str, documentation: str, unit: str = "") -> str:
    """A family's HELP and TYPE lines (and OpenMetrics' UNIT)."""
    if fmt.openmetrics:
        exposed = escape_name(name, fmt.escaping)
        lines = f"# HELP {exposed} {escape_help(documentation, True)}\n# TYPE {exposed} {type_}\n"
        return lines + (f"# UNIT {exposed} {unit}\n" if unit else "")
    suffix, type_ = _TEXT_TYPES.get(type_, ("", type_))
    exposed = escape_name(name + suffix, fmt.escaping)
    return f"# HELP {exposed} {escape_help(documentation, False)}\n# TYPE {exposed} {type_}\n"


def sample_prefix(fmt: TextFormat, name: str, labels: Mapping[str, str]) -> str:
    """What precedes the value on a sample's line: ``name{labels} ``."""
    exposed = escape_name(name, fmt.escaping, "sample" if fmt.openmetrics else "metric")
    return f"{exposed}{labels_text(labels, fmt.escaping)} "


def timestamp_text(fmt: TextFormat, timestamp: object) -> str:
    """A sample's timestamp after its value: milliseconds in the text format, seconds in OpenMetrics."""
    if timestamp is None:
        return ""
    if fmt.openmetrics:
        return f" {timestamp}"
    return f" {int(float(str(timestamp)) * 1000):d}"


def histogram_samples(name: str, labels: Mapping[str, str], buckets: Iterable[tuple[float, float]], total: float,
                      count: float | None = None, sum_first: bool = False) -> Iterator[Sample]:
    """One histogram's samples, each with its own labels (series of one family may carry different label names):
    cumulative buckets, then _count (``count``, else the +Inf bucket) and _sum (``sum_first``: _sum before the
    buckets, as some vLLM versions write it). Like OpenMetrics, no _count or _sum where a bucket bound is negative
    (observations may then be negative, and their sum means nothing)."""
    lowest: float | None = None
    last = 0.0
    bucket = name + "_bucket"
    rows: list[Sample] = []
    for le, last in buckets:
        lowest = le if lowest is None else lowest
        rows.append(Sample(bucket, {**labels, "le": go_float(le)}, last))
    if lowest is None or lowest < 0:
        yield from rows
        return
    totals = Sample(name + "_count", labels, last if count is None else count), Sample(name + "_sum", labels, total)
    yield from (totals[1], *rows, totals[0]) if sum_first else (*rows, *totals)


SampleKey = tuple[str, tuple[str, ...], tuple[str, ...]]  # name, label names, label values
FamilyKey = tuple[str, str, str, str]  # name, type, documentation, unit: what a family's header is written from


@dataclass
class LineFormat:
    """One format's family headers and sample-line prefixes, kept from one render to the next. A series gone
    leaves its prefix behind until they are more than half of what is kept: then all are dropped, and the next
    render learns the ones it uses again (tracking which ones each render used cost about as much as the lookup)."""

    format: TextFormat = TEXT
    headers: dict[FamilyKey, str] = field(default_factory=dict)
    prefixes: dict[SampleKey, str] = field(default_factory=dict)
    _written: int = 0  # lines written since the last render_done

    @property
    def eof(self) -> str:
        return self.format.eof

    def header(self, family: FamilyKey) -> str:
        text = self.headers.get(family)
        if text is None:
            text = self.headers[family] = header(self.format, *family)
        return text

    def line(self, name: str, labels: Mapping[str, str], value: float) -> str:
        """One sample's line: its remembered prefix and the value."""
        key = (name, tuple(labels), tuple(labels.values()))
        prefix = self.prefixes.get(key)
        if prefix is None:
            prefix = self.prefixes[key] = sample_prefix(self.format, name, labels)
        self._written += 1
        return prefix + go_float(value) + "\n"

    def sample_line(self, sample: SampleLike) -> str:
        line = self.line(sample.name, sample.labels, sample.value)
        return line if sample.timestamp is None else line[:-1] + timestamp_text(self.format, sample.timestamp) + "\n"

    def render_done(self) -> None:
        if len(self.prefixes) > 2 * self._written + PREFIXES_KEPT_ANYWAY:
            self.prefixes = {}
        self._written = 0


def family_key(family: FamilyLike) -> FamilyKey:
    return family.name, family.type, family.documentation, family.unit


def _lines(samples: Sequence[SampleLike], line_format: LineFormat) -> Iterator[str]:
    """Sample lines, LINES_PER_STEP at a time."""
    line = line_format.sample_line
    for start in range(0, len(samples), LINES_PER_STEP):
        yield "".join([line(sample) for sample in samples[start:start + LINES_PER_STEP]])


def family_pieces(family: FamilyLike, line_format: LineFormat) -> Iterator[str]:
    """One family's text, a hundred lines at a time. The text format moves OpenMetrics' _created, _gcount and _gsum
    samples to gauge families of their own after it (exemplars and native histograms are not written: nothing the
    project exposes makes them)."""
    samples: Sequence[SampleLike] = family.samples
    moved: dict[str, list[SampleLike]] = {}
    if not line_format.format.openmetrics:
        special = {family.name + suffix: suffix for suffix in _OPENMETRICS_ONLY}
        if any(sample.name in special for sample in samples):
            for sample in samples:
                if sample.name in special:
                    moved.setdefault(special[sample.name], []).append(sample)
            samples = [sample for sample in samples if sample.name not in special]
    text = line_format.header(family_key(family))
    for piece in _lines(samples, line_format):
        yield text + piece
        text = ""
    if text:
        yield text
    for suffix, extra in sorted(moved.items()):
        yield line_format.header((family.name + suffix, "gauge", family.documentation, "")) + "".join(
            _lines(extra, line_format))


def page_pieces(families: Iterable[FamilyLike], line_format: LineFormat) -> Iterator[str]:
    """The families' text in pieces (without OpenMetrics' closing # EOF)."""
    for family in families:
        yield from family_pieces(family, line_format)
    line_format.render_done()


def write(families: Iterable[FamilyLike], fmt: TextFormat = TEXT) -> str:
    """A whole page in one piece, closed (OpenMetrics' # EOF)."""
    return "".join(page_pieces(families, LineFormat(fmt))) + fmt.eof
