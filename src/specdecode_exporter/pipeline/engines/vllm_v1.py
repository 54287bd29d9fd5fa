"""vLLM V1 engine (0.8.3 → current): true counters per (model_name, engine), with ``_created`` when a
single API server serves /metrics, without it in multiprocess mode. Also the OpenMetrics dialect."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specdecode_exporter.core.contract.adaptive_verification import withheld_why
from specdecode_exporter.pipeline.engines.base import (
    Decoder,
    DecodeResult,
    DecoderOptions,
    FetchTiming,
    LatencyReading,
    PositionLines,
    SeriesGrouper,
    SeriesReading,
    WithheldDraftTokens,
    known_layout_values,
)
from specdecode_exporter.pipeline.latency import Histogram, monotonic
from specdecode_exporter.pipeline.parse import Layout, Sample, Selection, is_finite_count

ADAPTIVE_VERIFICATION_WHY = withheld_why(
    "vllm:spec_decode_num_draft_tokens", "α, the draft length, the per-position curve and the modelled speedup",
    "specdecode_proposed_token_acceptance_ratio")
# What α means under a rejection sampling method that does not preserve the target model's distribution (the
# speculative config's rejection_sample_method, declared on the target: vLLM does not export it).
VERIFICATION_NOTES = {
    "fly": "lossy verification (rejection_sample_method fly): vLLM accepts some drafted tokens the target model "
           "rejected (FLy overrides an isolated rejection at an uncertain position when the next ones agree), and "
           "counts them as accepted, so α reads higher than the target model's acceptance and the output is not "
           "exactly the target model's",
    "synthetic": "synthetic rejection sampling: vLLM accepts drafts at the rate its speculative config sets, "
                 "whatever the target model says; α is that setting, not a measurement",
}
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFTS_CREATED = "vllm:spec_decode_num_drafts_created"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
# Draft tokens sent to verification, apart from the proposed ones DRAFT_TOKENS counts under adaptive verification
# (proposed upstream, vllm-project/vllm#58340): where a vLLM exports it, α is accepted over it.
VERIFIED_DRAFT_TOKENS = "vllm:spec_decode_num_verified_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
CREATED_SUFFIX = "_created"
# Latency and load (0.11+): the true per-request TPOT, TTFT, and the batch. Inter-token latency is per engine
# step under spec decode (1 … k+1 tokens), so it is not read: it would make a good α look like slow tokens.
TPOT = "vllm:request_time_per_output_token_seconds"
TTFT = "vllm:time_to_first_token_seconds"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# Per-request α as a histogram of finished requests: proposed upstream (vllm-project/vllm#44487), not merged yet.
# Read where a vLLM exports it, with whatever buckets it has: the distribution without the request tap.
REQUEST_ACCEPTANCE = "vllm:request_spec_decode_acceptance_rate"
# What speculation produces and costs: all generated tokens (the speculative token share), preemptions and the
# KV-cache usage (memory, against a control pod).
GENERATION = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# Scheduler steps by the k a batch-size schedule chose, 0 included: proposed upstream (vllm-project/vllm#54748),
# labelled num_spec_tokens = 0…k; read where a vLLM exports it.
SCHEDULED_STEPS = "vllm:spec_decode_scheduled_steps_total"
SCHEDULED_K_LABEL = "num_spec_tokens"
LATENCY_PREFIXES = (*(f"{family}{suffix}" for family in (TPOT, TTFT, REQUEST_ACCEPTANCE)
                       for suffix in ("_bucket", "_sum", "_count")), RUNNING, WAITING, KV_CACHE_USAGE)
COST_PREFIXES = (GENERATION, PREEMPTIONS, SCHEDULED_STEPS)
SPEC_NAMES = frozenset({DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION, VERIFIED_DRAFT_TOKENS})


@dataclass(frozen=True, slots=True)
class _HistogramSlots:
    bounds: tuple[float, ...]  # +Inf last
    buckets: tuple[int, ...]  # line index of each bound's bucket
    total: int  # line index of _sum


@dataclass(frozen=True, slots=True)
class _LatencySlots:
    tpot: _HistogramSlots | None
    ttft: _HistogramSlots | None
    running: int | None
    waiting: int | None
    request_acceptance: _HistogramSlots | None = None
    kv_cache_usage: int | None = None


@dataclass(frozen=True, slots=True)
class _Slots:
    """Where one series' counters sit in a selection: indices into its lines."""

    model_name: str | None
    engine: str | None
    draft_tokens: int | None  # None on a target without spec decode (a control): latency only
    accepted_tokens: int | None
    drafts: int | None
    created: int | None
    positions: tuple[int, ...]
    latency: _LatencySlots | None
    generated: int | None = None
    preemptions: int | None = None
    scheduled_steps: tuple[int, ...] = ()
    verified: int | None = None


