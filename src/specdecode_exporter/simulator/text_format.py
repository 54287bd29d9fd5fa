"""The text formats a simulated engine serves: families in one neutral form (``Family``) laid out as Prometheus text
0.0.4 (``write_text``, as prometheus_client's generate_latest writes it) or OpenMetrics 1.0.0 (``write_openmetrics``)
by the project's one exposition writer (core/exposition.py). vLLM's layouts (exposition.py) and the other engines'
(engine_formats.py) are built on these."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from specdecode_exporter.core import exposition
from specdecode_exporter.core.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT, Sample
from specdecode_exporter.simulator.simulator import HistogramSnapshot

__all__ = ["CONTENT_TYPE_OPENMETRICS", "CONTENT_TYPE_TEXT", "Family", "Series", "content_type", "write_openmetrics",
           "write_text"]

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


def _samples(family: Family, created: bool, sum_first: bool) -> Iterator[Sample]:
    """A family's samples as prometheus_client's families hold them: counters' _total, histograms' buckets, _count
    and _sum (``sum_first``: _sum first), and with ``created`` each series' _created."""
    for series in family.series:
        labels = dict(series.labels)
        value = series.value
        if isinstance(value, HistogramSnapshot):
            yield from exposition.histogram_samples(family.name, labels, value.buckets, value.sum, count=value.count,
                                                    sum_first=sum_first)
        else:
            yield Sample(f"{family.name}_total" if family.kind == "counter" else family.name, labels, value)
        if created and series.created is not None and family.kind in ("counter", "histogram"):
            yield Sample(f"{family.name}_created", labels, series.created)


def _families(families: Iterable[Family], created: bool, sum_first: bool) -> Iterator[exposition.Family]:
    for f in families:
        yield exposition.Family(f.name, f.kind, f.help, tuple(_samples(f, created, sum_first)))


# Names as they are (vLLM's contain colons, which prometheus_client 0.26's OpenMetrics encoder turns into
# underscores on sample lines under its default escaping; vLLM's pages keep them).
TEXT = exposition.TextFormat(openmetrics=False, escaping=exposition.ALLOW_UTF8)
OPENMETRICS = exposition.TextFormat(openmetrics=True, escaping=exposition.ALLOW_UTF8)


def write_text(families: Iterable[Family], *, created: bool, sum_first: bool) -> str:
    """Prometheus text 0.0.4 as prometheus_client's generate_latest writes it (its _created samples, ``created``,
    in gauge families of their own after each family)."""
    return exposition.write(_families(families, created, sum_first), TEXT)


def write_openmetrics(families: Iterable[Family]) -> str:
    return exposition.write(_families(families, created=True, sum_first=False), OPENMETRICS)
