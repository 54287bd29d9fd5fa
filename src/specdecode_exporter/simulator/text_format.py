"""The text formats a simulated engine serves: families in one neutral form (``Family``) laid out as Prometheus text
0.0.4 (``write_text``, as prometheus_client's generate_latest writes it) or OpenMetrics 1.0.0 (``write_openmetrics``).
vLLM's layouts (exposition.py) and the other engines' (engine_formats.py) are built on these."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specdecode_exporter.core.metrics import go_float
from specdecode_exporter.simulator.simulator import HistogramSnapshot

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Series:
    labels: Labels
    value: float | HistogramSnapshot
    created: float | None = None


@dataclass(frozen=True)
class Family:
    name: str  # counters without the _total suffix
    kind: str  # counter | gauge | histogram
    help: str
    series: tuple[Series, ...]


def content_type(fmt: str) -> str:
    return CONTENT_TYPE_OPENMETRICS if fmt == "v1-openmetrics" else CONTENT_TYPE_TEXT




def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str, openmetrics: bool) -> str:
    out = text.replace("\\", r"\\").replace("\n", r"\n")
    return out.replace('"', r"\"") if openmetrics else out


def _labels(pairs: Labels) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(pairs)) + "}"


def _line(name: str, labels: Labels, value: float) -> str:
    return f"{name}{_labels(labels)} {go_float(value)}\n"


def _histogram_lines(name: str, s: Series, sum_first: bool, openmetrics: bool) -> list[str]:
    h = s.value
    assert isinstance(h, HistogramSnapshot)
    buckets = [_line(f"{name}_bucket", (*s.labels, ("le", go_float(le))), n) for le, n in h.buckets]
    count, total = _line(f"{name}_count", s.labels, h.count), _line(f"{name}_sum", s.labels, h.sum)
    lines = [total, *buckets, count] if sum_first else [*buckets, count, total]
    if openmetrics and s.created is not None:
        lines.append(_line(f"{name}_created", s.labels, s.created))
    return lines


def write_text(families: Iterable[Family], *, created: bool, sum_first: bool) -> str:
    """Prometheus text 0.0.4 as prometheus_client's generate_latest writes it."""
    out: list[str] = []
    for f in families:
        exposed = f"{f.name}_total" if f.kind == "counter" else f.name
        out.append(f"# HELP {exposed} {_escape_help(f.help, False)}\n")
        out.append(f"# TYPE {exposed} {f.kind}\n")
        for s in f.series:
            if f.kind == "histogram":
                out.extend(_histogram_lines(f.name, s, sum_first, False))
            else:
                assert isinstance(s.value, float | int)
                out.append(_line(exposed, s.labels, s.value))
        with_created = [s for s in f.series if s.created is not None]
        if created and f.kind in ("counter", "histogram") and with_created:
            out.append(f"# HELP {f.name}_created {_escape_help(f.help, False)}\n")
            out.append(f"# TYPE {f.name}_created gauge\n")
            out.extend(_line(f"{f.name}_created", s.labels, s.created or 0.0) for s in with_created)
    return "".join(out)


def write_openmetrics(families: Iterable[Family]) -> str:
    out: list[str] = []
    for f in families:
        out.append(f"# HELP {f.name} {_escape_help(f.help, True)}\n")
        out.append(f"# TYPE {f.name} {f.kind}\n")
        for s in f.series:
            if f.kind == "histogram":
                out.extend(_histogram_lines(f.name, s, False, True))
            elif f.kind == "counter":
                assert isinstance(s.value, float | int)
                out.append(_line(f"{f.name}_total", s.labels, s.value))
                if s.created is not None:
                    out.append(_line(f"{f.name}_created", s.labels, s.created))
            else:
                assert isinstance(s.value, float | int)
                out.append(_line(f.name, s.labels, s.value))
    out.append("# EOF\n")
    return "".join(out)
