"""The one exposition writer (core/exposition.py) against prometheus_client's own encoders: for any families,
labels and values, the same bytes in both text formats; histograms as its HistogramMetricFamily exposes them
(series of one family may carry different label names); names escaped as its schemes escape them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample as ClientSample

from specdecode_exporter.core import exposition as ex
from specdecode_exporter.core.metrics import go_float

NAME = "specdecode_test_seconds"
FORMATS = (ex.TEXT, ex.OPENMETRICS)


class Families(Collector):
    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return list(self.families)


def reference(fmt: ex.TextFormat, *families: Metric) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(*families))
    encoder = om.generate_latest if fmt.openmetrics else generate_latest
    return encoder(registry, escaping=fmt.escaping).decode()


def client_family(family: ex.Family) -> Metric:
    """The same family as prometheus_client holds one (its public samples list)."""
    metric = Metric(family.name, family.documentation, family.type, family.unit)
    metric.samples.extend(ClientSample(s.name, dict(s.labels), s.value, s.timestamp) for s in family.samples)
    return metric


BOUNDS = st.lists(st.floats(min_value=-10, max_value=10, allow_nan=False), min_size=0, max_size=5,
                  unique=True).map(lambda b: (*sorted(b), math.inf))
LABELS = st.dictionaries(st.sampled_from(["target", "model_name", "workload", "x"]), st.text("ab0", max_size=3),
                         max_size=3)
VALUES = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**20, 10**20).map(float)
TEXTS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(BOUNDS, st.lists(st.integers(min_value=0, max_value=1000), min_size=6, max_size=6), LABELS,
       st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_a_histogram_is_exposed_as_prometheus_client_exposes_it(bounds: tuple[float, ...], increments: list[int],
                                                                labels: dict[str, str], total: float) -> None:
    buckets = [(bound, float(sum(increments[: i + 1]))) for i, bound in enumerate(bounds)]
    theirs = HistogramMetricFamily(NAME, "help", labels=list(labels))
    theirs.add_metric(list(labels.values()), [(go_float(b), c) for b, c in buckets], total)
    ours = ex.Family(NAME, "histogram", "help", tuple(ex.histogram_samples(NAME, labels, buckets, total)))
    for fmt in FORMATS:
        assert ex.write([ours], fmt) == reference(fmt, theirs)


def test_series_of_one_family_keep_their_own_label_names() -> None:
    samples = (*ex.histogram_samples(NAME, {"target": "a"}, [(1.0, 2.0), (math.inf, 3.0)], 4.5),
               *ex.histogram_samples(NAME, {"target": "b", "pool": "x"}, [(1.0, 0.0), (math.inf, 1.0)], 2.0))
    text = ex.write([ex.Family(NAME, "histogram", "help", samples)])
    assert f'{NAME}_bucket{{le="+Inf",target="a"}} 3.0' in text
    assert f'{NAME}_count{{pool="x",target="b"}} 1.0' in text
    assert f'{NAME}_sum{{target="a"}} 4.5' in text


def test_sum_first_and_an_explicit_count() -> None:
    samples = list(ex.histogram_samples(NAME, {}, [(1.0, 2.0), (math.inf, 3.0)], 4.5, count=7, sum_first=True))
    assert [s.name for s in samples] == [f"{NAME}_sum", f"{NAME}_bucket", f"{NAME}_bucket", f"{NAME}_count"]
    assert samples[-1].value == 7


SAMPLE = st.tuples(st.sampled_from(["", "_total", "_created", "_bucket", "_count", "_sum", "_gsum", "_info"]),
                   st.dictionaries(st.sampled_from(["a", "b", "le", "c9"]), TEXTS, max_size=3), VALUES,
                   st.none() | st.floats(min_value=0, max_value=2e9, allow_nan=False))
FAMILY = st.tuples(st.sampled_from(["specdecode_a", "vllm:b", "c"]),
                   st.sampled_from(["gauge", "counter", "histogram", "gaugehistogram", "info", "unknown"]), TEXTS,
                   st.lists(SAMPLE, max_size=8))


@settings(max_examples=300, deadline=None)
@given(st.lists(FAMILY, max_size=4), st.sampled_from([ex.UNDERSCORES, ex.DOTS, ex.VALUES, ex.ALLOW_UTF8]))
def test_any_families_are_written_as_prometheus_client_writes_them(families: list[tuple], escaping: str) -> None:
    ours = [ex.Family(name, type_, help_, tuple(ex.Sample(name + suffix, labels, value, ts)
                                                 for suffix, labels, value, ts in samples))
            for name, type_, help_, samples in families]
    for fmt in (ex.TextFormat(False, escaping), ex.TextFormat(True, escaping)):
        line_format = ex.LineFormat(fmt)
        for _ in range(2):  # the second time from the remembered prefixes
            written = "".join(ex.page_pieces(ours, line_format)) + fmt.eof
            assert written == reference(fmt, *map(client_family, ours))


@pytest.mark.parametrize("name", ["specdecode_up", "vllm:spec_decode", "_x9", "a.b-c", "9lives", "ü_x", "le"])
@pytest.mark.parametrize("escaping", [ex.UNDERSCORES, ex.DOTS, ex.VALUES])
def test_names_are_escaped_as_prometheus_client_escapes_them(name: str, escaping: str) -> None:
    assert ex.escape_name(name, escaping) == om.escape_metric_name(name, escaping)
    assert ex.escape_name(name, escaping, "label") == om.escape_label_name(name, escaping)
    assert ex.escape_name(name, escaping, "sample") == om._escape(name, escaping, om._is_legacy_labelname_rune)


def test_only_legacy_names_are_written_under_allow_utf8() -> None:
    assert ex.escape_name("vllm:x", ex.ALLOW_UTF8) == "vllm:x"
    with pytest.raises(ValueError, match="legacy"):
        ex.escape_name("a.b", ex.ALLOW_UTF8)
