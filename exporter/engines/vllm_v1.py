"""vLLM V1 engine (0.8.3 → current): true counters per (model_name, engine), with ``_created`` when a
single API server serves /metrics, without it in multiprocess mode. Also the OpenMetrics dialect."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.engines.base import DecodeResult, DecoderOptions, FetchTiming, SeriesGrouper, SeriesReading
from exporter.parse import Sample, Selection, is_finite_count

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFTS_CREATED = "vllm:spec_decode_num_drafts_created"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
CREATED_SUFFIX = "_created"


@dataclass(frozen=True, slots=True)
class _Slots:
    """Where one series' counters sit in a selection: indices into its lines."""

    model_name: str | None
    engine: str | None
    draft_tokens: int
    accepted_tokens: int
    drafts: int | None
    created: int | None
    positions: tuple[int, ...]


def _slots(model_name: str | None, engine: str | None, group: list[tuple[int, Sample]]) -> _Slots | str:
    """Which line holds which counter of one series, or why the series cannot be read (from names and
    labels alone, so it holds for every scrape with the same layout)."""
    first: dict[str, int] = {}
    per_position: dict[int, int] = {}
    created: int | None = None
    for index, sample in group:
        name = sample.name
        if name.endswith(CREATED_SUFFIX):
            created = index  # any change of _created means the engine restarted
        elif name == PER_POSITION:
            position = sample.label("position")
            if position is None or not position.isdigit():
                return f"{name} has position label {position!r}"
            per_position[int(position)] = index
        else:
            first.setdefault(name, index)  # a duplicate series: keep the first, like a scrape would
    if DRAFT_TOKENS not in first or ACCEPTED not in first:
        return "draft or accepted token counter missing"
    positions: tuple[int, ...] = ()
    if per_position:
        k = max(per_position) + 1
        if len(per_position) != k:
            return f"position series have gaps ({sorted(per_position)})"
        positions = tuple(per_position[i] for i in range(k))
    return _Slots(model_name, engine, first[DRAFT_TOKENS], first[ACCEPTED], first.get(DRAFTS), created, positions)


def _unusable_value(group: list[tuple[int, Sample]]) -> str | None:
    for _, sample in group:
        if sample.name.endswith(CREATED_SUFFIX):
            continue  # a bad _created only loses restart detection by timestamp
        if not is_finite_count(sample.value):
            return f"{sample.name} has unusable value {sample.value}"
    return None


def _reading(slots: _Slots, values: Sequence[float]) -> SeriesReading:
    drafts = None if slots.drafts is None else values[slots.drafts]
    accepted = values[slots.accepted_tokens]
    created = None if slots.created is None else values[slots.created]
    by_position = tuple([values[i] for i in slots.positions])
    return SeriesReading(
        model_name=slots.model_name,
        engine=slots.engine,
        drafts=drafts,
        draft_tokens=values[slots.draft_tokens],
        accepted_tokens=accepted,
        # Each verification step emits the accepted prefix plus one token from the target model.
        emitted_tokens=None if drafts is None else accepted + drafts,
        accepted_by_position=by_position,
        created=created if created is not None and math.isfinite(created) else None,
        num_speculative_tokens=len(by_position) or None,
    )


@dataclass(frozen=True, slots=True)
class _Layout:
    """What a decode learned about one layout of lines: the series' slots, and the series that cannot be
    read whatever the values are."""

    heads: tuple[str, ...]
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
        self._layout = _Layout(selection.heads, tuple(slots), tuple(static_pending), tuple(static_warnings)) \
            if selection.plain else None
        return result

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        layout = self._layout
        if layout is None or selection.heads != layout.heads:
            return None
        try:
            values = list(map(float, selection.values))
        except ValueError:
            return None
        # Every value finite and ≥ 0 (NaN and ±Inf make the sum non-finite): then no series has an unusable
        # value and the result is what decode() would give. Anything else takes decode() for its messages.
        if not (math.isfinite(sum(values)) and min(values, default=0.0) >= 0):
            return None
        return DecodeResult(series=[_reading(slots, values) for slots in layout.slots],
                            pending=list(layout.pending), warnings=list(layout.warnings))


@dataclass(frozen=True)
class VllmV1:
    api: str = "vllm-v1"
    # Exact names, so the parser skips the other counters' _created lines (one _created tells a restart).
    prefixes: tuple[str, ...] = (DRAFTS, DRAFTS_CREATED, DRAFT_TOKENS, ACCEPTED, PER_POSITION)
    max_collect_interval: float | None = None
    labels_model: bool = True

    def detect(self, samples: Sequence[Sample]) -> bool:
        return any(s.name == DRAFTS for s in samples)

    def new_decoder(self, options: DecoderOptions) -> V1Decoder:
        return V1Decoder()  # V1 exports k (the number of position series): the config's k is only shown


ENGINE = VllmV1()
