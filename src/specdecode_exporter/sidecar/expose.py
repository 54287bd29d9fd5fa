"""What the sidecar exposes, sample by sample, from the latest TargetViews and the tap's view: ``fill_families``
and ``add_request_families`` put every sample into a ``SampleSink``; ``Families`` turns them into prometheus_client
metric families, which the collectors at the end yield (sidecar/metrics_page.py renders them with
prometheus_client's encoders)."""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.contract.metrics import quantile_name
from specdecode_exporter.core.stats.dispersion import WindowVariance
from specdecode_exporter.pipeline import latency
from specdecode_exporter.pipeline.derive import WindowStats
from specdecode_exporter.pipeline.latency import TPOT_QUANTILES, TTFT_QUANTILES, Histogram, LatencyStats
from specdecode_exporter.sidecar.collection import TargetView
from specdecode_exporter.sidecar.series import SeriesView, WindowView
from specdecode_exporter.tap.request_stats import BandKey, BandTotals, RequestsView
from specdecode_exporter.tap.route import RoutesView

if TYPE_CHECKING:
    from specdecode_exporter.tap.relay import TapStats  # the relay's: loaded only where the tap runs

Labels = dict[str, str]


@functools.cache
def exporter_version() -> str:
    """The installed package's version (read once: the package metadata lookup took ~1 ms, at every render)."""
    try:
        return version("specdecode-exporter")
    except PackageNotFoundError:
        return "dev"


class SampleSink(Protocol):
    """Where fill_families puts the samples: Families, or anything else that takes them."""

    def add(self, spec: m.MetricSpec, labels: Labels, value: float | None) -> None: ...

    def histogram(self, spec: m.MetricSpec, labels: Labels, buckets: Iterable[tuple[float, float]],
                  total: float) -> None: ...


@dataclass(frozen=True, slots=True)
class HistogramValue:
    """One histogram series: cumulative buckets by upper bound, and the sum of its observations."""

    buckets: tuple[tuple[float, float], ...]
    total: float


def label_names(series: Iterable[tuple[Labels, object]]) -> list[str]:
    """The union of the series' label names, in the order they first appear."""
    shapes = dict.fromkeys(tuple(labels) for labels, _ in series)
    return list(dict.fromkeys(name for shape in shapes for name in shape))


def family(spec: m.MetricSpec, series: Sequence[tuple[Labels, float | HistogramValue]]) -> Metric:
    """A contract entry's family with these series. Its label names are the union of theirs; a series that lacks
    one has it empty (as node_exporter's textfile collector writes them; Prometheus stores an empty label as none).
    A histogram's samples are laid out as HistogramMetricFamily lays them out (buckets, _count, _sum; no _count or
    _sum where a bound is negative), its bounds written as Go writes floats (``0.5``, ``1.0``, ``+Inf``); the
    samples are added with their label dicts as they are, not rebuilt from a list of values (half the time at a
    1 MB target's 18k samples)."""
    names = label_names(series)
    out = Metric(spec.name, spec.help, spec.type)
    for labels, value in series:
        if len(labels) != len(names):
            labels = {name: labels.get(name, "") for name in names}
        if isinstance(value, HistogramValue):
            for le, count in value.buckets:
                out.add_sample(spec.name + "_bucket", {**labels, "le": floatToGoString(le)}, count)
            if value.buckets[0][0] >= 0:
                out.add_sample(spec.name + "_count", labels, value.buckets[-1][1])
                out.add_sample(spec.name + "_sum", labels, value.total)
        else:
            out.add_sample(spec.exposed_name, labels, value)
    return out


