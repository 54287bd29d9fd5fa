"""The text formats a simulated engine serves: families in one neutral form (``Family``) laid out as Prometheus text
0.0.4 (``write_text``) or OpenMetrics 1.0.0 (``write_openmetrics``) by prometheus_client's own encoders, with the
samples in the order an engine writes them. vLLM's layouts (exposition.py) and the other engines'
(engine_formats.py) are built on these."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE_TEXT
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import ALLOWUTF8
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE_OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


def histogram_samples(name: str, labels: dict[str, str], value: HistogramSnapshot,
                      sum_first: bool) -> Iterator[tuple[str, dict[str, str], float]]:
    """One histogram's samples: cumulative buckets, then _count and _sum (``sum_first``: _sum before the buckets,
    as some vLLM versions write it). Like OpenMetrics, no _count or _sum where a bucket bound is negative."""
    rows = [(name + "_bucket", {**labels, "le": floatToGoString(le)}, count) for le, count in value.buckets]
    if not rows or value.buckets[0][0] < 0:
        yield from rows
        return
    total, count = (name + "_sum", labels, value.sum), (name + "_count", labels, value.count)
    yield from (total, *rows, count) if sum_first else (*rows, count, total)


def _metric(family: Family, created: bool, sum_first: bool) -> Metric:
    """A family as prometheus_client holds it: counters' _total, histograms' buckets, _count and _sum, and with
    ``created`` each series' _created."""
    metric = Metric(family.name, family.help, family.kind)
    for series in family.series:
        labels = dict(series.labels)
        value = series.value
        if isinstance(value, HistogramSnapshot):
            for name, sample_labels, sample_value in histogram_samples(family.name, labels, value, sum_first):
                metric.add_sample(name, sample_labels, sample_value)
        else:
            metric.add_sample(f"{family.name}_total" if family.kind == "counter" else family.name, labels, value)
        if created and series.created is not None and family.kind in ("counter", "histogram"):
            metric.add_sample(f"{family.name}_created", labels, series.created)
    return metric


OPENMETRICS_ENCODER: Callable[..., bytes] = openmetrics_encoder  # the same, typed (its module has no annotations)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


# Names as they are (vLLM's contain colons, which prometheus_client's OpenMetrics encoder turns into underscores
# on sample lines under its default escaping; vLLM's pages keep them).
def write_text(families: Iterable[Family], *, created: bool, sum_first: bool) -> str:
    """Prometheus text 0.0.4 (_created samples, ``created``, in gauge families of their own after each family)."""
    metrics = [_metric(family, created, sum_first) for family in families]
    return generate_latest(_Families(metrics), escaping=ALLOWUTF8).decode()


def write_openmetrics(families: Iterable[Family]) -> str:
    metrics = [_metric(family, created=True, sum_first=False) for family in families]
    return OPENMETRICS_ENCODER(_Families(metrics), escaping=ALLOWUTF8).decode()
