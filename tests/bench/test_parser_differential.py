"""Differential test: specdecode_exporter.pipeline.parse.select_samples agrees with prometheus_client's parser on every
fixture and on generated expositions (hypothesis), for the lines it selects — including when the same
text is parsed twice (a parser with a per-line cache must give the same answer on the second pass)."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from specdecode_exporter.pipeline.engines import ALL_PREFIXES
from specdecode_exporter.pipeline.parse import select_samples

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def reference(text: str, prefixes: tuple[str, ...]) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(prefixes):
                out.append((s.name, tuple(sorted(s.labels.items())), s.value))
    return out


def ours(text: str, prefixes: tuple[str, ...]) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [(s.name, s.labels, s.value) for s in select_samples(text, prefixes)]


def same(a: list, b: list) -> bool:  # type: ignore[type-arg]
    """The same samples; lines come family group by family group, so only each name's own order counts."""
    if len(a) != len(b):
        return False
    a, b = sorted(a, key=lambda s: s[0]), sorted(b, key=lambda s: s[0])  # stable: keeps each name's order
    return all(x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2]))) for x, y in zip(a, b,
                                                                                                          strict=True))


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*vllm*.prom")))
def test_fixtures_agree_with_prometheus_client(name: str) -> None:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    expected = reference(text, ALL_PREFIXES)
    assert expected, "every fixture has spec-decode samples"
    for _ in range(2):
        assert same(ours(text, ALL_PREFIXES), expected)


NAMES = st.sampled_from([
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_drafts_created",
    "vllm:spec_decode_draft_acceptance_rate", "vllm:generation_tokens_total", "vllm:num_requests_running",
])
LABEL_NAMES = st.sampled_from(["engine", "model_name", "position", "le", "x_y"])
LABEL_VALUES = st.text(alphabet=st.sampled_from(list('ab0 ,={}#"\\\n/:.-é')), max_size=8)
VALUES = st.one_of(
    st.integers(min_value=0, max_value=10**12).map(float),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@st.composite
def expositions(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(min_value=0, max_value=12))):
        name = draw(NAMES)
        labels = draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=3))
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        line = name + (f"{{{body}}}" if labels else "") + " " + _fmt(draw(VALUES))
        if draw(st.booleans()):
            line += " " + str(draw(st.integers(min_value=0, max_value=2**40)))  # a timestamp
        if draw(st.booleans()):
            lines.append(f"# HELP {name} some help")
        lines.append(line)
    return "\n".join(lines) + ("\n" if lines or draw(st.booleans()) else "")


@settings(max_examples=300, deadline=None)
@given(expositions())
def test_generated_expositions_agree_with_prometheus_client(text: str) -> None:
    try:
        expected = reference(text, ALL_PREFIXES)
    except ValueError:
        return  # prometheus_client rejects it (e.g. a duplicate HELP); nothing to compare
    for _ in range(2):
        assert same(ours(text, ALL_PREFIXES), expected)


@settings(max_examples=200, deadline=None)
@given(expositions(), expositions())
def test_values_change_between_scrapes(first: str, second: str) -> None:
    """Parsing one text must not change how the next one parses (caches keyed by line heads)."""
    try:
        expected = reference(second, ALL_PREFIXES)
    except ValueError:
        return
    with contextlib.suppress(ValueError):
        select_samples(first, ALL_PREFIXES)
    assert same(ours(second, ALL_PREFIXES), expected)
