"""TensorRT-LLM ``trtllm-serve`` (tensorrt_llm/metrics/collector.py; labels set in serve/openai_server.py), whose
Prometheus text is at ``/prometheus/metrics`` (plain ``/metrics`` is JSON iteration stats).

Used:

* ``trtllm_spec_decode_num_draft_tokens_total`` / ``…_num_accepted_tokens_total``: drafted and accepted draft
  tokens (bonus excluded), added every iteration: exact α. They appear with the first iteration that drafted, and
  only with ``enable_iter_perf_stats``; absent, they are unknown (not 0).
* ``trtllm_speculative_config_info{spec_enabled="true",spec_method,spec_num_tokens}``: the method (lower-cased:
  ``MTP`` → ``mtp``) and k (``max_draft_len``), so neither needs configuring.
* ``trtllm_generation_tokens_total``: every generated token, speculative steps or not: with the drafted tokens it
  tells speculation that stopped while generation goes on (the acceptance gate, ``acceptance_rate_window_size`` /
  ``acceptance_rate_threshold`` since TensorRT-LLM#12905, switches it off for good).
* ``trtllm_spec_decode_acceptance_length``: the engine's mean acceptance length of the last iteration it polled,
  passed through as ``specdecode_reported_acceptance_length``. Its samples carry ``pid`` (multiprocess gauges in
  mode "all" keep dead processes' values too): it is passed on only when the pids agree on one value.

* ``trtllm_spec_decode_{drafted,accepted}_tokens_total{token_position}`` (added per request at its completion,
  positions up to the last one drafted; a position never accepted has no accepted series): drafted[i] counts the
  drafts that reached position i, so drafted[0] is the drafts, Σ drafted / drafted[0] the mean draft length and
  accepted[i] / drafted[i] the per-position acceptance, even when ``draft_len_schedule`` varies the length with the
  batch size. accepted[i] is read as "drafts whose accepted prefix is longer than i" (a chain accepts a prefix);
  where the engine fills the per-request arrays was not found in its source (docs/engines.md). They become
  ``drafted_by_position`` / ``accepted_by_position``; the drafts stay None (no ``specdecode_drafts_total``): the
  per-position family moves at request completion, the token counters every iteration, so drafts are never divided
  into the iteration counters.

Not used, and why:

* No drafts (verification steps) counter exists; until the first speculative request completes (no per-position
  family yet) the windows' mean acceptance length is 1 + k·α (the derive step divides drafted tokens by k), exact
  only when every draft is k tokens long, and the mean draft length is absent (not measured).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdecode_exporter.core.contract.metrics import REPORTED_ACCEPTANCE_LENGTH, MetricSpec
from specdecode_exporter.pipeline.engines.base import (
    DecodeResult,
    DecoderOptions,
    FetchTiming,
    SeriesGrouper,
    SeriesReading,
)
from specdecode_exporter.pipeline.parse import Sample, Selection, is_finite_count

DRAFT_TOKENS = "trtllm_spec_decode_num_draft_tokens_total"
ACCEPTED = "trtllm_spec_decode_num_accepted_tokens_total"
GENERATION = "trtllm_generation_tokens_total"
ACCEPTANCE_LENGTH = "trtllm_spec_decode_acceptance_length"
CONFIG_INFO = "trtllm_speculative_config_info"
DRAFTED_BY_POSITION = "trtllm_spec_decode_drafted_tokens_total"
ACCEPTED_BY_POSITION = "trtllm_spec_decode_accepted_tokens_total"


def _speculation(sample: Sample) -> tuple[str | None, int | None] | None:
    """(method, k) from a config info sample; None when it says speculation is off."""
    if sample.label("spec_enabled") != "true":
        return None
    method = (sample.label("spec_method") or "").strip().lower() or None
    tokens = sample.label("spec_num_tokens") or ""
    return method, int(tokens) if tokens.isdigit() and int(tokens) > 0 else None


def _counter(samples: Sequence[Sample], indices: list[int], name: str) -> float | str | None:
    """The first sample of a counter in a group; None when absent, a message when unusable."""
    value = next((samples[i].value for i in indices if samples[i].name == name), None)
    if value is not None and not is_finite_count(value):
        return f"{name} has unusable value {value}"
    return value


def _reported_length(samples: Sequence[Sample], indices: list[int]) -> tuple[tuple[MetricSpec, float], ...]:
    values = {samples[i].value for i in indices if samples[i].name == ACCEPTANCE_LENGTH}
    if len(values) != 1:
        return ()  # none yet, or stale values of dead processes beside the live one
    (length,) = values
    return ((REPORTED_ACCEPTANCE_LENGTH, length),) if math.isfinite(length) and length >= 1 else ()


def _by_position(samples: Sequence[Sample], indices: list[int], name: str) -> dict[int, float] | str:
    """A per-position family of one series: {position: value}, or what is wrong with it."""
    values: dict[int, float] = {}
    for i in indices:
        sample = samples[i]
        if sample.name != name:
            continue
        position = sample.label("token_position") or ""
        if not position.isdigit():
            return f"{name} has token_position label {position!r}"
        if not is_finite_count(sample.value):
            return f"{name} has unusable value {sample.value}"
        values.setdefault(int(position), sample.value)
    return values


def _positions(samples: Sequence[Sample], indices: list[int]) -> tuple[tuple[float, ...], tuple[float, ...]] | str:
    """(drafted, accepted) by position 0…n−1, accepted padded with 0 where a position has no accepted series yet;
    both empty before the first speculative request completes."""
    drafted, accepted = (_by_position(samples, indices, DRAFTED_BY_POSITION),
                         _by_position(samples, indices, ACCEPTED_BY_POSITION))
    if isinstance(drafted, str) or isinstance(accepted, str):
        return drafted if isinstance(drafted, str) else str(accepted)
    n = max(drafted, default=-1) + 1
    if len(drafted) != n:
        return f"{DRAFTED_BY_POSITION} has gaps ({sorted(drafted)})"
    if any(position >= n for position in accepted):
        return f"{ACCEPTED_BY_POSITION} has positions no draft reached ({sorted(accepted)})"
    return tuple(drafted[i] for i in range(n)), tuple(accepted.get(i, 0.0) for i in range(n))


class TrtllmDecoder:
    """Stateless apart from its label-set cache; no fast path (a handful of lines, parsed through the line cache)."""

    def __init__(self) -> None:
        self._grouper = SeriesGrouper(("model_name",))

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        return None

    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult:
        samples = selection.samples()
        result = DecodeResult()
        for (model_name,), indices in self._grouper.group(samples).items():
            configs = [_speculation(samples[i]) for i in indices if samples[i].name == CONFIG_INFO]
            speculation = next((c for c in configs if c is not None), None)
            drafted, accepted = _counter(samples, indices, DRAFT_TOKENS), _counter(samples, indices, ACCEPTED)
            generated = _counter(samples, indices, GENERATION)
            if speculation is None and drafted is None:
                continue  # speculation off: nothing of this model to report
            positions = _positions(samples, indices)
            problem = next((p for p in (drafted, accepted, generated, positions) if isinstance(p, str)), None)
            if problem is not None:
                result.pending.append((model_name, None))
                result.warnings.append(f"model_name={model_name}: {problem}")
                continue
            assert not isinstance(drafted, str) and not isinstance(accepted, str) and not isinstance(generated, str)
            assert not isinstance(positions, str)
            if drafted is None:
                result.warnings.append(f"model_name={model_name}: no token counters yet (they appear with the "
                                       "first iteration that drafts, and only with enable_iter_perf_stats: true)")
            method, k = speculation if speculation is not None else (None, None)
            result.series.append(SeriesReading(
                model_name=model_name,
                engine=None,
                draft_tokens=drafted,
                accepted_tokens=accepted,
                num_speculative_tokens=k,
                method=method,
                reported=_reported_length(samples, indices),
                generated_tokens=generated,
                accepted_by_position=positions[1],
                drafted_by_position=positions[0],
            ))
        return result


@dataclass(frozen=True)
class Trtllm:
    api: str = "trtllm"
    prefixes: tuple[str, ...] = (DRAFT_TOKENS, ACCEPTED, ACCEPTANCE_LENGTH, CONFIG_INFO, GENERATION,
                                 DRAFTED_BY_POSITION, ACCEPTED_BY_POSITION)
    max_collect_interval: float | None = None
    labels_model: bool = True

    def detect(self, samples: Sequence[Sample]) -> bool:
        return any(s.name == DRAFT_TOKENS or (s.name == CONFIG_INFO and _speculation(s) is not None)
                   for s in samples)

    def new_decoder(self, options: DecoderOptions) -> TrtllmDecoder:
        return TrtllmDecoder()


ENGINE = Trtllm()
