"""What speculation produces and costs, as pure functions: the speculative token share, counts by batch size, the
capacity of a window and against a control target, the verdict's capacity bounds, and the families vLLM exports
for them (the real 0.32.0 capture, and the proposed scheduled-steps counter)."""

from __future__ import annotations

import pytest

from specdecode_exporter.core.contract.verdict import CapacityBounds, Evidence, Verdict, VerdictBands, judge
from specdecode_exporter.pipeline.batches import NO_BINS, BatchBin, Interval, binned, bins_minus, range_index
from specdecode_exporter.pipeline.capacity import CapacityStats, against_control, capacity_stats, pooled
from specdecode_exporter.pipeline.derive import speculative_token_share
from specdecode_exporter.pipeline.engines import ALL_PREFIXES, DecoderOptions, FetchTiming, detect_engine
from specdecode_exporter.pipeline.engines.base import LatencyReading, SeriesReading
from specdecode_exporter.pipeline.latency import Histogram
from specdecode_exporter.pipeline.parse import select
from specdecode_exporter.pipeline.store import (
    Drafting,
    SeriesKey,
    SeriesState,
    Totals,
    WindowSpan,
    add_reading,
    drafting_after,
)
from specdecode_exporter.sidecar.series import stop_of
from tests.helpers import fixture_text


def decoded(name: str) -> SeriesReading:
    selection = select(fixture_text(name), ALL_PREFIXES)
    engine = detect_engine(selection.samples())
    assert engine is not None
    (series,) = engine.new_decoder(DecoderOptions()).decode(selection, FetchTiming(0.0, 0.1)).series
    return series


def test_the_real_capture_gives_generation_preemptions_and_kv_usage() -> None:
    series = decoded("captured_vllm_cpu_0.32.0_ngram.prom")
    assert (series.generated_tokens, series.preemptions) == (1280, 0)
    assert series.latency is not None and series.latency.kv_cache_usage == 0.0
    assert series.scheduled_steps == ()  # vLLM 0.32 has no scheduled-steps counter
    # ngram drafts only where it finds a match: 308 spec steps emitted 308 + 211 of the 1280 generated tokens
    assert speculative_token_share(series.emitted_tokens, series.generated_tokens) == pytest.approx(519 / 1280)


def test_the_proposed_scheduled_steps_counter_is_read_by_k() -> None:
    series = decoded("vllm_v1_scheduled_steps.prom")
    assert series.scheduled_steps == (120, 40, 0, 268)
    assert series.accepted_by_position == (152, 37, 22)


def test_a_control_pod_gives_generation_and_preemptions_without_spec_families() -> None:
    from specdecode_exporter.pipeline.engines import vllm_v1

    selection = select(fixture_text("vllm_0.32.0/metrics_nospec.prom"), vllm_v1.ENGINE.prefixes)
    (series,) = vllm_v1.ENGINE.new_decoder(DecoderOptions()).decode(selection, FetchTiming(0.0, 0.1)).series
    assert series.draft_tokens is None and series.generated_tokens == 120 and series.preemptions == 0


@pytest.mark.parametrize(("emitted", "generated", "share"), [
    (300.0, 300.0, 1.0), (0.0, 500.0, 0.0), (150.0, 600.0, 0.25), (10.0, 0.0, None), (None, 10.0, None),
    (5.0, None, None), (700.0, 600.0, 1.0),  # more than generated (a torn scrape): clamped, never above 1
])
def test_the_share_is_speculative_tokens_over_generated(emitted: float | None, generated: float | None,
                                                         share: float | None) -> None:
    assert speculative_token_share(emitted, generated) == share


@pytest.mark.parametrize(("batch", "index"), [(0.0, 0), (0.4, 0), (1, 0), (4, 0), (4.01, 1), (16, 1), (17, 2),
                                              (64, 2), (65, 3), (256, 3), (257, 4), (1024, 4), (5000, 4)])
def test_a_batch_falls_in_one_range(batch: float, index: int) -> None:
    assert range_index(batch) == index


