"""The batch-size schedule: for each batch-size range (metrics.BATCH_SIZE_RANGES), the number of speculative tokens
that maximises the modelled tokens per unit of time, and the same advice written as vLLM's
``num_speculative_tokens_per_batch_size`` and TensorRT-LLM's ``draft_len_schedule``.

Its evidence is what the sidecar measured over a window: the per-position acceptance in each range (the one of all
batch sizes where a range saw fewer than MIN_RANGE_DRAFTS drafts), the time spent in each range, and the cost of a
drafted token at the range's batch: the cost model's c_verify grown toward c_verify_max with the batch
(CostModel.per_draft_token_at), moved by as much as the calibration to the observed speedup moved it at the batch it
was measured at. Speedups are modelled: S(k') = (1 + Σ_{i<k'} r_i) / (1 + k'·c) (pipeline.derive).
"""

from __future__ import annotations

import itertools
import json
import math
from typing import NamedTuple

from specdecode_exporter.core.contract.metrics import BATCH_SIZE_RANGES, batch_size_label
from specdecode_exporter.pipeline.batches import BatchBin, bins_minus
from specdecode_exporter.pipeline.derive import (
    CostModel,
    position_acceptance_ratios,
    recommended_num_speculative_tokens,
)

MIN_RANGE_DRAFTS = 200.0  # drafts a range needs before its own per-position acceptance is used


class Calibration(NamedTuple):
    """The cost per drafted token that made the model match the observed speedup, and the batch it was seen at."""

    cost_per_draft_token: float
    batch: float | None


class RangeAdvice(NamedTuple):
    low: int
    high: int
    batch: float  # the batch the cost is taken at: the mean seen in the range, else the range's geometric middle
    observed_seconds: float  # time the engine spent at this batch size over the window
    own_acceptance: bool  # the range's own per-position acceptance (else all batch sizes')
    cost_per_draft_token: float
    recommended: int  # 0: plain decoding
    speedup_recommended: float
    speedup_fixed: float  # with today's k

    @property
    def label(self) -> str:
        return batch_size_label(self.low, self.high)

    @property
    def gain(self) -> float:
        return self.speedup_recommended / self.speedup_fixed if self.speedup_fixed > 0 else 1.0


class BatchSchedule(NamedTuple):
    num_speculative_tokens: int  # today's fixed k
    ranges: tuple[RangeAdvice, ...]
    cost_basis: str  # "calibrated" (moved by the observed speedup) or "configured"

    @property
    def observed_seconds(self) -> float:
        return math.fsum(r.observed_seconds for r in self.ranges)

    @property
    def expected_gain(self) -> float | None:
        """Tokens per unit of time with the schedule over today's fixed k, ranges weighted by the time spent in
        them (in a range, tokens per unit of time ∝ the modelled speedup); None without time in any range."""
        seconds = self.observed_seconds
        if seconds <= 0:
            return None
        fixed = math.fsum(r.observed_seconds * r.speedup_fixed for r in self.ranges)
        chosen = math.fsum(r.observed_seconds * r.speedup_recommended for r in self.ranges)
        return chosen / fixed if fixed > 0 else None

    @property
    def changes_anything(self) -> bool:
        return any(r.recommended != self.num_speculative_tokens for r in self.ranges)

    def entries(self) -> tuple[tuple[int, int, int], ...]:
        """(low, high, k) with neighbouring ranges of the same k joined."""
        out: list[tuple[int, int, int]] = []
        for r in self.ranges:
            if out and out[-1][2] == r.recommended:
                out[-1] = (out[-1][0], r.high, r.recommended)
            else:
                out.append((r.low, r.high, r.recommended))
        return tuple(out)


def _middle(low: int, high: int) -> float:
    return math.sqrt(low * high)


def _cost_at(cost: CostModel, batch: float, calibration: Calibration | None) -> float:
    modelled = cost.per_draft_token_at(batch)
    if calibration is None:
        return modelled
    offset = calibration.cost_per_draft_token - cost.per_draft_token_at(calibration.batch or 0.0)
    return max(0.0, modelled + offset)


def _speedups(ratios: tuple[float, ...], per_draft_token: float) -> tuple[float, ...]:
    """derive.speedup_by_length at a cost of its own: not through its cache, which holds the few costs the targets
    are configured with and would be churned by a cost per batch size."""
    return tuple([tokens / (1.0 + k * per_draft_token)
                  for k, tokens in enumerate(itertools.accumulate(ratios, initial=1.0)) if k > 0])


def _advice(low: int, high: int, counts: BatchBin, pooled: tuple[float, ...], cost: CostModel,
            calibration: Calibration | None, at_most: int) -> RangeAdvice:
    own = (counts.drafts >= MIN_RANGE_DRAFTS and len(counts.accepted_by_position) == len(pooled))
    ratios = position_acceptance_ratios(counts.accepted_by_position, counts.drafts) if own else pooled
    batch = counts.mean_batch if counts.mean_batch is not None else _middle(low, high)
    per_token = _cost_at(cost, batch, calibration)
    speedups = _speedups(ratios, per_token)
    recommended = min(recommended_num_speculative_tokens(speedups) or 0, at_most)
    chosen = speedups[recommended - 1] if recommended else 1.0
    return RangeAdvice(low, high, batch, max(0.0, counts.seconds), own, per_token, recommended, chosen,
                       speedups[-1])