class Families:
    """The samples of these contract entries, kept per family in the order they came, as prometheus_client
    families (``metrics``). An unknown value (None) adds nothing, so absent data stays absent; a histogram without
    buckets likewise."""

    def __init__(self, specs: tuple[m.MetricSpec, ...] = m.COLLECTED) -> None:
        self._specs = specs
        self._series: dict[str, list[tuple[Labels, float | HistogramValue]]] = {spec.name: [] for spec in specs}

    def add(self, spec: m.MetricSpec, labels: Labels, value: float | None) -> None:
        if value is not None:
            self._series[spec.name].append((labels, value))

    def histogram(self, spec: m.MetricSpec, labels: Labels, buckets: Iterable[tuple[float, float]],
                  total: float) -> None:
        rows = tuple(buckets)
        if rows:
            self._series[spec.name].append((labels, HistogramValue(rows, total)))

    def metrics(self) -> list[Metric]:
        """Every family, in the contract's order, those without series too (their HELP and TYPE tell a reader
        the name exists)."""
        return [family(spec, self._series[spec.name]) for spec in self._specs]


def series_labels(view: TargetView, series: SeriesView) -> Labels:
    labels = {"target": view.config.name}
    if series.key.model_name is not None:
        labels["model_name"] = series.key.model_name
    if series.key.engine is not None:
        labels["engine"] = series.key.engine
    labels.update(view.config.labels)
    return labels


def add_acceptance(families: SampleSink, w: Labels, stats: WindowStats, recommended_k: int | None) -> None:
    families.add(m.ACCEPTANCE_RATIO, w, stats.acceptance_ratio)
    families.add(m.MEAN_ACCEPTANCE_LENGTH, w, stats.mean_acceptance_length)
    families.add(m.MEAN_DRAFT_LENGTH, w, stats.mean_draft_length)
    for position, ratio in enumerate(stats.position_acceptance_ratios):
        families.add(m.POSITION_ACCEPTANCE_RATIO, {**w, "position": str(position)}, ratio)
    families.add(m.TOKEN_ACCEPTANCE_PROBABILITY, w, stats.token_acceptance_probability)
    families.add(m.DRAFT_TOKENS_PER_SECOND, w, stats.draft_tokens_per_second)
    families.add(m.ACCEPTED_TOKENS_PER_SECOND, w, stats.accepted_tokens_per_second)
    families.add(m.EXPECTED_SPEEDUP, w, stats.expected_speedup)
    for k_prime, speedup in enumerate(stats.speedup_by_length, start=1):
        families.add(m.EXPECTED_SPEEDUP_BY_LENGTH, {**w, "num_speculative_tokens": str(k_prime)}, speedup)
    families.add(m.RECOMMENDED_K, w, recommended_k)


def add_latency(families: SampleSink, w: Labels, stats: LatencyStats) -> None:
    families.add(m.TIME_PER_OUTPUT_TOKEN, {**w, "statistic": "mean"}, stats.tpot_mean)
    for q in TPOT_QUANTILES:
        families.add(m.TIME_PER_OUTPUT_TOKEN, {**w, "statistic": quantile_name(q)}, stats.tpot(q))
    families.add(m.TIME_PER_OUTPUT_TOKEN_TAIL, w, latency.ratio(stats.tpot(0.99), stats.tpot(0.5)))
    for q in TTFT_QUANTILES:
        families.add(m.TIME_TO_FIRST_TOKEN, {**w, "statistic": quantile_name(q)}, stats.ttft(q))
    families.add(m.REQUESTS_RUNNING, w, stats.running)
    families.add(m.REQUESTS_WAITING, w, stats.waiting)


def add_window(families: SampleSink, labels: Labels, view: WindowView) -> None:
    w = {**labels, "window": view.window.name}
    if view.acceptance is not None:
        add_acceptance(families, w, view.acceptance, view.recommended_k)
    if view.latency is not None:
        add_latency(families, w, view.latency)
    if view.observed is not None:
        for statistic in ("mean", "p50", "p99"):
            families.add(m.OBSERVED_SPEEDUP, {**w, "statistic": statistic}, getattr(view.observed, statistic))
    families.add(m.PROPOSED_TOKEN_ACCEPTANCE_RATIO, w, view.proposed_token_acceptance_ratio)
    families.add(m.CALIBRATED_COST, w, view.calibrated_cost)
    families.add(m.BREAK_EVEN_AT_LOAD, w, view.break_even_at_load)
    if view.capacity is not None:
        families.add(m.SPECULATIVE_TOKEN_SHARE, w, view.capacity.speculative_token_share)