def test_intervals_add_to_their_range_and_a_window_takes_the_difference() -> None:
    bins = binned(NO_BINS, Interval(5.0, 2.0, 100.0, 300.0, (80.0, 50.0, 20.0)))
    later = binned(bins, Interval(5.0, 40.0, 10.0, 30.0, (5.0, 2.0, 1.0)))
    later = binned(later, Interval(5.0, 3.0, 50.0, 150.0, (40.0, 20.0, 10.0)))
    assert later[0] == BatchBin(10.0, 25.0, 150.0, 450.0, (120.0, 70.0, 30.0))
    assert later[0].mean_batch == 2.5
    assert later[2] == BatchBin(5.0, 200.0, 10.0, 30.0, (5.0, 2.0, 1.0))
    window = bins_minus(later, bins)
    assert window[0] == BatchBin(5.0, 15.0, 50.0, 150.0, (40.0, 20.0, 10.0))
    assert window[1] == BatchBin() and window[1].mean_batch is None


def reading(drafts: float, accepted: float, generated: float, preemptions: float, running: float,
            kv: float, finished: float = 0.0, waiting: float = 0.0) -> SeriesReading:
    tpot = Histogram((0.1, float("inf")), (finished, finished), 0.05 * finished)
    return SeriesReading("m", "0", drafts * 3, accepted, drafts, accepted + drafts, (accepted,) * 0,
                         latency=LatencyReading(tpot, None, running, waiting, None, kv),
                         generated_tokens=generated, preemptions=preemptions)


def test_a_window_gives_share_throughput_preemptions_per_request_and_kv_usage() -> None:
    state = SeriesState(SeriesKey("t", "m", "0"))
    state.update(reading(0, 0, 0, 0, running=8, kv=0.5), 0.0, 3600)
    state.update(reading(100, 150, 250, 2, running=8, kv=0.7, finished=10, waiting=2), 10.0, 3600)
    state.update(reading(100, 150, 650, 6, running=8, kv=0.9, finished=30, waiting=2), 20.0, 3600)
    stats = capacity_stats(WindowSpan(20.0, state.snapshots[0], state.snapshots[-1]))
    assert stats is not None
    assert stats.speculative_token_share == pytest.approx(250 / 650)  # the second interval did not speculate
    assert stats.generated_tokens_per_second == pytest.approx(650 / 20)
    assert stats.preemptions_per_request == pytest.approx(6 / 30)
    assert stats.kv_cache_usage == pytest.approx((0.5 * 10 + 0.7 * 10) / 20)  # each gauge over the interval after it
    assert stats.requests_waiting == pytest.approx(1.0)
    # both intervals ran 8 requests: their time and drafts are in the 5-16 range
    assert state.totals.batch_bins[1].seconds == 20.0 and state.totals.batch_bins[1].drafts == 100


def test_a_restart_keeps_generation_and_preemptions_monotonic() -> None:
    totals = add_reading(Totals(), None, reading(10, 5, 100, 3, 1, 0.1), False)
    totals = add_reading(totals, reading(10, 5, 100, 3, 1, 0.1), reading(2, 1, 20, 1, 1, 0.1), True, 5.0)
    assert (totals.generated_tokens, totals.preemptions) == (120, 4)


def stats(generated: float, preemptions: float, finished: float, waiting: float, engines: int = 1) -> CapacityStats:
    return CapacityStats(100.0, None, generated, preemptions, finished, 0.5, waiting, engines)


def test_against_control_counts_throughput_only_while_the_spec_engine_queues() -> None:
    control = pooled([stats(8000, 0, 100, 0), stats(12000, 2, 100, 0)])
    assert control is not None
    assert control.generated_tokens_per_second == 100.0  # per engine
    assert control.preemptions_per_request == pytest.approx(0.01)  # pooled: 2 / 200, not a mean of ratios
    queued = against_control(stats(7000, 10, 100, 3.0), control, "control target c", 1.0)
    assert queued.throughput_ratio == pytest.approx(0.7)
    assert queued.preemptions_per_request_increase == pytest.approx(0.1 - 0.01)
    idle = against_control(stats(7000, 10, 100, 0.2), control, "control target c", 1.0)
    assert idle.throughput_ratio is None  # less demand is not less capacity


