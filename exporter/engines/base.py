"""What an engine module provides: which lines it reads, how to recognise its dialect, how to decode it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from exporter.parse import Sample, Selection


@dataclass(frozen=True, slots=True)
class FetchTiming:
    """Monotonic times bracketing one fetch; the exposition reflects some instant between them."""

    started: float
    finished: float


class SeriesReading(NamedTuple):  # a NamedTuple, not a frozen dataclass: built per series per collection
    """One (model, engine) series as the engine's counters stand now, in vLLM-V1 terms.

    Values are raw cumulative counts since the engine's own start; the store makes them reset-safe.
    ``None`` means the source does not export that quantity.
    """

    model_name: str | None
    engine: str | None
    draft_tokens: float
    accepted_tokens: float
    drafts: float | None = None
    emitted_tokens: float | None = None
    accepted_by_position: tuple[float, ...] = ()
    created: float | None = None  # changes when the source restarts
    num_speculative_tokens: int | None = None  # inferred k, when the source lets us prove it
    lifetime_acceptance_ratio: float | None = None  # V0's lifetime gauge, exported as such


@dataclass(slots=True)
class DecodeResult:
    series: list[SeriesReading] = field(default_factory=list)
    # Series present in the exposition but not decodable this time (e.g. V0 counters that cannot be
    # proven yet). They keep their label sets alive without adding a made-up reading.
    pending: list[tuple[str | None, str | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class Decoder(Protocol):
    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult: ...

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        """The fast path: what decode() would return, without parsing, when the selection has the layout
        (the same heads) of the last one decoded; None when it does not, and decode() must run."""
        ...


class Engine(Protocol):
    api: str  # the value of specdecode_info{api}
    prefixes: tuple[str, ...]  # metric-name prefixes the parser must select for this engine
    # Longest collection interval at which this engine's counters can be decoded; None = any.
    max_collect_interval: float | None

    def detect(self, samples: Sequence[Sample]) -> bool: ...

    def new_decoder(self) -> Decoder: ...


_KEY_CACHE_MAX = 20_000
_key_cache: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], tuple[str | None, ...]] = {}


def group_by_series(
    samples: Sequence[Sample], series_labels: tuple[str, ...]
) -> dict[tuple[str | None, ...], list[int]]:
    """Indices of the samples of each series (its values of ``series_labels``), series in order of appearance."""
    # The series key of a label set never changes; cache it (bounded) instead of scanning labels per sample.
    groups: dict[tuple[str | None, ...], list[int]] = {}
    cache = _key_cache
    if len(cache) >= _KEY_CACHE_MAX:
        cache.clear()
    for index, sample in enumerate(samples):
        labels = sample.labels
        key = cache.get((series_labels, labels))
        if key is None:
            key = cache[(series_labels, labels)] = tuple(sample.label(name) for name in series_labels)
        group = groups.get(key)
        if group is None:
            groups[key] = [index]
        else:
            group.append(index)
    return groups
