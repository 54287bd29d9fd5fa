"""The fast path must give exactly what the slow path gives.

After one scrape the V1 decoder knows the layout of the selected lines, and the next scrape with the same
lines skips parsing (``decode_known``); windows are derived from two snapshots without building the delta
(``span_stats``). Each is checked here against the plain path on generated inputs, and end to end through
a collector fed a simulator with restarts, engines coming and going and bad values.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode_exporter.pipeline.derive import CostModel, counts_stats, span_stats
from specdecode_exporter.pipeline.engines import ALL_PREFIXES, FetchTiming
from specdecode_exporter.pipeline.engines.vllm_v1 import V1Decoder
from specdecode_exporter.pipeline.parse import ParseError, select
from specdecode_exporter.pipeline.scrape import FetchResult
from specdecode_exporter.pipeline.store import Store, Totals, WindowSpan
from specdecode_exporter.sidecar.collection import TargetCollector
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.simulator import ModelSpec, Scenario, Simulator
from specdecode_exporter.simulator.clock import ManualClock
from specdecode_exporter.simulator.exposition import render

TIMING = FetchTiming(0.0, 0.01)

# A series: (model_name, engine, k, with drafts counter, with _created, a missing position)
SERIES = st.tuples(
    # Whitespace other than a space inside a label value: the known-layout check must still hold.
    st.sampled_from(["m", "org/m-2", 'we"ird', "tab\tbed", "no\u00a0break"]),
    st.sampled_from(["0", "1", "7"]),
    st.integers(min_value=0, max_value=4),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
)
GOOD_VALUE = st.integers(min_value=0, max_value=10**9).map(float)
ANY_VALUE = st.one_of(GOOD_VALUE, GOOD_VALUE, GOOD_VALUE,
                      st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e400", "x", "1_0", "1\t2", "3\x0b"]))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _heads(series: list[tuple[str, str, int, bool, bool, int | None]]) -> list[str]:
    heads = []
    for model, engine, k, with_drafts, with_created, missing in series:
        labels = f'engine="{engine}",model_name="{_escape(model)}"'
        if with_drafts:
            heads.append(f"vllm:spec_decode_num_drafts_total{{{labels}}}")
        if with_created:
            heads.append(f"vllm:spec_decode_num_drafts_created{{{labels}}}")
        heads.append(f"vllm:spec_decode_num_draft_tokens_total{{{labels}}}")
        heads.append(f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}}")
        heads += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}}'
                  for i in range(k) if i != missing]
    return heads


def _text(heads: list[str], values: list[float | str]) -> str:
    return "".join(f"{head} {value if isinstance(value, str) else repr(value)}\n"
                   for head, value in zip(heads, values, strict=True))


def _decode_fresh(text: str) -> object:
    try:
        return V1Decoder().decode(select(text, ALL_PREFIXES), TIMING)
    except ParseError:
        return ParseError


@settings(max_examples=300, deadline=None)
@given(st.lists(SERIES, min_size=1, max_size=4), st.data())
def test_known_layout_decodes_exactly_like_a_fresh_decoder(series: list, data: st.DataObject) -> None:
    heads = _heads(series)
    decoder = V1Decoder()
    first = _text(heads, data.draw(st.lists(GOOD_VALUE, min_size=len(heads), max_size=len(heads))))
    decoder.decode(select(first, ALL_PREFIXES), TIMING)
    values = data.draw(st.lists(ANY_VALUE, min_size=len(heads), max_size=len(heads)))
    second = _text(heads, values)
    fast = decoder.decode_known(select(second, ALL_PREFIXES), TIMING)
    slow = _decode_fresh(second)
    if all(isinstance(v, float) for v in values):
        assert fast is not None, "same lines, clean values: the fast path must be taken"
    if fast is not None:
        assert fast == slow


@settings(max_examples=100, deadline=None)
@given(st.lists(SERIES, min_size=1, max_size=3), st.lists(SERIES, min_size=1, max_size=3))
def test_a_different_layout_is_never_decoded_from_the_old_one(before: list, after: list) -> None:
    old, new = _heads(before), _heads(after)
    decoder = V1Decoder()
    decoder.decode(select(_text(old, [1.0] * len(old)), ALL_PREFIXES), TIMING)
    fast = decoder.decode_known(select(_text(new, [2.0] * len(new)), ALL_PREFIXES), TIMING)
    assert (fast is None) == (old != new)


def test_lines_with_timestamps_never_take_the_fast_path() -> None:
    text = ('vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 10 1700000000000\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 5 1700000000000\n')
    decoder = V1Decoder()
    (reading,) = decoder.decode(select(text, ALL_PREFIXES), TIMING).series
    assert (reading.draft_tokens, reading.accepted_tokens) == (10.0, 5.0)
    assert decoder.decode_known(select(text, ALL_PREFIXES), TIMING) is None


def _collector(clock: ManualClock) -> TargetCollector:
    target = TargetConfig(name="vllm", url="http://127.0.0.1:1/metrics")
    config = Config(targets=(target,), windows=parse_windows("1m,5m", "windows"), collect=CollectSection(interval=5.0))
    store = Store(keep_seconds=config.longest_window + 10.0, stale_after=config.collect.stale_after)
    return TargetCollector(target, config, store, clock)


def _ingest(collector: TargetCollector, clock: ManualClock, body: bytes, slow: bool) -> None:
    timing = FetchTiming(clock() - 0.01, clock())
    if slow:  # what ingest does, but always parsing: decode() never takes the known layout's fast path
        decoded = collector.decode(select(body.decode(), ALL_PREFIXES), timing)
        collector.store.update(collector.config.name, decoded.series, decoded.pending, clock())
    else:
        collector.ingest(FetchResult(timing=timing, body=body, content_type="text/plain; version=0.0.4"))
    collector.publish(up=True, duration=0.0)


@pytest.mark.parametrize("fmt", ["v1", "v1-multiproc", "v1-openmetrics"])
def test_collector_views_are_the_same_with_and_without_the_fast_path(fmt: str) -> None:
    """Restarts, an engine joining and a NaN counter: the fast collector's views equal the slow one's."""
    specs = (ModelSpec(name="a", engines=2, num_speculative_tokens=3), ModelSpec(name="b", engines=1))
    sim = Simulator(Scenario(models=specs, format=fmt), clock=lambda: 0.0)
    wider = Simulator(Scenario(models=(*specs, ModelSpec(name="c", engines=1)), format=fmt), clock=lambda: 0.0)
    clocks = ManualClock(), ManualClock()
    fast, slow = _collector(clocks[0]), _collector(clocks[1])
    fast_path_taken = 0
    for step in range(40):
        sim.advance(5.0)
        wider.advance(5.0)
        if step == 15:
            sim.restart()
        body = render(fmt, (wider if 20 <= step < 25 else sim).snapshot())
        if step == 30:
            body = re.sub(rb'(_draft_tokens_total\{engine="0",model_name="a"\}) \S+', rb"\1 NaN", body, count=1)
            assert b"NaN" in body
        for clock in clocks:
            clock.advance(5.0)
        known = fast.decoder is not None and fast.decoder.decode_known(
            select(body.decode(), ALL_PREFIXES), TIMING) is not None
        fast_path_taken += known
        _ingest(fast, clocks[0], body, slow=False)
        _ingest(slow, clocks[1], body, slow=True)
        assert fast.view is not None and slow.view is not None
        assert fast.view.series == slow.view.series, f"step {step}"
    assert fast_path_taken >= 30


COUNT = st.floats(min_value=0, max_value=1e9, allow_nan=False)


@st.composite
def totals(draw: st.DrawFn, k: int, optional: bool) -> Totals:
    return Totals(draw(COUNT), draw(COUNT), None if optional and draw(st.booleans()) else draw(COUNT),
                  None if optional and draw(st.booleans()) else draw(COUNT),
                  tuple(draw(st.lists(COUNT, min_size=k, max_size=k))))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=8), st.integers(min_value=0, max_value=8), st.data(),
       st.floats(min_value=0, max_value=3600), st.one_of(st.none(), st.integers(min_value=1, max_value=8)))
def test_span_stats_equal_the_stats_of_the_delta(k_start: int, k_end: int, data: st.DataObject, seconds: float,
                                                  k: int | None) -> None:
    start = data.draw(totals(k_start, optional=True))
    end = data.draw(totals(k_end, optional=True))
    cost = CostModel(0.1, 0.4)
    # The delta, written out here independently of the store's helpers.
    drafts = None if end.drafts is None or start.drafts is None else end.drafts - start.drafts
    same_k = len(end.accepted_by_position) == len(start.accepted_by_position)
    pairs = zip(start.accepted_by_position, end.accepted_by_position, strict=True) if same_k else ()
    positions = tuple(b - a for a, b in pairs)
    assert span_stats(WindowSpan(seconds, start, end), cost, k) == counts_stats(
        seconds, end.draft_tokens - start.draft_tokens, end.accepted_tokens - start.accepted_tokens, drafts,
        positions, cost, k)