def _bound(sample: Sample) -> float | None:
    le = sample.label("le")
    try:
        return None if le is None else float(le)
    except ValueError:
        return None


def _histogram_slots(name: str, first: dict[str, int], buckets: dict[str, dict[float, int]]) -> _HistogramSlots | None:
    """Where one histogram's lines are; None when it is absent or cannot be read (then it is left out, and
    the series' counters are still read)."""
    by_bound = buckets.get(name)
    total = first.get(f"{name}_sum")
    if not by_bound or total is None:
        return None
    bounds = tuple(sorted(by_bound))
    if bounds[-1] != math.inf:
        return None
    return _HistogramSlots(bounds, tuple(by_bound[b] for b in bounds), total)


def _latency_slots(first: dict[str, int], buckets: dict[str, dict[float, int]]) -> _LatencySlots | None:
    slots = _LatencySlots(_histogram_slots(TPOT, first, buckets), _histogram_slots(TTFT, first, buckets),
                          first.get(RUNNING), first.get(WAITING), _histogram_slots(REQUEST_ACCEPTANCE, first, buckets),
                          first.get(KV_CACHE_USAGE))
    return None if slots == _LatencySlots(None, None, None, None) else slots


def _slots(model_name: str | None, engine: str | None, group: list[tuple[int, Sample]]) -> _Slots | str:
    """Which line holds which counter of one series, or why the series cannot be read (from names and
    labels alone, so it holds for every scrape with the same layout)."""
    first: dict[str, int] = {}
    positions = PositionLines()
    scheduled = PositionLines(SCHEDULED_K_LABEL)
    buckets: dict[str, dict[float, int]] = {}
    created: int | None = None
    for index, sample in group:
        name = sample.name
        if name.endswith(CREATED_SUFFIX):
            created = index  # any change of _created means the engine restarted
        elif name in (PER_POSITION, SCHEDULED_STEPS):
            if (bad := (positions if name == PER_POSITION else scheduled).add(index, sample)) is not None:
                return bad
        elif name.endswith("_bucket"):
            bound = _bound(sample)
            if bound is not None:
                buckets.setdefault(name.removesuffix("_bucket"), {}).setdefault(bound, index)
        else:
            first.setdefault(name, index)  # a duplicate series: keep the first, like a scrape would
    latency = _latency_slots(first, buckets)
    has_tokens = DRAFT_TOKENS in first and ACCEPTED in first
    if not has_tokens and (latency is None or SPEC_NAMES & first.keys() or positions or scheduled):
        return "draft or accepted token counter missing"
    position_slots, scheduled_slots = positions.slots(), scheduled.slots()
    if isinstance(position_slots, str):
        return position_slots
    if isinstance(scheduled_slots, str):
        return f"{SCHEDULED_STEPS}: {scheduled_slots}"
    return _Slots(model_name, engine, first.get(DRAFT_TOKENS), first.get(ACCEPTED), first.get(DRAFTS), created,
                  position_slots, latency, first.get(GENERATION), first.get(PREEMPTIONS), scheduled_slots,
                  first.get(VERIFIED_DRAFT_TOKENS))


def _unusable_value(group: list[tuple[int, Sample]]) -> str | None:
    for _, sample in group:
        if sample.name.endswith(CREATED_SUFFIX):
            continue  # a bad _created only loses restart detection by timestamp
        if not is_finite_count(sample.value):
            return f"{sample.name} has unusable value {sample.value}"
    return None


def _value(values: Sequence[float], index: int | None) -> float | None:
    return None if index is None else values[index]


def _histogram(slots: _HistogramSlots | None, values: Sequence[float]) -> Histogram | None:
    if slots is None:
        return None
    return Histogram(slots.bounds, monotonic([values[i] for i in slots.buckets]), values[slots.total])


def _latency(slots: _LatencySlots | None, values: Sequence[float]) -> LatencyReading | None:
    if slots is None:
        return None
    return LatencyReading(_histogram(slots.tpot, values), _histogram(slots.ttft, values),
                          _value(values, slots.running), _value(values, slots.waiting),
                          _histogram(slots.request_acceptance, values), _value(values, slots.kv_cache_usage))


