"""TensorRT-LLM ``trtllm-serve`` (tensorrt_llm/metrics/collector.py; labels set in serve/openai_server.py), whose
Prometheus text is at ``/prometheus/metrics`` (plain ``/metrics`` is JSON iteration stats).

Used:

* ``trtllm_spec_decode_num_draft_tokens_total`` / ``…_num_accepted_tokens_total``: drafted and accepted draft
  tokens (bonus excluded), added every iteration: exact α. They appear with the first iteration that drafted, and
  only with ``enable_iter_perf_stats``; absent, they are unknown (not 0).
* ``trtllm_speculative_config_info{spec_enabled="true",spec_method,spec_num_tokens}``: the method (lower-cased:
  ``MTP`` → ``mtp``) and k (``max_draft_len``), so neither needs configuring.
* ``trtllm_generation_tokens_total``: every generated token, speculative steps or not: with the drafted tokens it
  tells speculation that stopped while generation goes on (the acceptance gate, ``acceptance_length_threshold``,
  switches it off for good).
* ``trtllm_spec_decode_acceptance_length``: the engine's mean acceptance length of the last iteration it polled,
  passed through as ``specdecode_reported_acceptance_length``. Its samples carry ``pid`` (multiprocess gauges in
  mode "all" keep dead processes' values too): it is passed on only when the pids agree on one value.

Not used, and why:

* No drafts (verification steps) counter exists; the windows' mean acceptance length is then 1 + k·α (the derive
  step divides drafted tokens by k), exact only when every draft is k tokens long (MTP, fixed-length EAGLE).
* ``trtllm_spec_decode_{drafted,accepted}_tokens_total{token_position}``: where the engine fills these per-request
  arrays was not found in its source, so reading accepted[i] as "drafts whose accepted prefix is longer than i" would
  be a guess; they also move at request completion while the token counters move every iteration, and a position
  with nothing accepted has no series. They are not mapped onto the per-position contract.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdecode_exporter.core.metrics import REPORTED_ACCEPTANCE_LENGTH, MetricSpec
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
            problem = next((p for p in (drafted, accepted, generated) if isinstance(p, str)), None)
            if problem is not None:
                result.pending.append((model_name, None))
                result.warnings.append(f"model_name={model_name}: {problem}")
                continue
            assert not isinstance(drafted, str) and not isinstance(accepted, str) and not isinstance(generated, str)
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
            ))
        return result


@dataclass(frozen=True)
class Trtllm:
    api: str = "trtllm"
    prefixes: tuple[str, ...] = (DRAFT_TOKENS, ACCEPTED, ACCEPTANCE_LENGTH, CONFIG_INFO, GENERATION)
    max_collect_interval: float | None = None
    labels_model: bool = True

    def detect(self, samples: Sequence[Sample]) -> bool:
        return any(s.name == DRAFT_TOKENS or (s.name == CONFIG_INFO and _speculation(s) is not None)
                   for s in samples)

    def new_decoder(self, options: DecoderOptions) -> TrtllmDecoder:
        return TrtllmDecoder()


ENGINE = Trtllm()
