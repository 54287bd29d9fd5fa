"""Honest numbers when the draft length varies (issue 37, DESIGN.md §11): the worked examples of the issue by hand,
the cost model with proposed and verified draft lengths, and the engines' fixtures (TensorRT-LLM's
draft_len_schedule, vLLM's diffusion families) through decode, store and derive."""

from __future__ import annotations

import pytest

from specdecode_exporter.pipeline.derive import (
    CostModel,
    counts_stats,
    draft_counts,
    expected_speedup_split,
    per_position_over_drafted,
    span_stats,
    token_acceptance_probability,
    token_probability_over_drafted,
)
from specdecode_exporter.pipeline.engines import (
    ALL_PREFIXES,
    NOT_APPLICABLE,
    DecoderOptions,
    FetchTiming,
    detect_engine,
)
from specdecode_exporter.pipeline.engines.base import SeriesReading
from specdecode_exporter.pipeline.parse import select
from specdecode_exporter.pipeline.store import Store
from tests.helpers import fixture_text

COST = CostModel(c_draft=0.1, c_verify=0.4)  # c = 0.5


def read(text: str) -> list[SeriesReading]:
    selection = select(text, ALL_PREFIXES)
    engine = detect_engine(selection.samples())
    assert engine is not None
    result = engine.new_decoder(DecoderOptions()).decode(selection, FetchTiming(0.0, 0.01))
    assert not result.pending, result.warnings
    return result.series


def halved(reading: SeriesReading) -> SeriesReading:
    """The same series when every counter stood at half its value (an earlier collection)."""
    def half(v: float | None) -> float | None:
        return None if v is None else v / 2
    return reading._replace(draft_tokens=half(reading.draft_tokens), accepted_tokens=half(reading.accepted_tokens),
                            generated_tokens=half(reading.generated_tokens),
                            accepted_by_position=tuple(v / 2 for v in reading.accepted_by_position),
                            drafted_by_position=tuple(v / 2 for v in reading.drafted_by_position))


# ----- TensorRT-LLM draft_len_schedule: k = 4 configured, the schedule drafts 2 at the running batch size -----
def test_schedule_worked_example_by_hand() -> None:
    """Per-token acceptance 0.8, every draft 2 tokens long (1000 drafts): accepted 800 at position 0, 640 at 1.
    Drafted tokens / k would make 500 drafts of 4, a mean length of 1 + 4·0.72 = 3.88 and 3.88 / 3 = 1.29×; the
    drafts counted per position give 2.44 and 2.44 / 2 = 1.22×."""
    stats = counts_stats(60.0, 2000.0, 1440.0, None, (800.0, 640.0), COST, 4, (1000.0, 1000.0))
    assert stats is not None
    assert stats.acceptance_ratio == pytest.approx(0.72)
    assert stats.mean_draft_length == pytest.approx(2.0)
    assert stats.mean_acceptance_length == pytest.approx(2.44)
    assert stats.expected_speedup == pytest.approx(1.22)
    assert stats.position_acceptance_ratios == pytest.approx((0.8, 0.64))  # accepted[i] / drafted[i]
    assert stats.token_acceptance_probability == pytest.approx(0.8)
    assert stats.unproven is None
    # The same counts without the per-position family: drafts = drafted tokens / k, the length only assumed.
    assumed = counts_stats(60.0, 2000.0, 1440.0, None, (), COST, 4)
    assert assumed is not None and assumed.mean_acceptance_length == pytest.approx(3.88)
    assert assumed.expected_speedup == pytest.approx(3.88 / 3) and assumed.mean_draft_length is None


def test_schedule_fixture_through_decode_store_and_derive() -> None:
    (after,) = read(fixture_text("trtllm_draft_len_schedule.prom"))
    assert after.num_speculative_tokens == 4 and after.method == "eagle3"
    assert after.drafted_by_position == (50000, 50000) and after.accepted_by_position == (40000, 32000)
    store = Store(keep_seconds=3600, stale_after=600)
    store.update("t", [halved(after)], [], 0.0)
    (state,) = store.update("t", [after], [], 60.0)
    span = state.window_span(60.0, 60.0, 1.0)
    assert span is not None
    stats = span_stats(span, COST, after.num_speculative_tokens)
    assert stats is not None
    assert stats.acceptance_ratio == pytest.approx(72346 / 100480)
    assert stats.mean_draft_length == pytest.approx(2.0)
    assert stats.mean_acceptance_length == pytest.approx(2.44)
    assert stats.expected_speedup == pytest.approx(1.22)
    assert stats.recommended_num_speculative_tokens is not None


def test_a_position_no_draft_reached_ends_the_curve() -> None:
    assert per_position_over_drafted((80.0, 40.0, 0.0), (100.0, 50.0, 0.0)) == pytest.approx((0.8, 0.8))
    assert per_position_over_drafted((), ()) == ()


def test_per_position_drafted_counts_give_leviathans_p_as_the_fixed_length_formula_does() -> None:
    """Every draft 3 tokens long: Σ a_i / Σ d_i·r_(i−1) equals successes / (successes + rejections)."""
    accepted, drafts = (152.0, 37.0, 22.0), 308.0
    assert token_probability_over_drafted(accepted, (drafts,) * 3) == pytest.approx(
        token_acceptance_probability(sum(accepted), drafts, accepted, 3))


# ----- vLLM: a draft length that varies without per-position drafted counts -----
def test_varying_length_without_per_position_drafted_counts_leaves_the_curve_unproven() -> None:
    counts = draft_counts(2000.0, 1376.0, 1000.0, (800.0, 448.0, 128.0), ())
    assert counts.mean_draft_length == pytest.approx(2.0) and counts.positions == ()
    assert counts.unproven is not None and "2.00 of k = 3" in counts.unproven
    fixed = draft_counts(3000.0, 1952.0, 1000.0, (800.0, 640.0, 512.0), ())
    assert fixed.positions == pytest.approx((0.8, 0.64, 0.512)) and fixed.unproven is None


# ----- the cost model with proposed and verified draft lengths -----
def test_adaptive_verification_worked_example_by_hand() -> None:
    """Per-token acceptance 0.8, k = 3, half the steps trimmed to 1 before verification: per step 3 proposed, 2
    verified, 1.376 accepted (1.952 and 0.8 averaged). α over proposed tokens is 0.46 and charging verification
    for all three makes 2.376 / 2.5 = 0.95× (hurting); over verified tokens α is 0.69 and S = 2.376 / 2.1 = 1.13×."""
    length = 1 + 1.376
    assert expected_speedup_split(length, 3.0, 3.0, COST) == pytest.approx(0.9504)
    assert expected_speedup_split(length, 3.0, 2.0, COST) == pytest.approx(2.376 / 2.1)


def test_the_cost_model_refuses_a_guess_when_the_verified_length_is_unknown() -> None:
    assert expected_speedup_split(2.376, 3.0, None, COST) is None


# ----- vLLM diffusion -----
def test_diffusion_fixture_is_recognised_with_no_counts() -> None:
    text = fixture_text("vllm_diffusion.prom")
    selection = select(text, ALL_PREFIXES)
    engine = detect_engine(selection.samples())
    assert engine is not None and engine.api == "vllm-diffusion"
    assert NOT_APPLICABLE[engine.api] == "diffusion model: speculative decoding metrics do not apply"
    (series,) = read(text)
    assert (series.model_name, series.engine) == ("dream-7b", "0")
    assert series.draft_tokens is None and series.accepted_tokens is None and series.drafts is None
