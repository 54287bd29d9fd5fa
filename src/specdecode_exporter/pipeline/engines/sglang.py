"""SGLang (0.5.23: python/sglang/srt/observability/metrics_collector.py; the gauges are computed in
managers/scheduler_components/metrics_reporter.py).

SGLang exports no drafted-token and no accepted-token counter, so this sidecar has no α, no mean acceptance length,
no per-position curve, no interval histogram and no modelled speedup for it: those stay absent rather than being
estimated. What it does export:

* ``sglang:spec_verify_calls_total`` (tokenizer side, labels model_name and engine_type, no rank): one per request
  per verification step, added when the request finishes: vLLM's drafts, exactly, so it becomes
  ``specdecode_drafts_total``.
* ``sglang:spec_accept_length`` / ``sglang:spec_accept_rate`` (scheduler side, one series per DP rank): the engine's
  own figures over its last ``decode_log_interval`` decode batches (40 by default), not a time window and kept while
  idle. They pass through as ``specdecode_reported_acceptance_length`` / ``…_ratio`` and are never averaged.
* ``sglang:spec_num_steps`` / ``sglang:spec_num_draft_tokens``: k, when they describe a chain (num_draft_tokens =
  steps + 1, i.e. topk 1); a tree (topk > 1) has no single k.

The counter has no DP rank, the gauges have one (``dp_rank``, only with ``--dp-size`` > 1): the counter is the
series of (model_name, no engine), each rank's gauges the series of (model_name, engine=dp_rank). With one DP rank
both are the same series.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdecode_exporter.core.contract.metrics import REPORTED_ACCEPTANCE_LENGTH, REPORTED_ACCEPTANCE_RATIO, MetricSpec
from specdecode_exporter.pipeline.engines.base import (
    DecodeResult,
    DecoderOptions,
    FetchTiming,
    SeriesGrouper,
    SeriesReading,
)
from specdecode_exporter.pipeline.parse import Sample, Selection, is_finite_count

PREFIX = "sglang:spec_"
VERIFY_CALLS = "sglang:spec_verify_calls_total"
ACCEPT_LENGTH = "sglang:spec_accept_length"
ACCEPT_RATE = "sglang:spec_accept_rate"
NUM_STEPS = "sglang:spec_num_steps"
NUM_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"


def _gauges(samples: Sequence[Sample], indices: list[int]) -> dict[str, float]:
    """The first value of each gauge in a group (with --enable-metrics-for-all-schedulers every TP rank reports the
    same batches, so the first is as good as any)."""
    values: dict[str, float] = {}
    for i in indices:
        sample = samples[i]
        if sample.name != VERIFY_CALLS:
            values.setdefault(sample.name, sample.value)
    return values


def chain_length(gauges: dict[str, float]) -> int | None:
    """k of a chain draft: speculative_num_steps, when num_draft_tokens = steps + 1 (topk 1)."""
    steps, tokens = gauges.get(NUM_STEPS), gauges.get(NUM_DRAFT_TOKENS)
    if steps is None or tokens is None or not math.isfinite(steps) or steps < 1 or steps != int(steps):
        return None
    return int(steps) if tokens == steps + 1 else None


def reported(gauges: dict[str, float]) -> tuple[tuple[MetricSpec, float], ...]:
    """The engine's last-window figures. A length of 0 is SGLang's value with no speculation or before its first
    window (a real mean length is at least 1), so then neither figure is passed on."""
    length, rate = gauges.get(ACCEPT_LENGTH), gauges.get(ACCEPT_RATE)
    if length is None or not math.isfinite(length) or length < 1:
        return ()
    figures: list[tuple[MetricSpec, float]] = [(REPORTED_ACCEPTANCE_LENGTH, length)]
    if rate is not None and 0 <= rate <= 1:
        figures.append((REPORTED_ACCEPTANCE_RATIO, rate))
    return tuple(figures)


class SGLangDecoder:
    """Stateless apart from its label-set cache. There is no fast path: the few spec lines parse through the
    selection's line cache, one dict lookup each."""

    def __init__(self) -> None:
        self._grouper = SeriesGrouper(("model_name", "dp_rank"))

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        return None

    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult:
        samples = selection.samples()
        result = DecodeResult()
        groups = self._grouper.group(samples)
        gauges = {key: _gauges(samples, indices) for key, indices in groups.items()}
        k_by_model: dict[str | None, set[int | None]] = {}
        for (model_name, _), values in gauges.items():
            if NUM_STEPS in values:
                k_by_model.setdefault(model_name, set()).add(chain_length(values))
        for (model_name, engine), indices in groups.items():
            calls = [samples[i].value for i in indices if samples[i].name == VERIFY_CALLS]
            if not all(is_finite_count(v) for v in calls):
                result.pending.append((model_name, engine))
                result.warnings.append(f"model_name={model_name}: unusable {VERIFY_CALLS} {calls}")
                continue
            ks = k_by_model.get(model_name, set())
            result.series.append(SeriesReading(
                model_name=model_name,
                engine=engine,
                draft_tokens=None,  # not exported: no α, and none made up
                accepted_tokens=None,
                # Partitions of one count (engine_type, priority): their sum is the model's total.
                drafts=math.fsum(calls) if calls else None,
                num_speculative_tokens=next(iter(ks)) if len(ks) == 1 else None,
                reported=reported(gauges[(model_name, engine)]),
            ))
        return result


@dataclass(frozen=True)
class SGLang:
    api: str = "sglang"
    prefixes: tuple[str, ...] = (PREFIX,)
    max_collect_interval: float | None = None
    labels_model: bool = True

    def detect(self, samples: Sequence[Sample]) -> bool:
        """The verify-call counter, or gauges that say speculation is configured (a server without it sets 0)."""
        return any(s.name == VERIFY_CALLS or (s.name in (NUM_STEPS, NUM_DRAFT_TOKENS) and s.value > 0)
                   for s in samples)

    def new_decoder(self, options: DecoderOptions) -> SGLangDecoder:
        return SGLangDecoder()


ENGINE = SGLang()