def add_capacity(families: SampleSink, labels: Labels, series: SeriesView) -> None:
    """What generation produced and cost (against control pods: spec_decode=false), and the scheduled steps."""
    marked = {**labels, "spec_decode": "true" if series.spec_decode else "false"}
    totals = series.totals
    families.add(m.GENERATED_TOKENS, marked, totals.generated_tokens)
    families.add(m.PREEMPTIONS, marked, totals.preemptions)
    families.add(m.KV_CACHE_USAGE, marked, series.kv_cache_usage)
    for k, steps in enumerate(totals.scheduled_steps):
        families.add(m.SCHEDULED_STEPS, {**labels, "num_speculative_tokens": str(k)}, steps)


def add_schedule(families: SampleSink, labels: Labels, series: SeriesView) -> None:
    schedule = series.schedule
    if schedule is None:
        return
    w = {**labels, "window": series.schedule_window or ""}
    for advice in schedule.ranges:
        ranged = {**w, "batch_size": advice.label}
        families.add(m.RECOMMENDED_K_BY_BATCH_SIZE, ranged, advice.recommended)
        families.add(m.EXPECTED_SPEEDUP_BY_BATCH_SIZE, {**ranged, "schedule": "fixed"}, advice.speedup_fixed)
        families.add(m.EXPECTED_SPEEDUP_BY_BATCH_SIZE, {**ranged, "schedule": "recommended"},
                     advice.speedup_recommended)
    families.add(m.SCHEDULE_EXPECTED_GAIN, w, schedule.expected_gain)


def add_series(families: SampleSink, view: TargetView, series: SeriesView) -> None:
    labels = series_labels(view, series)
    k = series.num_speculative_tokens
    method = series.method or view.method if series.spec_decode else "off"
    families.add(m.INFO, {**labels, "api": view.api or "unknown", "method": method,
                          "num_speculative_tokens": str(k) if k else "unknown"}, 1.0)
    totals = series.totals
    families.add(m.DRAFT_TOKENS, labels, totals.draft_tokens)
    families.add(m.ACCEPTED_TOKENS, labels, totals.accepted_tokens)
    families.add(m.DRAFTS, labels, totals.drafts)
    families.add(m.EMITTED_TOKENS, labels, totals.emitted_tokens)
    for position, count in enumerate(totals.accepted_by_position):
        families.add(m.ACCEPTED_BY_POSITION, {**labels, "position": str(position)}, count)
    for window in series.windows:
        add_window(families, labels, window)
    families.add(m.BREAK_EVEN, {**labels, "cost_basis": "configured"}, series.configured_break_even)
    families.add(m.BREAK_EVEN, {**labels, "cost_basis": "calibrated"}, series.calibrated_break_even)
    if totals.draft_tokens is not None:
        histogram = series.histogram
        families.histogram(m.INTERVAL_ACCEPTANCE, labels,
                           zip(histogram.bounds, histogram.counts, strict=True), histogram.total)
        judgement = series.judgement
        families.add(m.VERDICT, {**labels, "window": series.verdict_window or "",
                                 "verdict": judgement.verdict.value, "basis": judgement.basis}, judgement.sample)
    tpot = totals.time_per_output_token
    if tpot is not None:
        families.histogram(m.REQUEST_TPOT, {**labels, "spec_decode": "true" if series.spec_decode else "false"},
                           zip(tpot.bounds, tpot.counts, strict=True), tpot.total)
    per_request = totals.request_acceptance
    if per_request is not None:
        families.histogram(m.ENGINE_REQUEST_ACCEPTANCE, labels,
                           zip(per_request.bounds, per_request.counts, strict=True), per_request.total)
    for spec, value in series.reported:
        families.add(spec, labels, value)
    families.add(m.SOURCE_RESTARTS, labels, series.restarts)
    add_capacity(families, labels, series)
    add_schedule(families, labels, series)


