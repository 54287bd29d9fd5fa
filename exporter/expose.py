"""prometheus_client Collector: fresh metric families from the latest TargetViews on every scrape."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from exporter import metrics as m
from exporter.collection import SeriesView, TargetView
from exporter.derive import WindowStats
from exporter.store import INTERVAL_BUCKETS

Labels = dict[str, str]


def exporter_version() -> str:
    try:
        return version("specdecode-exporter")
    except PackageNotFoundError:
        return "dev"


def _fmt_bucket(bound: float) -> str:
    return f"{bound:.2f}".rstrip("0").rstrip(".") if bound != 1.0 else "1.0"


class Families:
    """One fresh Metric per contract entry, filled by add()."""

    def __init__(self) -> None:
        self._families = {spec.name: Metric(spec.name, spec.help, spec.type) for spec in m.CONTRACT}

    def add(self, spec: m.MetricSpec, labels: Labels, value: float | None, suffix: str = "") -> None:
        """Add a sample; an unknown value (None) adds nothing, so absent data stays absent."""
        if value is not None:
            self._families[spec.name].add_sample(spec.exposed_name + suffix, labels, value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def series_labels(view: TargetView, series: SeriesView) -> Labels:
    labels = {"target": view.config.name}
    if series.key.model_name is not None:
        labels["model_name"] = series.key.model_name
    if series.key.engine is not None:
        labels["engine"] = series.key.engine
    labels.update(view.config.labels)
    return labels


def add_window(families: Families, labels: Labels, window: str, stats: WindowStats) -> None:
    w = {**labels, "window": window}
    families.add(m.ACCEPTANCE_RATIO, w, stats.acceptance_ratio)
    families.add(m.MEAN_ACCEPTANCE_LENGTH, w, stats.mean_acceptance_length)
    for position, ratio in enumerate(stats.position_acceptance_ratios):
        families.add(m.POSITION_ACCEPTANCE_RATIO, {**w, "position": str(position)}, ratio)
    families.add(m.TOKEN_ACCEPTANCE_PROBABILITY, w, stats.token_acceptance_probability)
    families.add(m.DRAFT_TOKENS_PER_SECOND, w, stats.draft_tokens_per_second)
    families.add(m.ACCEPTED_TOKENS_PER_SECOND, w, stats.accepted_tokens_per_second)
    families.add(m.EXPECTED_SPEEDUP, w, stats.expected_speedup)
    for k_prime, speedup in enumerate(stats.speedup_by_length, start=1):
        families.add(m.EXPECTED_SPEEDUP_BY_LENGTH, {**w, "num_speculative_tokens": str(k_prime)}, speedup)
    families.add(m.RECOMMENDED_K, w, stats.recommended_num_speculative_tokens)


def add_series(families: Families, view: TargetView, series: SeriesView) -> None:
    labels = series_labels(view, series)
    k = series.num_speculative_tokens
    families.add(m.INFO, {**labels, "api": view.api or "unknown", "method": view.method,
                          "num_speculative_tokens": str(k) if k else "unknown"}, 1.0)
    totals = series.totals
    families.add(m.DRAFT_TOKENS, labels, totals.draft_tokens)
    families.add(m.ACCEPTED_TOKENS, labels, totals.accepted_tokens)
    families.add(m.DRAFTS, labels, totals.drafts)
    families.add(m.EMITTED_TOKENS, labels, totals.emitted_tokens)
    for position, count in enumerate(totals.accepted_by_position):
        families.add(m.ACCEPTED_BY_POSITION, {**labels, "position": str(position)}, count)
    for window, stats in series.windows:
        add_window(families, labels, window.name, stats)
    families.add(m.BREAK_EVEN, labels, view.config.cost.break_even_acceptance_ratio)
    histogram = series.histogram
    for bound, count in zip(INTERVAL_BUCKETS, histogram.bucket_counts, strict=True):
        families.add(m.INTERVAL_ACCEPTANCE, {**labels, "le": _fmt_bucket(bound)}, count, "_bucket")
    families.add(m.INTERVAL_ACCEPTANCE, {**labels, "le": "+Inf"}, histogram.observations, "_bucket")
    families.add(m.INTERVAL_ACCEPTANCE, labels, histogram.observations, "_count")
    families.add(m.INTERVAL_ACCEPTANCE, labels, histogram.sum, "_sum")
    judgement = series.judgement
    families.add(m.VERDICT, {**labels, "window": series.verdict_window or "", "verdict": judgement.verdict.value,
                             "basis": judgement.basis}, 1.0)
    for spec, value in series.reported:
        families.add(spec, labels, value)
    families.add(m.SOURCE_RESTARTS, labels, series.restarts)


def build_families(views: list[TargetView]) -> Families:
    families = Families()
    families.add(m.BUILD_INFO, {"version": exporter_version(), "python_version": platform.python_version()}, 1.0)
    for view in views:
        target = {"target": view.config.name, **dict(view.config.labels)}
        families.add(m.UP, target, 1.0 if view.up else 0.0)
        families.add(m.COLLECT_DURATION, target, view.collect_duration)
        for reason, count in view.errors:
            families.add(m.COLLECT_ERRORS, {**target, "reason": reason}, count)
        families.add(m.DROPPED_SERIES, target, view.dropped_series)
        for series in view.series:
            add_series(families, view, series)
    return families


class SpecDecodeCollector(Collector):
    def __init__(self, views: Callable[[], list[TargetView]]) -> None:
        self._views = views

    def collect(self) -> Iterator[Metric]:
        yield from build_families(self._views())

    def describe(self) -> Iterator[Metric]:
        yield from Families()
