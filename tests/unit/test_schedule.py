"""The batch-size schedule: the k that maximises the modelled speedup in each batch-size range, from the acceptance
and the time seen at each batch size and the cost model at that batch; and the advice as vLLM and TensorRT-LLM
read it (their validation rules, restated from their sources, are checked here on what we print)."""

from __future__ import annotations

import itertools
import json

import pytest

from specdecode_exporter.core.contract.metrics import BATCH_SIZE_RANGES
from specdecode_exporter.pipeline.batches import NO_BINS, BatchBin
from specdecode_exporter.pipeline.derive import CostModel
from specdecode_exporter.pipeline.schedule import (
    Calibration,
    LazySchedule,
    batch_size_schedule,
    trtllm_draft_len_schedule,
    vllm_speculative_config,
)

CURVE = (0.9, 0.8, 0.7)  # P(accepted prefix > i): an EAGLE-like drafter
COST = CostModel(c_draft=0.1, c_verify=0.4, c_verify_max=1.0, saturating_batch=64.0)


def speedup(k: int, cost: float, curve: tuple[float, ...] = CURVE) -> float:
    return (1 + sum(curve[:k])) / (1 + k * cost)


def cost_at(batch: float) -> float:
    return 0.1 + 0.4 + (1.0 - 0.4) * min(1.0, batch / 64)


def bins(**seconds_at: tuple[float, float]) -> tuple[BatchBin, ...]:
    """Bins with (seconds, mean batch) in the named ranges (r0 … r4), no drafts of their own."""
    out = list(NO_BINS)
    for name, (seconds, batch) in seconds_at.items():
        out[int(name[1:])] = BatchBin(seconds, seconds * batch)
    return tuple(out)


def test_long_drafts_at_small_batches_short_at_medium_none_where_verification_is_compute_bound() -> None:
    schedule = batch_size_schedule(NO_BINS, CURVE, COST)
    assert schedule is not None
    assert [r.label for r in schedule.ranges] == ["1-4", "5-16", "17-64", "65-256", "257-1024"]
    # unobserved ranges are judged at their geometric middle: 2, 8.9, 33, 129, 513
    assert [round(r.batch, 1) for r in schedule.ranges] == [2.0, 8.9, 33.0, 129.0, 513.0]
    assert [r.recommended for r in schedule.ranges] == [3, 3, 1, 0, 0]
    middle = schedule.ranges[2]
    assert middle.cost_per_draft_token == pytest.approx(cost_at(middle.batch))
    assert middle.speedup_recommended == pytest.approx(speedup(1, cost_at(middle.batch)))
    assert middle.speedup_fixed == pytest.approx(speedup(3, cost_at(middle.batch)))
    assert schedule.ranges[3].speedup_recommended == 1.0  # plain decoding
    assert schedule.expected_gain is None  # no time seen at any batch size: no weighted claim


def test_the_gain_weighs_each_range_by_the_time_spent_there_at_its_observed_batch() -> None:
    schedule = batch_size_schedule(bins(r0=(600.0, 3.0), r2=(600.0, 40.0)), CURVE, COST)
    assert schedule is not None
    low, middle = schedule.ranges[0], schedule.ranges[2]
    assert (low.batch, middle.batch) == (3.0, 40.0)
    fixed = 600 * speedup(3, cost_at(3)) + 600 * speedup(3, cost_at(40))
    chosen = 600 * speedup(low.recommended, cost_at(3)) + 600 * speedup(middle.recommended, cost_at(40))
    assert schedule.expected_gain == pytest.approx(chosen / fixed)
    assert schedule.expected_gain > 1.0


def test_a_range_with_enough_drafts_uses_its_own_acceptance() -> None:
    own = list(NO_BINS)
    own[0] = BatchBin(60.0, 120.0, 1000.0, 3000.0, (700.0, 300.0, 100.0))  # a poorer drafter at small batches
    schedule = batch_size_schedule(tuple(own), CURVE, COST)
    assert schedule is not None
    assert schedule.ranges[0].own_acceptance and not schedule.ranges[1].own_acceptance
    assert schedule.ranges[0].recommended == 1  # (1 + 0.7) / (1 + c) beats the longer drafts with 0.3 and 0.1
    few = list(NO_BINS)
    few[0] = BatchBin(60.0, 120.0, 50.0, 150.0, (25.0, 12.0, 5.0))  # too few drafts to trust
    assert not batch_size_schedule(tuple(few), CURVE, COST).ranges[0].own_acceptance  # type: ignore[union-attr]


def test_a_larger_batch_never_gets_a_longer_k() -> None:
    great = list(NO_BINS)
    great[2] = BatchBin(60.0, 2400.0, 1000.0, 3000.0, (1000.0, 1000.0, 1000.0))  # every draft accepted at 17-64
    poor = (0.5, 0.2, 0.05)
    schedule = batch_size_schedule(tuple(great), poor, COST)
    assert schedule is not None
    ks = [r.recommended for r in schedule.ranges]
    assert ks == sorted(ks, reverse=True)
    assert schedule.ranges[2].recommended <= schedule.ranges[1].recommended


