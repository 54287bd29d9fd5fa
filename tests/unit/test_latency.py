"""Latency math against values worked out by hand, and vLLM's latency families decoded from real output."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdecode_exporter.pipeline import latency
from specdecode_exporter.pipeline.derive import CostModel
from specdecode_exporter.pipeline.engines import ALL_PREFIXES, DecoderOptions
from specdecode_exporter.pipeline.engines.base import FetchTiming, LatencyReading, SeriesReading
from specdecode_exporter.pipeline.engines.vllm_v1 import ENGINE as V1
from specdecode_exporter.pipeline.latency import BaselineLatency, Histogram, LatencyStats
from specdecode_exporter.pipeline.parse import select
from specdecode_exporter.pipeline.store import SeriesKey, SeriesState
from tests.helpers import fixture_text

INF = math.inf
BOUNDS = (0.01, 0.025, 0.05, 0.1, INF)


def hist(counts: tuple[float, ...], total: float) -> Histogram:
    return Histogram(BOUNDS, counts, total)


def test_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    h = hist((0, 40, 90, 100, 100), 3.0)  # 40 in (0.01, 0.025], 50 in (0.025, 0.05], 10 in (0.05, 0.1]
    # p50: rank 50, in the third bucket: 0.025 + (0.05 − 0.025) · (50 − 40) / 50 = 0.03
    assert latency.quantile(0.5, h) == pytest.approx(0.03)
    # p99: rank 99, fourth bucket: 0.05 + 0.05 · (99 − 90) / 10 = 0.095
    assert latency.quantile(0.99, h) == pytest.approx(0.095)
    # p10: rank 10, second bucket: 0.01 + 0.015 · 10 / 40 = 0.01375
    assert latency.quantile(0.1, h) == pytest.approx(0.01375)
    # The lowest bucket starts at 0: 20 % of 5 in it → 0.01 · 1 / 5
    assert latency.quantile(0.2, hist((5, 5, 5, 5, 5), 0.02)) == pytest.approx(0.002)


def test_a_rank_in_the_inf_bucket_gives_the_highest_finite_bound() -> None:
    assert latency.quantile(0.99, hist((0, 0, 0, 50, 100), 100.0)) == 0.1


def test_no_observations_no_quantile_no_mean() -> None:
    empty = hist((0, 0, 0, 0, 0), 0.0)
    assert latency.quantile(0.5, empty) is None and latency.mean(empty) is None
    assert latency.mean(hist((0, 40, 90, 100, 100), 3.0)) == pytest.approx(0.03)


def test_accumulate_is_reset_safe_per_bucket() -> None:
    first = hist((1, 2, 3, 4, 4), 0.1)
    second = hist((2, 4, 6, 8, 8), 0.2)
    totals = latency.accumulate(None, None, first, restarted=False)
    totals = latency.accumulate(totals, first, second, restarted=False)
    assert list(totals.counts) == [2, 4, 6, 8, 8] and totals.total == pytest.approx(0.2)
    restarted = hist((1, 1, 1, 1, 1), 0.01)  # vLLM restarted: counts went down
    totals = latency.accumulate(totals, second, restarted, restarted=False)
    assert list(totals.counts) == [3, 5, 7, 9, 9] and totals.total == pytest.approx(0.21)


def test_a_windows_change_and_pooling_engines() -> None:
    start, end = hist((1, 2, 3, 4, 4), 0.1), hist((2, 4, 6, 8, 8), 0.3)
    delta = latency.change(start, end)
    assert delta is not None and list(delta.counts) == [1, 2, 3, 4, 4] and delta.total == pytest.approx(0.2)
    both = latency.pooled([delta, delta])
    assert both is not None and list(both.counts) == [2, 4, 6, 8, 8] and both.total == pytest.approx(0.4)
    other = Histogram((0.5, INF), (1, 1), 0.1)
    assert latency.change(start, other) is None and latency.pooled([delta, other]) is None


HISTOGRAM_COUNTS = st.lists(st.floats(min_value=0, max_value=1e9, allow_nan=False), min_size=5, max_size=5)


@given(HISTOGRAM_COUNTS, HISTOGRAM_COUNTS, st.floats(0, 1e6), st.floats(0, 1e6))
def test_a_change_worked_out_when_read_is_the_windows_change(start: list[float], end: list[float],
                                                            start_total: float, end_total: float) -> None:
    """A window's change is left to its first reader; it is change(), bit for bit, torn counts included."""
    first, last = hist(tuple(start), start_total), hist(tuple(end), end_total)
    lazy = latency.Change.between(first, last)
    assert lazy is not None and lazy.histogram == latency.change(first, last)
    assert lazy == latency.Change.known(lazy.histogram) and lazy.histogram is lazy.histogram  # worked out once


def test_a_change_between_different_histograms_is_none_and_stats_read_through() -> None:
    start, other = hist((1, 2, 3, 4, 4), 0.1), Histogram((0.5, INF), (1, 1), 0.1)
    assert latency.Change.between(start, other) is None and latency.Change.between(None, start) is None
    stats = LatencyStats(latency.Change.between(start, hist((2, 4, 6, 8, 8), 0.3)), None, 1.0, None)
    assert stats.time_per_output_token == latency.change(start, hist((2, 4, 6, 8, 8), 0.3))
    assert stats.time_to_first_token is None and stats.requests == 4 and stats.tpot_mean == pytest.approx(0.05)


