"""vLLM V1 engine (0.8.3 → current): true counters per (model_name, engine), with ``_created`` when a
single API server serves /metrics, without it in multiprocess mode. Also the OpenMetrics dialect."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.engines.base import DecodeResult, FetchTiming, SeriesReading, group_by_series
from exporter.parse import Sample, is_finite_count

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFTS_CREATED = "vllm:spec_decode_num_drafts_created"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
CREATED_SUFFIX = "_created"


def _reading(model_name: str | None, engine: str | None, samples: list[Sample]) -> SeriesReading | str:
    """Build one reading, or return why it cannot be trusted this time."""
    values: dict[str, float] = {}
    per_position: dict[int, float] = {}
    created: float | None = None
    for sample in samples:
        name = sample.name
        if name.endswith(CREATED_SUFFIX):
            # Any change of _created means the engine restarted.
            if math.isfinite(sample.value):
                created = sample.value
            continue
        if not is_finite_count(sample.value):
            return f"{name} has unusable value {sample.value}"
        if name == PER_POSITION:
            position = sample.label("position")
            if position is None or not position.isdigit():
                return f"{name} has position label {position!r}"
            per_position[int(position)] = sample.value
        else:
            values.setdefault(name, sample.value)  # a duplicate series: keep the first, like a scrape would
    if DRAFT_TOKENS not in values or ACCEPTED not in values:
        return "draft or accepted token counter missing"
    drafts = values.get(DRAFTS)
    by_position: tuple[float, ...] = ()
    if per_position:
        k = max(per_position) + 1
        if len(per_position) != k:
            return f"position series have gaps ({sorted(per_position)})"
        by_position = tuple(per_position[i] for i in range(k))
    return SeriesReading(
        model_name=model_name,
        engine=engine,
        drafts=drafts,
        draft_tokens=values[DRAFT_TOKENS],
        accepted_tokens=values[ACCEPTED],
        # Each verification step emits the accepted prefix plus one token from the target model.
        emitted_tokens=None if drafts is None else values[ACCEPTED] + drafts,
        accepted_by_position=by_position,
        created=created,
        num_speculative_tokens=len(by_position) or None,
    )


class V1Decoder:
    def decode(self, samples: Sequence[Sample], timing: FetchTiming) -> DecodeResult:
        result = DecodeResult()
        for (model_name, engine), group in group_by_series(samples, ("model_name", "engine")).items():
            reading = _reading(model_name, engine, group)
            if isinstance(reading, str):
                result.pending.append((model_name, engine))
                result.warnings.append(f"model_name={model_name} engine={engine}: {reading}")
            else:
                result.series.append(reading)
        return result


@dataclass(frozen=True)
class VllmV1:
    api: str = "vllm-v1"
    # Exact names, so the parser skips the other counters' _created lines (one _created tells a restart).
    prefixes: tuple[str, ...] = (DRAFTS, DRAFTS_CREATED, DRAFT_TOKENS, ACCEPTED, PER_POSITION)
    max_collect_interval: float | None = None

    def detect(self, samples: Sequence[Sample]) -> bool:
        return any(s.name == DRAFTS for s in samples)

    def new_decoder(self) -> V1Decoder:
        return V1Decoder()


ENGINE = VllmV1()
