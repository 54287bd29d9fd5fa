"""llama.cpp ``llama-server --metrics`` (tools/server/server-task.cpp ``server_task_result_metrics::to_metrics``).

Three unlabelled counters with vLLM V1's meanings, and the per-position counter once the first request that had
a verification step has finished (before that the family is absent, HELP and TYPE included). No model label: the
collector passes the model name in DecoderOptions (target ``model_name``, else the server's ``/v1/models``).

Counters move when a request finishes (the slot's statistics are added to the globals on slot reset), so a long
request shows up in the window in which it ends, not spread over its run.

Exactness: llama-server prints numbers with a C++ stream's default precision, 6 significant digits, so a counter
of 1,000,000 or more arrives rounded (``1.28394e+06``): to the nearest 10 from 1e6, 100 from 1e7, and so on.
Below 1e6 every value is exact. Above, a difference of two readings is off by at most one such step: at counters
near 5e6, a 1-minute window that drafted 12,000 tokens (6,000 accepted) has α within about ±0.25 % of its value,
but a 5 s interval that drafted 200 tokens lands in the interval histogram within about ±15 %. Rounding never makes
a rising counter read lower, so it never fakes a restart.

Restarts: counters that go down (the store), and the per-position family vanishing after it was seen: it is
printed from a vector that only grows while the process lives, so a collection between the restart and the new
server's first speculative request tells the restart even when the counts alone could not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdecode_exporter.pipeline.engines.base import (
    DecodeResult,
    DecoderOptions,
    FetchTiming,
    PositionLines,
    SeriesReading,
    known_layout_values,
)
from specdecode_exporter.pipeline.parse import Layout, Sample, Selection, is_finite_count

DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
DRAFTS = "llamacpp:spec_decode_num_drafts_total"
PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True, slots=True)
class _Layout:
    """Which selected line holds which counter, learned from names and labels (valid while the lines are those of
    ``lines``)."""

    lines: Layout
    draft_tokens: int
    accepted_tokens: int
    drafts: int
    positions: tuple[int, ...]


def _layout(lines: Layout, samples: Sequence[Sample]) -> _Layout | str:
    first: dict[str, int] = {}
    positions = PositionLines()
    for index, sample in enumerate(samples):
        if sample.name != PER_POSITION:
            first.setdefault(sample.name, index)
        elif (bad := positions.add(index, sample)) is not None:
            return bad
    missing = [name for name in (DRAFT_TOKENS, ACCEPTED, DRAFTS) if name not in first]
    if missing:
        return f"counter missing: {', '.join(missing)}"
    slots = positions.slots()
    if isinstance(slots, str):
        return slots
    return _Layout(lines, first[DRAFT_TOKENS], first[ACCEPTED], first[DRAFTS], slots)


class LlamaCppDecoder:
    """One series per target, named from the options. Remembers the last layout (the fast path) and whether the
    per-position family was seen, to tell a restart by its disappearance."""

    def __init__(self, model_name: str | None) -> None:
        self.model_name = model_name
        self._layout: _Layout | None = None
        self._saw_positions = False
        self._lifetime = 0  # bumped on each restart told by the per-position family; the store compares it

    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult:
        samples = selection.samples()
        result = DecodeResult()
        found = _layout(selection.layout(), samples)
        self._layout = found if isinstance(found, _Layout) and selection.plain else None
        if isinstance(found, str):
            return self._pending(result, found)
        values = [s.value for s in samples]
        bad = [samples[i].name for i in (found.draft_tokens, found.accepted_tokens, found.drafts, *found.positions)
               if not is_finite_count(values[i])]
        if bad:
            return self._pending(result, f"unusable value in {bad[0]}")
        result.series.append(self._reading(found, values))
        return result

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        layout = self._layout
        values = known_layout_values(selection, layout.lines if layout is not None else None)
        if layout is None or values is None:
            return None
        return DecodeResult(series=[self._reading(layout, values)])

    def _pending(self, result: DecodeResult, why: str) -> DecodeResult:
        result.pending.append((self.model_name, None))
        result.warnings.append(f"llama.cpp: {why}")
        return result

    def _reading(self, layout: _Layout, values: Sequence[float]) -> SeriesReading:
        if layout.positions:
            self._saw_positions = True
        elif self._saw_positions:
            self._saw_positions = False
            self._lifetime += 1
        drafts = values[layout.drafts]
        accepted = values[layout.accepted_tokens]
        by_position = tuple([values[i] for i in layout.positions])
        return SeriesReading(
            model_name=self.model_name,
            engine=None,
            draft_tokens=values[layout.draft_tokens],
            accepted_tokens=accepted,
            drafts=drafts,
            emitted_tokens=accepted + drafts,  # each verification step adds one token of the target's own
            accepted_by_position=by_position,
            created=float(self._lifetime),
            # The per-position vector is sized to the speculator's maximum draft (--spec-draft-n-max; for
            # ngram-simple --spec-ngram-simple-size-m), so its length is k.
            num_speculative_tokens=len(by_position) or None,
        )


@dataclass(frozen=True)
class LlamaCpp:
    api: str = "llamacpp"
    prefixes: tuple[str, ...] = (DRAFT_TOKENS, ACCEPTED, DRAFTS, PER_POSITION)
    max_collect_interval: float | None = None
    labels_model: bool = False

    def detect(self, samples: Sequence[Sample]) -> bool:
        return any(s.name == DRAFTS for s in samples)

    def new_decoder(self, options: DecoderOptions) -> LlamaCppDecoder:
        return LlamaCppDecoder(options.model_name)


ENGINE = LlamaCpp()
