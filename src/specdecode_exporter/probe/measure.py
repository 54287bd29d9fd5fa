"""Pure aggregation for the probe: what one request said, what a group of requests adds up to, and the verdict.

α = Σ accepted draft tokens / Σ drafted tokens over a row's requests (pooled, never an average of ratios); mean
acceptance length = 1 + accepted / verification steps (vLLM's definition, the bonus token included);
position i's acceptance ratio = steps whose accepted prefix is longer than i / steps (vLLM's per-position counter
over its drafts counter). TPOT quantiles are over the row's requests; the observed speedup at a quantile is the
baseline's TPOT at that quantile over this server's (docs/architecture.md §6).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from specdecode_exporter.pipeline.latency import ratio
from specdecode_exporter.pipeline.store import counter_increase
from specdecode_exporter.tap.request_stats import spec_figures

# Verdicts of a row.
DISABLE = "disable"
MEASURE = "measure P99 under real load"
SHIP = "ship"
DO_NOT_SHIP = "do not ship"
NO_DRAFTS = "no drafts"

# Where a row's α comes from.
PER_REQUEST = "per-request"
COUNTERS = "counters"
COUNTERS_SHARED = "counters, shared"

# Where a row's TPOT comes from.
SERVER_TIMINGS = "server"  # vLLM's metrics.generation_time_ms / (completion tokens − 1)
CLIENT_TIMINGS = "client"  # first to last token event of the stream / (completion tokens − 1)


def quantile(values: Iterable[float], q: float) -> float | None:
    """The q-quantile by linear interpolation between the closest ranks (numpy's default, "type 7")."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if not ordered:
        return None
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request's own spec-decode numbers (vLLM's metrics.speculative_decoding, or llama.cpp's timings)."""

    draft_tokens: float
    accepted_tokens: float
    steps: float | None  # verification steps (vLLM's num_spec_steps); llama.cpp does not say
    histogram: tuple[int, ...] | None  # steps that accepted j drafts, j = 0..k


def request_spec(metrics: Mapping[str, Any] | None, timings: Mapping[str, Any] | None) -> RequestSpec | None:
    """A response's spec-decode numbers, read as the request tap reads them (specdecode_exporter.tap.request_stats)."""
    figures = spec_figures(metrics, timings)
    if figures is None:
        return None
    spec = (metrics or {}).get("speculative_decoding")
    raw = spec.get("acceptance_histogram") if isinstance(spec, Mapping) else None
    histogram = None
    if isinstance(raw, list) and raw and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in raw):
        histogram = tuple(raw)
    return RequestSpec(figures.draft_tokens, figures.accepted_tokens, figures.steps, histogram)


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one probe request gave back. Times are time.monotonic() seconds."""

    completion_tokens: int
    server_tpot: float | None  # from the server's own per-request timings
    client_tpot: float | None  # measured on the stream
    spec: RequestSpec | None
    started: float
    finished: float
    error: str | None = None  # a failed request (timeout, 5xx): counted, not measured

    @property
    def ok(self) -> bool:
        return self.error is None


def server_tpot(metrics: Mapping[str, Any] | None, completion_tokens: int) -> float | None:
    """vLLM's decode time (first to last output token) over the tokens after the first."""
    value = (metrics or {}).get("generation_time_ms")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return value / 1000.0 / (completion_tokens - 1) if completion_tokens > 1 else None


def client_tpot(first_token: float | None, last_token: float | None, completion_tokens: int) -> float | None:
    """Time from the first to the last token event of a stream over the tokens after the first."""
    if first_token is None or last_token is None or completion_tokens < 2 or last_token <= first_token:
        return None
    return (last_token - first_token) / (completion_tokens - 1)