def batch_size_schedule(bins: tuple[BatchBin, ...], pooled: tuple[float, ...], cost: CostModel,
                        calibration: Calibration | None = None) -> BatchSchedule | None:
    """The schedule from a window's counts by batch size and its per-position acceptance over all batch sizes
    (``pooled``: P(accepted prefix > i), i < k); None without a per-position curve. A larger batch never gets a
    longer k than a smaller one: its cost per drafted token is never lower, so a longer k there is noise."""
    k = len(pooled)
    if k == 0 or len(bins) != len(BATCH_SIZE_RANGES):
        return None
    ranges: list[RangeAdvice] = []
    at_most = k
    for (low, high), counts in zip(BATCH_SIZE_RANGES, bins, strict=True):
        advice = _advice(low, high, counts, pooled, cost, calibration, at_most)
        at_most = advice.recommended
        ranges.append(advice)
    return BatchSchedule(k, tuple(ranges), "calibrated" if calibration is not None else "configured")


class LazySchedule:
    """batch_size_schedule of one window, worked out on first use and kept: a collection makes one per series, and
    only a scrape of /metrics, the status page or `check` reads it. Logically immutable (the result depends on the
    inputs alone), so a view may hold it."""

    __slots__ = ("_calibration", "_cost", "_done", "_end", "_pooled", "_result", "_start")

    def __init__(self, start: tuple[BatchBin, ...], end: tuple[BatchBin, ...], pooled: tuple[float, ...],
                 cost: CostModel, calibration: Calibration | None) -> None:
        self._start, self._end, self._pooled = start, end, pooled
        self._cost, self._calibration = cost, calibration
        self._result: BatchSchedule | None = None
        self._done = False

    def _inputs(self) -> tuple[object, ...]:
        return self._start, self._end, self._pooled, self._cost, self._calibration

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazySchedule) and self._inputs() == other._inputs()

    def __hash__(self) -> int:
        return hash(self._inputs())

    def get(self) -> BatchSchedule | None:
        if not self._done:  # two threads may both compute it: the same value, so either may win
            self._result = batch_size_schedule(bins_minus(self._end, self._start), self._pooled, self._cost,
                                               self._calibration)
            self._done = True
        return self._result


def vllm_speculative_config(schedule: BatchSchedule, method: str | None = None) -> str | None:
    """vLLM's ``--speculative-config`` with the schedule (vllm/v1/spec_decode/dynamic/utils.py: [low, high, k]
    entries from batch size 1, non-overlapping; above the last entry its k holds; k is capped at
    num_speculative_tokens, which must be above 0). None when no range should speculate."""
    entries = schedule.entries()
    longest = max(k for _, _, k in entries)
    if longest == 0:
        return None
    config: dict[str, object] = {"method": method} if method and method not in ("unknown", "off") else {}
    config["num_speculative_tokens"] = longest
    config["num_speculative_tokens_per_batch_size"] = [list(entry) for entry in entries]
    return f"--speculative-config '{json.dumps(config)}'"


def trtllm_draft_len_schedule(schedule: BatchSchedule) -> str | None:
    """TensorRT-LLM's ``speculative_config`` keys (tensorrt_llm/llmapi/llm_args.py DecodingBaseConfig): each key of
    draft_len_schedule is the largest batch size of its draft length, above the largest key speculation is off, and
    the smallest key's length must equal max_draft_len. None when no range should speculate."""
    entries = [(high, k) for _, high, k in schedule.entries() if k > 0]
    if not entries:
        return None
    lengths = ", ".join(f"{high}: {k}" for high, k in entries)
    return f"speculative_config: {{max_draft_len: {entries[0][1]}, draft_len_schedule: {{{lengths}}}}}"


def schedule_summary(schedule: BatchSchedule) -> str:
    """The advice and its evidence in one sentence (status page, `check`, /api/v1/status)."""
    k = schedule.num_speculative_tokens
    ranges = ", ".join(f"{low}-{high}: k={chosen}" for low, high, chosen in schedule.entries())
    if not schedule.changes_anything:
        advice = f"today's fixed k = {k} is best at every batch size"
    else:
        advice = f"by batch size {ranges} (today k = {k} everywhere)"
    gain = schedule.expected_gain
    seen = ", ".join(f"{r.label} {r.observed_seconds / schedule.observed_seconds:.0%}" for r in schedule.ranges
                     if r.observed_seconds > 0)
    evidence = (f"modelled {gain - 1:+.1%} tokens per unit of time over fixed k = {k}, weighted by the time spent "
                f"at each batch size ({seen})" if gain is not None else
                "no time at any batch size yet: the gain is not weighed")
    return f"{advice}; {evidence}; cost {schedule.cost_basis}"