def add_baseline_info(families: SampleSink, view: TargetView, target: Labels) -> None:
    config = view.config
    if not config.spec_decode:
        families.add(m.BASELINE_INFO, {**target, "role": "control", "baseline": ""}, 1.0)
    elif config.baseline is not None:
        families.add(m.BASELINE_INFO, {**target, "role": "speculative",
                                       "baseline": config.baseline.target or "measured"}, 1.0)


def fill_families(families: SampleSink, views: Iterable[TargetView]) -> None:
    """Add every view's samples to ``families``."""
    families.add(m.BUILD_INFO, {"version": exporter_version(), "python_version": platform.python_version()}, 1.0)
    for view in views:
        target = {"target": view.config.name, **dict(view.config.labels)}
        families.add(m.UP, target, 1.0 if view.up else 0.0)
        families.add(m.COLLECT_DURATION, target, view.collect_duration)
        for reason, count in view.errors:
            families.add(m.COLLECT_ERRORS, {**target, "reason": reason}, count)
        families.add(m.DROPPED_SERIES, target, view.dropped_series)
        add_baseline_info(families, view, target)
        for series in view.series:
            add_series(families, view, series)


def spec_decode_families(views: Iterable[TargetView]) -> list[Metric]:
    """The spec-decode families (metrics.COLLECTED) of these views."""
    families = Families()
    fill_families(families, views)
    return families.metrics()


class SpecDecodeCollector(Collector):
    """The spec-decode families of the views ``views`` returns when collected."""

    def __init__(self, views: Callable[[], Sequence[TargetView]]) -> None:
        self._views = views

    def collect(self) -> Iterator[Metric]:
        yield from spec_decode_families(self._views())

    def describe(self) -> Iterator[Metric]:
        yield from Families().metrics()


def per_model(bands: Mapping[BandKey, BandTotals]) -> dict[str, tuple[Histogram, Histogram]]:
    """Each model's per-request histograms (α, mean acceptance length): its classes' pooled, bucket by bucket."""
    models: dict[str, list[BandTotals]] = {}
    for key, totals in bands.items():
        models.setdefault(key.model_name, []).append(totals)
    out: dict[str, tuple[Histogram, Histogram]] = {}
    for model, classes in models.items():
        acceptance = latency.pooled([t.acceptance for t in classes])
        mean_length = latency.pooled([t.mean_length for t in classes])
        if acceptance is not None and mean_length is not None:  # the recorder's bounds are fixed: always pooled
            out[model] = (acceptance, mean_length)
    return out


def add_request_histograms(families: SampleSink, labels: Labels, acceptance: Histogram,
                           mean_length: Histogram) -> None:
    for spec, histogram in ((m.REQUEST_ACCEPTANCE, acceptance), (m.REQUEST_MEAN_LENGTH, mean_length)):
        families.histogram(spec, labels, zip(histogram.bounds, histogram.counts, strict=True), histogram.total)


def add_variance_families(families: SampleSink, view: RequestsView, target: Labels,
                          variances: Sequence[WindowVariance]) -> None:
    """Per model, the sums behind the measured variance per drafted token, and the page's v per window."""
    for model, sums in view.moments.items():
        labels = {**target, "model_name": model}
        families.add(m.REQUEST_DRAFT_TOKENS_SQUARED, labels, sums.draft_squared)
        families.add(m.REQUEST_ACCEPTED_TOKENS_SQUARED, labels, sums.accepted_squared)
        families.add(m.REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT, labels, sums.product)
    for row in variances:
        families.add(m.ACCEPTANCE_VARIANCE, {**target, "model_name": row.model, "window": row.window,
                                             "source": row.variance.source}, row.variance.value)