@dataclass(frozen=True, slots=True)
class SpecCounts:
    """Spec-decode totals of a row: summed over its requests, or a counter increase."""

    steps: float
    draft_tokens: float
    accepted_tokens: float
    per_position: tuple[float, ...] | None  # steps whose accepted prefix is longer than i, i = 0..k−1

    @property
    def acceptance_ratio(self) -> float | None:
        return ratio(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        share = ratio(self.accepted_tokens, self.steps)
        return None if share is None else 1.0 + share

    @property
    def position_acceptance_ratios(self) -> tuple[float, ...] | None:
        if self.per_position is None or self.steps <= 0:
            return None
        return tuple(n / self.steps for n in self.per_position)


def positions_from_histogram(histogram: Sequence[int]) -> list[int]:
    """Per-position accepted counts from an acceptance histogram: a step that accepted j drafts accepted
    positions 0..j−1, so position i counts the steps with j > i."""
    k = len(histogram) - 1
    return [sum(histogram[j] for j in range(i + 1, k + 1)) for i in range(k)]


def per_request_counts(results: Iterable[RequestResult]) -> SpecCounts | None:
    """Totals of the requests that reported their own numbers; None when none did."""
    specs = [r.spec for r in results if r.ok and r.spec is not None]
    if not specs:
        return None
    steps = [s.steps for s in specs]
    histograms = [s.histogram for s in specs]
    per_position: tuple[float, ...] | None = None
    if all(h is not None for h in histograms) and len({len(h) for h in histograms if h is not None}) == 1:
        columns = [positions_from_histogram(h) for h in histograms if h is not None]
        per_position = tuple(float(sum(c[i] for c in columns)) for i in range(len(columns[0])))
    return SpecCounts(steps=sum(s for s in steps if s is not None) if all(s is not None for s in steps) else 0.0,
                      draft_tokens=sum(s.draft_tokens for s in specs),
                      accepted_tokens=sum(s.accepted_tokens for s in specs), per_position=per_position)


@dataclass(frozen=True, slots=True)
class Counters:
    """A scrape of the server's /metrics for one model: vLLM V1's spec-decode counters and the load."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    per_position: tuple[float, ...]
    generation_tokens: float | None  # vllm:generation_tokens_total, when exposed
    requests_in_flight: float  # vllm:num_requests_running + waiting

    def minus(self, before: Counters) -> SpecCounts:
        """The increase since ``before`` as totals (a counter that went down is a restart: then the value)."""
        def delta(now: float, then: float) -> float:
            return counter_increase(then, now, restarted=False)

        per_position = tuple(delta(n, before.per_position[i] if i < len(before.per_position) else 0.0)
                             for i, n in enumerate(self.per_position))
        return SpecCounts(delta(self.drafts, before.drafts), delta(self.draft_tokens, before.draft_tokens),
                          delta(self.accepted_tokens, before.accepted_tokens), per_position or None)

    def same_work(self, other: Counters) -> bool:
        return (self.drafts, self.draft_tokens, self.accepted_tokens, self.per_position, self.generation_tokens) \
            == (other.drafts, other.draft_tokens, other.accepted_tokens, other.per_position, other.generation_tokens)


def idle_traffic(before: Counters, after: Counters) -> str | None:
    """Why the server was not idle between two scrapes with no probe request in flight, or None."""
    if not after.same_work(before):
        grew = after.minus(before)
        return (f"the counters moved while the probe had no request in flight ({grew.steps:g} drafts, "
                f"{grew.draft_tokens:g} drafted tokens)")
    if after.requests_in_flight > 0:
        return f"{after.requests_in_flight:g} other requests were running or waiting"
    return None


def extra_tokens(before: Counters, after: Counters, probe_tokens: int) -> str | None:
    """Why a row's counter increase holds more than the probe's own requests, or None."""
    if before.generation_tokens is None or after.generation_tokens is None:
        return None
    grew = after.generation_tokens - before.generation_tokens
    if grew > probe_tokens:
        return f"generation tokens grew by {grew:g} while the probe's requests generated {probe_tokens}"
    return None


@dataclass(frozen=True, slots=True)
class Bands:
    """The verdict bands, from the monitoring config (thresholds.page_acceptance_ratio and probe.*)."""

    page_acceptance_ratio: float = 0.5
    measure_below: float = 0.65
    ship_speedup: float = 1.3


def verdict(alpha: float | None, speedup_p50: float | None, bands: Bands) -> tuple[str, str]:
    """(verdict, why): α below the page threshold → disable; with a baseline a median speedup below
    ship_speedup → do not ship; α below measure_below → measure P99 under real load; else ship."""
    if alpha is None:
        return NO_DRAFTS, "no drafted tokens: nothing to judge"
    if alpha < bands.page_acceptance_ratio:
        return DISABLE, f"α {alpha:.2f} < {bands.page_acceptance_ratio:g} (the page threshold)"
    if speedup_p50 is not None and speedup_p50 < bands.ship_speedup:
        return DO_NOT_SHIP, f"median speedup {speedup_p50:.2f}× < {bands.ship_speedup:g}×"
    if alpha < bands.measure_below:
        return MEASURE, f"α {alpha:.2f} in [{bands.page_acceptance_ratio:g}, {bands.measure_below:g})"
    said = f"α {alpha:.2f} ≥ {bands.measure_below:g}"
    return SHIP, said + (f", median speedup {speedup_p50:.2f}× ≥ {bands.ship_speedup:g}×"
                         if speedup_p50 is not None else "")


def tpot_source(*groups: Sequence[RequestResult]) -> str:
    """Server timings when every measured request on every side has them (so both sides of a speedup are timed
    the same way), else the client's."""
    measured = [r for results in groups for r in results if r.ok]
    return SERVER_TIMINGS if measured and all(r.server_tpot is not None for r in measured) else CLIENT_TIMINGS


def tpots(results: Sequence[RequestResult], source: str) -> list[float]:
    values = (r.server_tpot if source == SERVER_TIMINGS else r.client_tpot for r in results if r.ok)
    return [v for v in values if v is not None]


def throughput(results: Sequence[RequestResult]) -> float | None:
    """Output tokens per second of a row's requests: all their tokens over the wall time they took together."""
    done = [r for r in results if r.ok]
    if not done:
        return None
    seconds = max(r.finished for r in done) - min(r.started for r in done)
    return sum(r.completion_tokens for r in done) / seconds if seconds > 0 else None


@dataclass(frozen=True, slots=True)
class Row:
    """One temperature × prompt group."""

    temperature: float
    group: str
    requests: int
    failed_requests: int
    acceptance_ratio: float | None
    mean_acceptance_length: float | None
    position_acceptance_ratios: tuple[float, ...] | None
    drafts: float | None
    draft_tokens: float | None
    accepted_tokens: float | None
    completion_tokens: int
    tpot_p50_seconds: float | None
    tpot_p99_seconds: float | None
    tpot_source: str
    tokens_per_second: float | None
    baseline_tpot_p50_seconds: float | None
    baseline_tpot_p99_seconds: float | None
    speedup_p50: float | None
    speedup_p99: float | None
    verdict: str
    reason: str
    source: str
    shared_traffic: bool
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["position_acceptance_ratios"] = (None if self.position_acceptance_ratios is None
                                             else list(self.position_acceptance_ratios))
        out["notes"] = list(self.notes)
        return out


@dataclass(frozen=True, slots=True)
class Cell:
    """What was measured for one row: the requests on each side and the α source."""

    temperature: float
    group: str
    results: Sequence[RequestResult]
    counts: SpecCounts | None  # None: no drafts were seen
    source: str
    baseline: Sequence[RequestResult] | None = None
    notes: tuple[str, ...] = ()


def make_row(cell: Cell, bands: Bands) -> Row:
    source = tpot_source(cell.results, *([cell.baseline] if cell.baseline is not None else []))
    mine = tpots(cell.results, source)
    p50, p99 = quantile(mine, 0.5), quantile(mine, 0.99)
    base50 = base99 = None
    if cell.baseline is not None:
        theirs = tpots(cell.baseline, source)
        base50, base99 = quantile(theirs, 0.5), quantile(theirs, 0.99)
    speedup50, speedup99 = ratio(base50, p50), ratio(base99, p99)
    counts = cell.counts
    alpha = counts.acceptance_ratio if counts is not None else None
    said, why = verdict(alpha, speedup50, bands)
    done = [r for r in cell.results if r.ok]
    return Row(
        temperature=cell.temperature, group=cell.group, requests=len(done),
        failed_requests=len(cell.results) - len(done) + (0 if cell.baseline is None
                                                          else sum(not r.ok for r in cell.baseline)),
        acceptance_ratio=alpha,
        mean_acceptance_length=counts.mean_acceptance_length if counts is not None else None,
        position_acceptance_ratios=counts.position_acceptance_ratios if counts is not None else None,
        drafts=counts.steps if counts is not None else None,
        draft_tokens=counts.draft_tokens if counts is not None else None,
        accepted_tokens=counts.accepted_tokens if counts is not None else None,
        completion_tokens=sum(r.completion_tokens for r in done),
        tpot_p50_seconds=p50, tpot_p99_seconds=p99, tpot_source=source if mine else "none",
        tokens_per_second=throughput(cell.results),
        baseline_tpot_p50_seconds=base50, baseline_tpot_p99_seconds=base99,
        speedup_p50=speedup50, speedup_p99=speedup99, verdict=said, reason=why,
        source=cell.source, shared_traffic=cell.source == COUNTERS_SHARED, notes=cell.notes,
    )
