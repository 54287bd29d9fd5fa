"""vLLM V0 engine (0.5.3 → 0.9.2).

V0 exports lifetime gauges and three counters with a bug that was never fixed upstream: at every stats
report (strictly more than 5 s apart) each counter is incremented by the *lifetime total*, not by the new
tokens. So a counter's increase between two of our fetches is

* 0 when no report happened in between,
* exactly the lifetime total at that report when exactly one report happened,
* a sum of several lifetime totals otherwise, which cannot be decoded.

We prove "exactly one report" from timing (the two fetches lie within 5 s of each other) and cross-check
the decoded ratio against the lifetime acceptance gauge. A decoded value is an absolute lifetime total,
so a missed report costs nothing: the next provable one gives the totals again. When nothing can be
proven we emit no reading rather than a wrong one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdecode_exporter.core.contract.metrics import LIFETIME_ACCEPTANCE
from specdecode_exporter.pipeline.engines.base import (
    DecodeResult,
    DecoderOptions,
    FetchTiming,
    SeriesGrouper,
    SeriesReading,
)
from specdecode_exporter.pipeline.parse import Sample, Selection, is_finite_count

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
EMITTED = "vllm:spec_decode_num_emitted_tokens_total"
ACCEPTANCE_RATE = "vllm:spec_decode_draft_acceptance_rate"
EFFICIENCY = "vllm:spec_decode_efficiency"
DRAFTS_V1 = "vllm:spec_decode_num_drafts_total"

REPORT_INTERVAL_S = 5.0  # vLLM V0 reports only when more than this has elapsed since the last report
RATIO_TOLERANCE = 1e-6


@dataclass(slots=True)
class _RawCounters:
    accepted: float
    draft_tokens: float
    emitted: float | None
    timing: FetchTiming


@dataclass(slots=True)
class _ModelState:
    previous: _RawCounters | None = None
    decoded: SeriesReading | None = None


def infer_num_speculative_tokens(draft_tokens: float, emitted: float, efficiency: float) -> int | None:
    """Solve V0's efficiency = emitted / ((draft_tokens / k) * (k + 1)) for an integer k, or None."""
    if draft_tokens <= 0 or efficiency <= 0 or not math.isfinite(efficiency):
        return None
    denominator = emitted / efficiency - draft_tokens
    if denominator <= 0:
        return None
    k = draft_tokens / denominator
    nearest = round(k)
    if nearest >= 1 and abs(k - nearest) <= 0.05:
        return nearest
    return None


def decode_report(
    previous: _RawCounters, current: _RawCounters, lifetime_ratio: float | None
) -> tuple[float, float, float | None] | str:
    """Lifetime (accepted, draft_tokens, emitted) at the single report between two fetches, or why not."""
    d_accepted = current.accepted - previous.accepted
    d_drafted = current.draft_tokens - previous.draft_tokens
    if current.timing.finished - previous.timing.started >= REPORT_INTERVAL_S:
        return "fetches more than 5 s apart: several V0 reports may have been summed"
    if d_drafted <= 0:
        return "no draft tokens in the report"
    if lifetime_ratio is not None and abs(d_accepted / d_drafted - lifetime_ratio) > RATIO_TOLERANCE:
        return "decoded totals disagree with the lifetime acceptance gauge"
    d_emitted = None
    if current.emitted is not None and previous.emitted is not None:
        d_emitted = current.emitted - previous.emitted
    return d_accepted, d_drafted, d_emitted


@dataclass
class V0Decoder:
    num_speculative_tokens: int | None = None  # from config, when given
    models: dict[str | None, _ModelState] = field(default_factory=dict)
    _grouper: SeriesGrouper = field(default_factory=lambda: SeriesGrouper(("model_name",)))

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        return None  # stateful: every fetch must go through decode()

    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult:
        result = DecodeResult()
        samples = selection.samples()
        groups = self._grouper.group(samples)
        # A model gone from the exposition loses its state (as vLLM loses it on restart): memory stays bounded
        # by what the current exposition holds.
        self.models = {name: state for name, state in self.models.items() if (name,) in groups}
        for (model_name,), indices in groups.items():
            values = {samples[i].name: samples[i].value for i in reversed(indices)}  # first occurrence wins
            state = self.models.setdefault(model_name, _ModelState())
            reading = self._decode_model(model_name, values, timing, state)
            if isinstance(reading, SeriesReading):
                result.series.append(reading)
            else:
                result.pending.append((model_name, None))
                if reading:
                    result.warnings.append(f"model_name={model_name}: {reading}")
        return result

    def _decode_model(
        self, model_name: str | None, values: dict[str, float], timing: FetchTiming, state: _ModelState
    ) -> SeriesReading | str:
        if ACCEPTED not in values or DRAFT_TOKENS not in values:
            return "V0 token counters missing"
        counters = (values[ACCEPTED], values[DRAFT_TOKENS], values.get(EMITTED, 0.0))
        if not all(is_finite_count(v) for v in counters):
            return f"unusable counter values {counters}"
        current = _RawCounters(values[ACCEPTED], values[DRAFT_TOKENS], values.get(EMITTED), timing)
        previous, state.previous = state.previous, current
        if previous is None:
            return ""  # the first sight only sets the baseline
        if current.accepted < previous.accepted or current.draft_tokens < previous.draft_tokens:
            state.decoded = None  # vLLM restarted; totals are unknown until the next provable report
            return "counters decreased (vLLM restarted)"
        if current.draft_tokens == previous.draft_tokens and current.accepted == previous.accepted:
            return state.decoded or ""  # no report since the last fetch: the lifetime totals still hold
        lifetime_ratio = values.get(ACCEPTANCE_RATE)
        decoded = decode_report(previous, current, lifetime_ratio)
        if isinstance(decoded, str):
            return decoded
        accepted, drafted, emitted = decoded
        k = self.num_speculative_tokens
        efficiency = values.get(EFFICIENCY)
        if k is None and emitted is not None and efficiency is not None:
            k = infer_num_speculative_tokens(drafted, emitted, efficiency)
        state.decoded = SeriesReading(
            model_name=model_name,
            engine=None,
            draft_tokens=drafted,
            accepted_tokens=accepted,
            drafts=drafted / k if k else None,  # V0 always drafts k tokens per sequence per step
            emitted_tokens=emitted,
            num_speculative_tokens=k,
            reported=() if lifetime_ratio is None else ((LIFETIME_ACCEPTANCE, lifetime_ratio),),
        )
        return state.decoded


@dataclass(frozen=True)
class VllmV0:
    api: str = "vllm-v0"
    prefixes: tuple[str, ...] = (ACCEPTED, DRAFT_TOKENS, EMITTED, ACCEPTANCE_RATE, EFFICIENCY)
    max_collect_interval: float | None = 2.0
    labels_model: bool = True

    def detect(self, samples: Sequence[Sample]) -> bool:
        names = {s.name for s in samples}
        return DRAFTS_V1 not in names and bool(names & {ACCEPTANCE_RATE, EFFICIENCY, EMITTED})

    def new_decoder(self, options: DecoderOptions) -> V0Decoder:
        return V0Decoder(num_speculative_tokens=options.num_speculative_tokens)


ENGINE = VllmV0()