def test_a_calibrated_cost_moves_every_range_by_what_it_moved_the_measured_batch() -> None:
    calibration = Calibration(cost_per_draft_token=cost_at(8) + 0.2, batch=8.0)
    schedule = batch_size_schedule(NO_BINS, CURVE, COST, calibration)
    assert schedule is not None and schedule.cost_basis == "calibrated"
    for advice in schedule.ranges:
        assert advice.cost_per_draft_token == pytest.approx(cost_at(advice.batch) + 0.2)
    assert [r.recommended for r in schedule.ranges] == [2, 1, 0, 0, 0]


def test_without_a_per_position_curve_there_is_no_schedule() -> None:
    assert batch_size_schedule(NO_BINS, (), COST) is None


def vllm_accepts(schedule: list[list[int]]) -> None:
    """vLLM's validate_and_normalize_dynamic_sd_schedule (vllm/v1/spec_decode/dynamic/utils.py), 3-item form."""
    assert isinstance(schedule, list) and schedule
    previous_end = 0
    for low, high, k in sorted(schedule):
        assert low > 0 and high > 0 and low <= high and k >= 0
        assert low > previous_end, "batch-size ranges must be non-overlapping and sorted"
        previous_end = high
    assert min(low for low, _, _ in schedule) == 1, "the first batch-size range must start at 1"


def test_the_vllm_config_is_what_vllm_validates() -> None:
    schedule = batch_size_schedule(NO_BINS, CURVE, COST)
    assert schedule is not None
    flag = vllm_speculative_config(schedule, "eagle3")
    assert flag is not None and flag.startswith("--speculative-config '") and flag.endswith("'")
    config = json.loads(flag.removeprefix("--speculative-config '").removesuffix("'"))
    assert config == {"method": "eagle3", "num_speculative_tokens": 3,
                      "num_speculative_tokens_per_batch_size": [[1, 16, 3], [17, 64, 1], [65, 1024, 0]]}
    vllm_accepts(config["num_speculative_tokens_per_batch_size"])
    # every runtime batch size up to the last range's top has exactly one entry
    covered = [b for low, high, _ in config["num_speculative_tokens_per_batch_size"] for b in range(low, high + 1)]
    assert covered == list(range(1, BATCH_SIZE_RANGES[-1][1] + 1))


def trtllm_accepts(max_draft_len: int, schedule: dict[int, int]) -> None:
    """TensorRT-LLM's DecodingBaseConfig.validate_draft_len_schedule_and_sort (tensorrt_llm/llmapi/llm_args.py)."""
    assert all(batch >= 1 and length >= 0 for batch, length in schedule.items())
    assert schedule[min(schedule)] == max_draft_len
    assert all(length <= max_draft_len for length in schedule.values())


def test_the_trtllm_schedule_is_what_trtllm_validates() -> None:
    schedule = batch_size_schedule(NO_BINS, CURVE, COST)
    assert schedule is not None
    text = trtllm_draft_len_schedule(schedule)
    assert text == "speculative_config: {max_draft_len: 3, draft_len_schedule: {16: 3, 64: 1}}"
    trtllm_accepts(3, {16: 3, 64: 1})  # keys: the largest batch of each length; above 64 speculation is off


def test_no_paste_when_no_batch_size_pays() -> None:
    schedule = batch_size_schedule(NO_BINS, (0.1, 0.01, 0.0), COST)
    assert schedule is not None and {r.recommended for r in schedule.ranges} == {0}
    assert vllm_speculative_config(schedule) is None and trtllm_draft_len_schedule(schedule) is None


def test_an_unknown_method_is_left_out() -> None:
    schedule = batch_size_schedule(NO_BINS, CURVE, COST)
    assert schedule is not None
    for method in (None, "unknown"):
        flag = vllm_speculative_config(schedule, method)
        assert flag is not None and "method" not in flag


def test_ranges_are_contiguous_from_one() -> None:
    assert BATCH_SIZE_RANGES[0][0] == 1
    for (_, high), (low, _) in itertools.pairwise(BATCH_SIZE_RANGES):
        assert low == high + 1


def test_a_lazy_schedule_is_the_schedule_of_its_window_and_equal_by_its_inputs() -> None:
    start = NO_BINS
    end = bins(r0=(600.0, 3.0), r2=(600.0, 40.0))
    lazy = LazySchedule(start, end, CURVE, COST, None)
    assert lazy.get() == batch_size_schedule(end, CURVE, COST) and lazy.get() is lazy.get()
    assert lazy == LazySchedule(start, end, CURVE, COST, None) != LazySchedule(start, end, CURVE, COST,
                                                                              Calibration(0.6, 8.0))
