"""Per-request truth from the request tap: each tapped completion's own acceptance (vLLM's per-request metrics, or
llama.cpp's timings), counted by model, workload and temperature band. Counters make α per band exact over any
window; histograms give the distribution the aggregate counters hide.

The recorder is the tap's Observer: it runs on the event loop for each finished request and only adds to
counters. Scrapes read an immutable snapshot.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from specdecode_exporter.core.contract.adaptive_verification import withheld_why
from specdecode_exporter.core.contract.buckets import ACCEPTANCE_RATIO_BUCKETS
from specdecode_exporter.core.stats.dispersion import Moments
from specdecode_exporter.pipeline.latency import Histogram
from specdecode_exporter.tap.model import TapRequest, TapResult
from specdecode_exporter.tap.openai import sglang_spec_details
from specdecode_exporter.tap.settings import TapSettings

LENGTH_BUCKETS: tuple[float, ...] = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 10.0)
SPEED_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)
UNSET = "unset"
OTHER = "other"
MAX_LABEL_LENGTH = 64
# Why a vLLM response's per-request draft counts are not read (RequestRecorder.withheld), in the sentence the sidecar
# says of its own counters (core/contract/adaptive_verification.py), and the reason such requests are counted by.
ADAPTIVE_VERIFICATION_WITHHELD = withheld_why(
    "a response's metrics.speculative_decoding.num_draft_tokens",
    "the per-request α (the request drafted and accepted tokens, the acceptance histogram, the variance's sums) and "
    "the routing decisions on it", verified="per-request count of verified tokens")
WITHHELD = "withheld"


MAX_MODELS = 32  # model names kept as label values (clients name them; a hostile one could name many)
ACCEPTANCE_EDGES = (0.5, 0.65)  # bands of per-request α for the speed histogram


def temperature_band(temperature: float | None, edges: Sequence[float]) -> str:
    if temperature is None or not math.isfinite(temperature):
        return UNSET
    index = bisect.bisect_right(edges, temperature)
    low = "0" if index == 0 else f"{edges[index - 1]:g}"
    return f"{low}-{edges[index]:g}" if index < len(edges) else f"{low}+"


def acceptance_band(alpha: float, edges: Sequence[float]) -> str:
    index = bisect.bisect_right(edges, alpha)
    low = "0" if index == 0 else f"{edges[index - 1]:g}"
    high = "1" if index == len(edges) else f"{edges[index]:g}"
    return f"{low}-{high}"


class BandKey(NamedTuple):
    model_name: str
    workload: str
    temperature: str


@dataclass
class BandTotals:
    requests: int = 0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    acceptance: Histogram = field(default_factory=lambda: Histogram.empty(ACCEPTANCE_RATIO_BUCKETS))
    mean_length: Histogram = field(default_factory=lambda: Histogram.empty(LENGTH_BUCKETS))

    def frozen(self) -> BandTotals:
        return BandTotals(self.requests, self.draft_tokens, self.accepted_tokens, self.acceptance, self.mean_length)


class RequestSpec(NamedTuple):
    """One request's spec-decode figures, whatever the engine reported them as."""

    draft_tokens: float
    accepted_tokens: float
    steps: float | None  # verification steps (vLLM); llama.cpp does not say


def spec_figures(metrics: Mapping[str, Any] | None, timings: Mapping[str, Any] | None,
                 sglext: Mapping[str, Any] | None = None) -> RequestSpec | None:
    """A response's vLLM metrics.speculative_decoding, llama.cpp's timings.draft_n / draft_n_accepted, or SGLang's
    sglext.spec_tokens_details (spec_num_proposed_drafts / spec_num_correct_drafts / spec_verify_ct)."""
    spec = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    if isinstance(spec, Mapping):
        drafted, accepted = _count(spec.get("num_draft_tokens")), _count(spec.get("num_accepted_draft_tokens"))
        if drafted is not None and accepted is not None:
            return RequestSpec(drafted, accepted, _count(spec.get("num_spec_steps")))
    details = sglang_spec_details(sglext)
    if details is not None:
        drafted = _count(details.get("spec_num_proposed_drafts"))
        accepted = _count(details.get("spec_num_correct_drafts"))
        if drafted is not None and accepted is not None:
            return RequestSpec(drafted, accepted, _count(details.get("spec_verify_ct")))
    if isinstance(timings, Mapping):
        drafted, accepted = _count(timings.get("draft_n")), _count(timings.get("draft_n_accepted"))
        if drafted is not None and accepted is not None:
            return RequestSpec(drafted, accepted, None)
    return None