def _reading(slots: _Slots, values: Sequence[float]) -> SeriesReading:
    drafts = _value(values, slots.drafts)
    accepted = _value(values, slots.accepted_tokens)
    created = _value(values, slots.created)
    by_position = tuple([values[i] for i in slots.positions])
    drafted = _value(values, slots.draft_tokens)
    verified = _value(values, slots.verified) if drafted is not None else None
    return SeriesReading(
        model_name=slots.model_name,
        engine=slots.engine,
        drafts=drafts,
        draft_tokens=drafted if verified is None else verified,
        proposed_draft_tokens=None if verified is None else drafted,
        accepted_tokens=accepted,
        # Each verification step emits the accepted prefix plus one token from the target model.
        emitted_tokens=None if drafts is None or accepted is None else accepted + drafts,
        accepted_by_position=by_position,
        created=created if created is not None and math.isfinite(created) else None,
        num_speculative_tokens=len(by_position) or None,
        latency=_latency(slots.latency, values),
        generated_tokens=_value(values, slots.generated),
        preemptions=_value(values, slots.preemptions),
        scheduled_steps=tuple([values[i] for i in slots.scheduled_steps]),
    )


def _unreadable(slots: Sequence[_Slots], static_warnings: Sequence[str]) -> str | None:
    """Why no series of this layout can be read, when none can."""
    if slots or not static_warnings:
        return None
    more = f" (and {len(static_warnings) - 1} more series)" if len(static_warnings) > 1 else ""
    return static_warnings[0] + more


@dataclass(frozen=True, slots=True)
class _Layout:
    """What a decode learned about one layout of lines: the series' slots, and the series that cannot be
    read whatever the values are."""

    lines: Layout
    slots: tuple[_Slots, ...]
    pending: tuple[tuple[str | None, str | None], ...]
    warnings: tuple[str, ...]


class V1Decoder:
    """Stateless apart from its caches: the last layout, which lets the next scrape with the same lines skip
    parsing, and the series keys of the label sets it has seen."""

    def __init__(self) -> None:
        self._layout: _Layout | None = None
        self._grouper = SeriesGrouper(("model_name", "engine"))

    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult:
        samples = selection.samples()
        values = [s.value for s in samples]
        result = DecodeResult()
        slots: list[_Slots] = []
        static_pending: list[tuple[str | None, str | None]] = []
        static_warnings: list[str] = []
        for (model_name, engine), indices in self._grouper.group(samples).items():
            group = [(i, samples[i]) for i in indices]
            found = _slots(model_name, engine, group)
            if isinstance(found, str):  # the names and labels rule it out, so will every scrape with this layout
                warning = f"model_name={model_name} engine={engine}: {found}"
                result.pending.append((model_name, engine))
                result.warnings.append(warning)
                static_pending.append((model_name, engine))
                static_warnings.append(warning)
                continue
            slots.append(found)
            problem = _unusable_value(group)
            if problem is None:
                result.series.append(_reading(found, values))
            else:  # this scrape's values only
                result.pending.append((model_name, engine))
                result.warnings.append(f"model_name={model_name} engine={engine}: {problem}")
        self._layout = _Layout(selection.layout(), tuple(slots), tuple(static_pending), tuple(static_warnings)) \
            if selection.plain else None
        result.unreadable = _unreadable(slots, static_warnings)
        return result

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        layout = self._layout
        values = known_layout_values(selection, layout.lines if layout is not None else None)
        if layout is None or values is None:
            return None
        return DecodeResult(series=[_reading(slots, values) for slots in layout.slots],
                            pending=list(layout.pending), warnings=list(layout.warnings),
                            unreadable=_unreadable(layout.slots, layout.warnings))


@dataclass(frozen=True)
class VllmV1:
    api: str = "vllm-v1"
    # Exact names, so the parser skips the other counters' _created lines (one _created tells a restart).
    prefixes: tuple[str, ...] = (DRAFTS, DRAFTS_CREATED, DRAFT_TOKENS, VERIFIED_DRAFT_TOKENS, ACCEPTED, PER_POSITION,
                                 *LATENCY_PREFIXES, *COST_PREFIXES)
    max_collect_interval: float | None = None
    labels_model: bool = True

    def detect(self, samples: Sequence[Sample]) -> bool:
        return any(s.name == DRAFTS for s in samples)

    def detect_latency(self, samples: Sequence[Sample]) -> bool:
        """vLLM without spec decode (a control target): its TPOT histogram is there, spec counters are not."""
        return any(s.name == f"{TPOT}_count" for s in samples)

    def new_decoder(self, options: DecoderOptions) -> Decoder:
        if options.adaptive_verification:
            return WithheldDraftTokens(V1Decoder(), ADAPTIVE_VERIFICATION_WHY)
        return V1Decoder()  # V1 exports k (the number of position series): the config's k is only shown


ENGINE = VllmV1()
