"""What an engine module provides: which lines it reads, how to recognise its dialect, how to decode it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from specdecode_exporter.core.contract.metrics import MetricSpec
from specdecode_exporter.pipeline.latency import Histogram
from specdecode_exporter.pipeline.parse import Layout, Sample, Selection


@dataclass(frozen=True, slots=True)
class FetchTiming:
    """Monotonic times bracketing one fetch; the exposition reflects some instant between them."""

    started: float
    finished: float


class LatencyReading(NamedTuple):
    """The series' per-request and load families as the source stands now (vLLM V1's)."""

    time_per_output_token: Histogram | None = None  # per finished request: decode time / (tokens − 1)
    time_to_first_token: Histogram | None = None
    running: float | None = None  # requests in the batch now
    waiting: float | None = None
    request_acceptance: Histogram | None = None  # per finished request: its α, where the engine exports it
    kv_cache_usage: float | None = None  # share of the KV cache in use now (1 = full)

    @property
    def observations(self) -> float | None:
        tpot = self.time_per_output_token
        return tpot.observations if tpot is not None else None


class SeriesReading(NamedTuple):  # a NamedTuple, not a frozen dataclass: built per series per collection
    """One (model, engine) series as the engine's counters stand now, in vLLM-V1 terms.

    Values are raw cumulative counts since the engine's own start; the store makes them reset-safe.
    ``None`` means the source does not export that quantity.
    """

    model_name: str | None
    engine: str | None
    draft_tokens: float | None  # None: the source exports no token counters (a control target, SGLang)
    accepted_tokens: float | None
    drafts: float | None = None
    emitted_tokens: float | None = None
    accepted_by_position: tuple[float, ...] = ()
    created: float | None = None  # changes when the source restarts
    num_speculative_tokens: int | None = None  # inferred k, when the source lets us prove it
    method: str | None = None  # the speculative method, where the source states it (TensorRT-LLM)
    # Figures the engine computes itself (V0's lifetime acceptance gauge, SGLang's last-window gauges), passed
    # through under the contract metric that says what they are; never treated as the sidecar's own windows.
    reported: tuple[tuple[MetricSpec, float], ...] = ()
    latency: LatencyReading | None = None
    generated_tokens: float | None = None  # every token the engine generated, speculative steps or not
    preemptions: float | None = None  # requests preempted for want of KV-cache blocks
    scheduled_steps: tuple[float, ...] = ()  # scheduler steps by the k a batch-size schedule chose (index = k)
    # Drafts that reached each position (drafted tokens per position: TensorRT-LLM's token_position family): with
    # them the mean draft length and the per-position curve are measured even when the draft length varies.
    drafted_by_position: tuple[float, ...] = ()
    # The engine's count of proposed draft tokens where it is not the one α divides by: vLLM's drafted-token count
    # beside its verified-token counter (draft_tokens then holds the verified ones), or while the verified count
    # is unknown (adaptive verification without that counter: draft_tokens withheld). None elsewhere.
    proposed_draft_tokens: float | None = None


@dataclass(slots=True)
class DecodeResult:
    series: list[SeriesReading] = field(default_factory=list)
    # Series present in the exposition but not decodable this time (e.g. V0 counters that cannot be
    # proven yet). They keep their label sets alive without adding a made-up reading.
    pending: list[tuple[str | None, str | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Set when the exposition's names and labels rule out every series (none readable whatever its values, e.g.
    # the accepted-token counter gone): the target has no usable spec-decode metrics, not a reading to wait for.
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class DecoderOptions:
    """What a target's configuration tells its decoder; given when the decoder is created."""

    num_speculative_tokens: int | None = None  # k from config, where the source cannot prove it
    model_name: str | None = None  # for sources without a model label: from config, or the server's /v1/models
    adaptive_verification: bool = False  # vLLM's enable_adaptive_verification, from config (vLLM does not export it)


class Decoder(Protocol):
    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult: ...

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        """The fast path: what decode() would return, without parsing, when the selection has the layout
        (the same heads) of the last one decoded; None when it does not, and decode() must run."""
        ...