PAYING = (0.75, 1.4, 1.35, 1.3, 1.2, "control target c")  # α, modelled, observed mean, P50, P99, baseline


@pytest.mark.parametrize(("increase", "throughput", "verdict", "words"), [
    (None, None, Verdict.PAYING_OFF, None),
    (0.04, 0.95, Verdict.PAYING_OFF, None),
    (0.12, None, Verdict.MARGINAL, "0.12 more preemptions per request than the control"),
    (None, 0.8, Verdict.MARGINAL, "0.80× the control's generated tokens/s while requests wait"),
])
def test_a_speedup_that_preempts_or_cuts_throughput_is_not_paying_off(increase: float | None,
                                                                     throughput: float | None, verdict: Verdict,
                                                                     words: str | None) -> None:
    evidence = Evidence(*PAYING, preemptions_per_request_increase=increase, throughput_ratio=throughput)
    judgement = judge(evidence, VerdictBands(capacity=CapacityBounds(0.05, 0.9, 1.0)))
    assert judgement.verdict is verdict
    if words is not None:
        assert words in judgement.reason and judgement.reason.startswith("observed 1.35×")


def test_hurting_stays_hurting_whatever_the_capacity() -> None:
    evidence = Evidence(0.75, 1.4, 0.8, 0.8, 0.7, "c", preemptions_per_request_increase=0.5)
    assert judge(evidence, VerdictBands()).verdict is Verdict.HURTING


def test_tensorrt_llm_gives_its_generated_tokens() -> None:
    series = decoded("trtllm_spec.prom")
    assert series.generated_tokens == 314503  # trtllm_generation_tokens_total: a stop is generation without drafts
    assert series.draft_tokens == 327216 and series.drafts is None


def standstill(drafted_per_interval: float, idle_intervals: int) -> tuple[Drafting, Totals]:
    """A series that drafted ``drafted_per_interval`` tokens in each of 4 intervals of 1000 generated tokens, then
    generated on without drafting for ``idle_intervals``; running 8 while drafting, 40 after."""
    state = SeriesState(SeriesKey("t", "m", "0"))
    drafted = generated = 0.0
    for i in range(5 + idle_intervals):
        state.update(SeriesReading("m", "0", drafted, drafted / 2, drafted / 3, None, (),
                                   latency=LatencyReading(running=8.0 if i < 5 else 40.0),
                                   generated_tokens=generated), 5.0 * i, 3600)
        drafted += drafted_per_interval if i < 4 else 0.0
        generated += 1000.0
    return state.drafting, state.totals


def test_a_standstill_proves_a_stop_only_where_the_drafting_before_would_have_shown() -> None:
    drafting, latest = standstill(300.0, 2)
    assert (drafting.last_at, drafting.idle, drafting.idle_generated) == (20.0, 2, 2000.0)
    stop = stop_of(drafting, latest, ())
    assert stop is not None and (stop.since, stop.collections) == (20.0, 2)
    assert stop.configured is not None
    assert "running batch rose to 40 requests (it drafted at up to 8)" in stop.configured
    assert stop_of(*standstill(300.0, 1), ()) is None  # one collection: not yet
    # 3 drafted tokens per 1000 generated: 2000 generated without one is no proof (6 expected, not 10)
    assert stop_of(*standstill(3.0, 2), ()) is None
    assert stop_of(*standstill(3.0, 4), ()) is not None  # 12 expected


def test_drafting_again_after_a_standstill_is_remembered() -> None:
    drafting, _ = standstill(300.0, 3)
    before = Totals(draft_tokens=1200.0, generated_tokens=7000.0)
    after = Totals(draft_tokens=1300.0, generated_tokens=8000.0)
    again = drafting_after(drafting, before, after, 45.0, 6.0)
    assert (again.resumed_at, again.stopped_at, again.idle, again.last_at) == (45.0, 20.0, 0, 45.0)
    assert again.drafting_running == 6.0 and again.idle_running is None