def test_observed_speedup_and_calibration() -> None:
    # Spec decode: TPOT mean 0.030; a baseline at 0.0393 → 1.31×.
    current = LatencyStats(latency.Change.known(hist((0, 40, 90, 100, 100), 3.0)), None, 8.0, 0.0)
    observed = latency.observed_speedup(BaselineLatency(0.0393, 0.0393, 0.087, "control target c"), current)
    assert observed is not None
    assert observed.mean == pytest.approx(1.31)
    assert observed.p50 == pytest.approx(0.0393 / 0.03)
    assert observed.p99 == pytest.approx(0.087 / 0.095)  # < 1: the tail regressed
    # Calibration: L = 2.8, k̄ = 3, observed 1.4 → c = (2.8 / 1.4 − 1) / 3 = 1/3
    assert latency.calibrated_cost(1.4, 2.8, 3.0) == pytest.approx(1 / 3)
    assert latency.calibrated_cost(None, 2.8, 3.0) is None
    assert latency.calibrated_cost(5.0, 2.8, 3.0) == 0.0  # faster than any cost allows: c is 0, not negative


def test_cost_grows_with_the_batch() -> None:
    cost = CostModel(c_draft=0.1, c_verify=0.2, c_verify_max=1.0, saturating_batch=64)
    assert cost.per_draft_token_at(0) == pytest.approx(0.3)
    assert cost.per_draft_token_at(32) == pytest.approx(0.1 + 0.2 + 0.8 * 0.5)
    assert cost.per_draft_token_at(640) == pytest.approx(1.1)


def decode(name: str) -> list[SeriesReading]:
    text = fixture_text(name)
    return V1.new_decoder(DecoderOptions()).decode(select(text, ALL_PREFIXES), FetchTiming(0.0, 0.1)).series


def test_v1_reads_latency_from_the_real_capture() -> None:
    (reading,) = decode("vllm_0.32.0/metrics_ngram_per_request.prom")
    assert reading.latency is not None and reading.latency.time_per_output_token is not None
    tpot = reading.latency.time_per_output_token
    assert tpot.bounds[-1] == INF and len(tpot.bounds) == 20  # .01 … 80 and +Inf
    assert tpot.observations == 8.0  # vLLM counts the n=2 request twice
    assert reading.latency.running == 0.0 and reading.latency.time_to_first_token is not None
    assert reading.draft_tokens == 246.0


def test_v1_reads_a_control_target_without_spec_counters() -> None:
    text = fixture_text("vllm_0.32.0/metrics_nospec.prom")
    samples = select(text, ALL_PREFIXES).samples()
    assert not V1.detect(samples) and V1.detect_latency(samples)
    (reading,) = decode("vllm_0.32.0/metrics_nospec.prom")
    assert reading.draft_tokens is None and reading.accepted_tokens is None
    assert reading.latency is not None and reading.latency.time_per_output_token is not None


def test_windowed_running_requests_are_a_time_average() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    for t, running in ((0.0, 10.0), (5.0, 10.0), (10.0, 30.0), (15.0, 30.0)):
        state.update(SeriesReading("m", "0", 0.0, 0.0, latency=LatencyReading(running=running)), t, 3600)
    span = state.window_span(15.0, 15.0, 2.5)
    assert span is not None and span.end.running_seconds is not None and span.start.running_seconds is not None
    # 10 requests for 10 s, then 30 for 5 s (the value at each reading holds until the next): 250 / 15
    assert (span.end.running_seconds - span.start.running_seconds) / span.seconds == pytest.approx(250 / 15)


def _running_max_from_zero(counts: list[float]) -> list[float]:
    out, top = [], 0.0
    for count in counts:
        top = max(top, count)
        out.append(top)
    return out


@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.0])),
                max_size=12))
def test_monotonic_is_the_running_max_from_zero_sign_of_zero_included(counts: list[float]) -> None:
    """The sorted-input shortcut gives exactly what the running max gives, -0.0, NaN and ±Inf included."""
    got, want = latency.monotonic(counts), _running_max_from_zero(counts)
    assert [repr(v) for v in got] == [repr(v) for v in want]


def test_monotonic_of_sorted_counts_with_leading_negative_zeros() -> None:
    assert [repr(v) for v in latency.monotonic([-0.0, -0.0, 0.0, 2.0])] == ["0.0", "0.0", "0.0", "2.0"]


def _per_draft_token_at_with_builtins(cost: CostModel, running: float) -> float:
    """CostModel.per_draft_token_at as first written, with min()/max(): the conditionals must match it."""
    share = min(1.0, max(0.0, running) / cost.saturating_batch) if cost.saturating_batch > 0 else 1.0
    return cost.c_draft + cost.c_verify + (max(cost.c_verify, cost.c_verify_max) - cost.c_verify) * share


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(0.0, 2.0), st.floats(0.0, 2.0),
       st.one_of(st.floats(0.0, 2.0), st.just(math.nan)), st.sampled_from([64.0, 1.0, 0.0, -1.0, math.inf]))
def test_per_draft_token_at_matches_the_min_max_formula(running: float, c_draft: float, c_verify: float,
                                                       c_verify_max: float, saturating_batch: float) -> None:
    cost = CostModel(c_draft, c_verify, c_verify_max, saturating_batch)
    got, want = cost.per_draft_token_at(running), _per_draft_token_at_with_builtins(cost, running)
    assert repr(got) == repr(want)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=8), st.floats(0.0, 2.0))
def test_one_more_observation_adds_one_from_its_bucket_on(increments: list[int], value: float) -> None:
    bounds = (*(0.25 * (i + 1) for i in range(len(increments) - 1)), INF)
    counts = tuple(itertools.accumulate(increments))  # ints, as Histogram.empty starts them
    histogram = Histogram(bounds, counts, 1.0)
    first = next(i for i, bound in enumerate(histogram.bounds) if value <= bound)
    want = (*counts[:first], *(c + 1 for c in counts[first:]))
    got = histogram.observed(value)
    assert got.counts == want and [type(c) for c in got.counts] == [type(c) for c in want]
    assert got.total == 1.0 + value