def _count(value: Any) -> float | None:
    """A finite, non-negative number from a response, or None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def tokens_per_second(request: TapRequest, result: TapResult) -> float | None:
    """The request's generation speed: vLLM's own figure, else output tokens over the streamed generation time."""
    metrics = result.metrics if isinstance(result.metrics, Mapping) else {}
    reported = _count(metrics.get("tokens_per_second"))
    if reported:
        return reported
    usage = result.usage if isinstance(result.usage, Mapping) else {}
    tokens = _count(usage.get("completion_tokens"))
    if request.stream and result.first_byte is not None and tokens is not None and tokens > 1:
        seconds = result.finished - result.first_byte
        return tokens / seconds if seconds > 0 else None
    return None


class RequestsView(NamedTuple):
    """What the tap has seen, for one scrape."""

    bands: Mapping[BandKey, BandTotals]
    without_metrics: Mapping[tuple[str, str], int]  # (model, reason) → requests
    speed: Mapping[tuple[str, str], Histogram]  # (model, acceptance band) → tokens/s
    # model → Σ D, Σ A, Σ D², Σ A², Σ A·D (and steps) of its requests with metrics: the measured variance per drafted
    # token (core.stats.dispersion) over any window. Per model, not per class: the page tests a model's pooled α.
    moments: Mapping[str, Moments] = {}
    withheld: str | None = None  # RequestRecorder.withheld of the tap that counted them


@dataclass
class RequestRecorder:
    """The tap's Observer: requests labelled as ``settings`` say (max_workloads, temperature_bands)."""

    settings: TapSettings
    # Why vLLM's per-request draft counts (metrics.speculative_decoding) are not read: the target declares adaptive
    # verification (ADAPTIVE_VERIFICATION_WITHHELD). None: they are read.
    withheld: str | None = None
    max_models: int = MAX_MODELS
    bands: dict[BandKey, BandTotals] = field(default_factory=dict)
    without_metrics: dict[tuple[str, str], int] = field(default_factory=dict)
    speed: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    moments: dict[str, Moments] = field(default_factory=dict)
    workloads: set[str] = field(default_factory=set)
    models: set[str] = field(default_factory=set)

    def observe(self, request: TapRequest, result: TapResult) -> None:
        if result.route is not None and result.route.to_fallback:
            return  # served by the routing fallback: not a request of the tapped target
        if 200 <= result.status < 300:  # a model name takes a slot only once the upstream has served it
            capped(request.model, self.models, self.max_models)
        model = known(request.model, self.models)
        figures = self.figures(result)
        if figures is None:
            withheld = self.withheld is not None and spec_figures(result.metrics, None) is not None
            reason = WITHHELD if withheld else result.reason or "no_spec_metrics"
            self.without_metrics[(model, reason)] = self.without_metrics.get((model, reason), 0) + 1
            return
        totals = self.bands.setdefault(self.band_key(request), BandTotals())
        totals.requests += 1
        totals.draft_tokens += figures.draft_tokens
        totals.accepted_tokens += figures.accepted_tokens
        self.moments[model] = self.moments.get(model, Moments()).observed(
            figures.draft_tokens, figures.accepted_tokens, figures.steps)
        if figures.draft_tokens <= 0:
            return  # no draft at all (ngram found nothing): no α to put in the distribution
        alpha = min(1.0, figures.accepted_tokens / figures.draft_tokens)
        totals.acceptance = totals.acceptance.observed(alpha)
        if figures.steps:
            totals.mean_length = totals.mean_length.observed(1.0 + figures.accepted_tokens / figures.steps)
        speed = tokens_per_second(request, result)
        if speed is not None:
            band = (model, acceptance_band(alpha, ACCEPTANCE_EDGES))
            self.speed[band] = self.speed.get(band, Histogram.empty(SPEED_BUCKETS)).observed(speed)

    def figures(self, result: TapResult) -> RequestSpec | None:
        """The response's spec-decode figures as the tap may read them: vLLM's none while they are withheld (the
        router judges on these too)."""
        return spec_figures(None if self.withheld is not None else result.metrics, result.timings, result.sglext)

    def band_key(self, request: TapRequest) -> BandKey:
        """The request's labels: the model as served before (else "other"), the workload capped, the temperature
        banded (the router labels classes so)."""
        return BandKey(known(request.model, self.models),
                       capped(request.workload, self.workloads, self.settings.max_workloads),
                       temperature_band(request.temperature, self.settings.temperature_bands))

    def view(self) -> RequestsView:
        return RequestsView({k: v.frozen() for k, v in self.bands.items()}, dict(self.without_metrics),
                            dict(self.speed), dict(self.moments), self.withheld)


def capped(raw: str | None, seen: set[str], limit: int) -> str:
    """A client-supplied value as a label: the first ``limit`` distinct values as they are, then "other"."""
    value = _label(raw)
    if value is None:
        return UNSET
    if value in seen:
        return value
    if len(seen) >= limit:
        return OTHER
    seen.add(value)
    return value


def known(raw: str | None, seen: set[str]) -> str:
    """A client-supplied value as a label when it already holds a slot, else "other" (it takes none)."""
    value = _label(raw)
    if value is None:
        return UNSET
    return value if value in seen else OTHER


def _label(raw: str | None) -> str | None:
    """A header or model name as a label value: printable, bounded; None when empty."""
    if raw is None:
        return None
    value = "".join(c for c in raw.strip() if c.isprintable())[:MAX_LABEL_LENGTH]
    return value or None


NO_REQUESTS = RequestsView({}, {}, {})


def combined(first: RequestsView, then: RequestsView) -> RequestsView:
    """Two recorders' counts as one (a tap process that died, and the one started after it)."""
    if not first.bands and not first.without_metrics and not first.speed and not first.moments:
        return then
    bands = dict(first.bands)
    for key, totals in then.bands.items():
        before = bands.get(key)
        bands[key] = totals if before is None else BandTotals(
            before.requests + totals.requests, before.draft_tokens + totals.draft_tokens,
            before.accepted_tokens + totals.accepted_tokens, _summed(before.acceptance, totals.acceptance),
            _summed(before.mean_length, totals.mean_length))
    without = dict(first.without_metrics)
    for reason, count in then.without_metrics.items():
        without[reason] = without.get(reason, 0) + count
    speed = dict(first.speed)
    for band, histogram in then.speed.items():
        speed[band] = histogram if band not in speed else _summed(speed[band], histogram)
    moments = dict(first.moments)
    for model, sums in then.moments.items():
        moments[model] = sums if model not in moments else moments[model] + sums
    return RequestsView(bands, without, speed, moments, then.withheld or first.withheld)


def _summed(first: Histogram, then: Histogram) -> Histogram:
    return Histogram(first.bounds, tuple(a + b for a, b in zip(first.counts, then.counts, strict=True)),
                     first.total + then.total)