class WithheldDraftTokens:
    """A decoder whose readings withhold the drafted tokens (None) with a reason where the source's drafted-token
    count may be proposed rather than verified tokens: α and everything built on it stay absent rather than
    computed from a count that may not be what they divide by. The count is kept as proposed_draft_tokens (accepted
    over it is a lower bound of α). A reading that counts verified tokens apart (proposed_draft_tokens already set
    by the inner decoder) is kept as it is."""

    def __init__(self, inner: Decoder, why: str) -> None:
        self._inner, self.why = inner, why

    def _withheld(self, result: DecodeResult) -> DecodeResult:
        series = [reading if reading.proposed_draft_tokens is not None
                  else reading._replace(draft_tokens=None, proposed_draft_tokens=reading.draft_tokens)
                  for reading in result.series]
        return DecodeResult(series, result.pending, result.warnings, result.unreadable)

    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult:
        return self._withheld(self._inner.decode(selection, timing))

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        result = self._inner.decode_known(selection, timing)
        return None if result is None else self._withheld(result)


class Engine(Protocol):
    """A source dialect. A new engine is one module with an object like this, registered in ENGINES."""

    @property
    def api(self) -> str:
        """The value of specdecode_info{api}."""
        ...

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Metric-name prefixes the parser must select for this engine."""
        ...

    @property
    def max_collect_interval(self) -> float | None:
        """Longest collection interval at which this engine's counters can be decoded; None = any."""
        ...

    @property
    def labels_model(self) -> bool:
        """Whether the exposition names the model; when not, the decoder gets it in DecoderOptions.model_name."""
        ...

    def detect(self, samples: Sequence[Sample]) -> bool: ...

    def new_decoder(self, options: DecoderOptions) -> Decoder: ...


class PositionLines:
    """Which line holds each draft position's counter (the per-position family, label ``position`` = 0…k−1, of
    one series), gathered line by line; the first line of a position counts, like a scrape would. The same for any
    family indexed 0…n by a label (``label``: the scheduled steps by k)."""

    def __init__(self, label: str = "position") -> None:
        self._line_of: dict[int, int] = {}
        self._label = label

    def __bool__(self) -> bool:
        return bool(self._line_of)

    def add(self, index: int, sample: Sample) -> str | None:
        """Takes line ``index``, or says why its position label is not a position."""
        position = sample.label(self._label)
        if position is None or not position.isdigit():
            return f"{sample.name} has {self._label} label {position!r}"
        self._line_of.setdefault(int(position), index)
        return None

    def slots(self) -> tuple[int, ...] | str:
        """The lines of positions 0…k−1 in order (none when the family is absent), or why they cannot be read."""
        k = max(self._line_of, default=-1) + 1
        if len(self._line_of) != k:
            return f"position series have gaps ({sorted(self._line_of)})"
        return tuple(self._line_of[i] for i in range(k))


SeriesKeyValues = tuple[str | None, ...]


def known_layout_values(selection: Selection, layout: Layout | None) -> list[float] | None:
    """The values of a selection whose lines are those of a layout seen before, when every value is a usable
    count (finite, ≥ 0: NaN and ±Inf make the sum non-finite); else None, and decode() parses and says what is
    wrong. The fast path of Decoder.decode_known."""
    texts = selection.known_values(layout) if layout is not None else None
    if texts is None:
        return None
    try:
        values = list(map(float, texts))
    except ValueError:
        return None
    if not (math.isfinite(sum(values)) and min(values, default=0.0) >= 0):
        return None
    return values


class SeriesGrouper:
    """Groups samples by series (their values of ``series_labels``). The key of a label set never changes, so it
    is remembered (bounded) instead of scanning the labels of every sample on every scrape; one per decoder."""

    def __init__(self, series_labels: tuple[str, ...], max_entries: int = 20_000) -> None:
        self.series_labels = series_labels
        self.max_entries = max_entries
        self._keys: dict[tuple[tuple[str, str], ...], SeriesKeyValues] = {}

    def group(self, samples: Sequence[Sample]) -> dict[SeriesKeyValues, list[int]]:
        """Indices of the samples of each series, series in order of appearance."""
        groups: dict[SeriesKeyValues, list[int]] = {}
        keys = self._keys
        if len(keys) >= self.max_entries:
            keys.clear()
        names = self.series_labels
        for index, sample in enumerate(samples):
            labels = sample.labels
            key = keys.get(labels)
            if key is None:
                key = keys[labels] = tuple(sample.label(name) for name in names)
            group = groups.get(key)
            if group is None:
                groups[key] = [index]
            else:
                group.append(index)
        return groups
