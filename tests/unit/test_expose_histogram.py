"""Histogram families are built from prometheus_client's public Metric API, one sample at a time, so that series of
one family may carry different label names. For any one label set they must expose exactly what prometheus_client's
own HistogramMetricFamily exposes, in both formats."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from specdecode_exporter.sidecar.expose import add_histogram, bucket_label

NAME = "specdecode_test_seconds"


class Families(Collector):
    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return list(self.families)


def exposed(family: Metric) -> tuple[bytes, bytes]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(family))
    return generate_latest(registry), generate_openmetrics(registry)


BOUNDS = st.lists(st.floats(min_value=-10, max_value=10, allow_nan=False), min_size=0, max_size=5,
                  unique=True).map(lambda b: (*sorted(b), math.inf))
LABELS = st.dictionaries(st.sampled_from(["target", "model_name", "workload", "x"]), st.text("ab0", max_size=3),
                         max_size=3)


@settings(max_examples=200, deadline=None)
@given(BOUNDS, st.lists(st.integers(min_value=0, max_value=1000), min_size=6, max_size=6), LABELS,
       st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_a_histogram_is_exposed_as_prometheus_client_exposes_it(bounds: tuple[float, ...], increments: list[int],
                                                                labels: dict[str, str], total: float) -> None:
    buckets = [(bound, float(sum(increments[: i + 1]))) for i, bound in enumerate(bounds)]
    reference = HistogramMetricFamily(NAME, "help", labels=list(labels))
    reference.add_metric(list(labels.values()), [(bucket_label(b), c) for b, c in buckets], total)
    ours = Metric(NAME, "help", "histogram")
    add_histogram(ours, labels, buckets, total)
    assert exposed(ours) == exposed(reference)


def test_series_of_one_family_keep_their_own_label_names() -> None:
    family = Metric(NAME, "help", "histogram")
    add_histogram(family, {"target": "a"}, [(1.0, 2.0), (math.inf, 3.0)], 4.5)
    add_histogram(family, {"target": "b", "pool": "x"}, [(1.0, 0.0), (math.inf, 1.0)], 2.0)
    text = exposed(family)[0].decode()
    assert f'{NAME}_bucket{{le="+Inf",target="a"}} 3.0' in text
    assert f'{NAME}_count{{pool="x",target="b"}} 1.0' in text
    assert f'{NAME}_sum{{target="a"}} 4.5' in text