def add_request_families(families: SampleSink, view: RequestsView, target: Labels, stats: TapStats | None,
                         class_histograms: bool = False, variances: Sequence[WindowVariance] = ()) -> None:
    """The tap's families (m.TAP). Counters by class (α per class exact over any window); the per-request
    histograms per model, or by class too with proxy.class_histograms (the same family, with workload and
    temperature labels); the variance's sums and gauge per model."""
    add_variance_families(families, view, target, variances)
    for key, totals in view.bands.items():
        labels = {**target, "model_name": key.model_name, "workload": key.workload, "temperature": key.temperature}
        families.add(m.REQUESTS, labels, totals.requests)
        families.add(m.REQUEST_DRAFT_TOKENS, labels, totals.draft_tokens)
        families.add(m.REQUEST_ACCEPTED_TOKENS, labels, totals.accepted_tokens)
        if class_histograms:
            add_request_histograms(families, labels, totals.acceptance, totals.mean_length)
    if not class_histograms:
        for model, (acceptance, mean_length) in per_model(view.bands).items():
            add_request_histograms(families, {**target, "model_name": model}, acceptance, mean_length)
    for (model, reason), count in view.without_metrics.items():
        families.add(m.REQUESTS_WITHOUT_SPEC, {**target, "model_name": model, "reason": reason}, count)
    for (model, band), histogram in view.speed.items():
        families.histogram(m.REQUEST_SPEED, {**target, "model_name": model, "acceptance": band},
                           zip(histogram.bounds, histogram.counts, strict=True), histogram.total)
    if stats is not None:
        families.add(m.TAP_CONNECTIONS, target, stats.connections)
        families.add(m.TAP_BUFFERED_BYTES, target, stats.buffered_bytes)


def add_route_families(families: SampleSink, view: RoutesView, target: Labels) -> None:
    """Routing's families (m.ROUTE)."""
    for route in view.classes:
        labels = {**target, **route.key.labels()}
        for (upstream, reason), count in route.counts:
            families.add(m.ROUTE_REQUESTS, {**labels, "upstream": upstream, "reason": reason}, count)
        families.add(m.ROUTE_CLASS_STATE, labels, 1.0 if route.routed else 0.0)
        experiment = route.experiment
        if experiment is not None:
            for latency_label, measured in (("time_per_output_token", experiment.time_per_output_token),
                                            ("end_to_end", experiment.end_to_end)):
                families.add(m.ROUTE_MEASURED_SPEEDUP, {**labels, "latency": latency_label},
                             measured.speedup if measured is not None else None)


class RequestsCollector(Collector):
    """The request tap's families (m.TAP), fresh at every collect (they change with every request); routing's
    (m.ROUTE) too, when the tap routes."""

    def __init__(self, view: Callable[[], RequestsView], target: Callable[[], Labels],
                 stats: Callable[[], TapStats | None], routes: Callable[[], RoutesView | None] = lambda: None,
                 class_histograms: bool = False,
                 variances: Callable[[], Sequence[WindowVariance]] = lambda: ()) -> None:
        self._view, self._target, self._stats, self._routes = view, target, stats, routes
        self._class_histograms, self._variances = class_histograms, variances

    def collect(self) -> Iterator[Metric]:
        target = self._target()
        families = Families(m.TAP)
        add_request_families(families, self._view(), target, self._stats(), self._class_histograms,
                             self._variances())
        yield from families.metrics()
        routes = self._routes()
        if routes is not None:
            families = Families(m.ROUTE)
            add_route_families(families, routes, target)
            yield from families.metrics()

    def describe(self) -> Iterator[Metric]:
        yield from Families(m.TAP).metrics()
