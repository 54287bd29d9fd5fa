"""Series per pod for one model (the fleet budget, docs/series.md): the worst case the default config
allows, counted on a real sidecar's /metrics.

A simulated vLLM pod (`simulate`, with the proposed per-request α histogram and scheduled-steps families on, so
every feature the sidecar derives has data) is collected and tapped by sidecar processes (`run`) on loopback:

* default config with the tap on: ≤ 600 series for the model, every workload slot (max_workloads 10 + other +
  unset) × every temperature band (3 + unset) in use, and a hostile client naming 60 workloads and 50 models;
* the same with tap.class_histograms: the per-request histograms by class, at exactly their stated cost;
* the same with routing (observe mode): routing's per-class series, at their stated cost.

The counts per feature are printed (`pytest -s`): they are the table of docs/series.md.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devtools.procs import Process, free_port
from devtools.stack import start_sidecar, start_simulator
from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.tap.request_stats import LENGTH_BUCKETS, MAX_MODELS, SPEED_BUCKETS
from tests.tap.harness import tap_settings

pytestmark = pytest.mark.timeout(300)

BUDGET = 600
DEFAULTS = tap_settings()  # the declared defaults: max_workloads
MODEL = "m"
# Three α levels, so that requests fall in every acceptance band of the speed histogram.
WORKLOADS = [f"w{i}" for i in range(DEFAULTS.max_workloads + 2)]  # the last two become "other"
ALPHAS = (0.3, 0.58, 0.9)
TEMPERATURES = (0.1, 0.5, 0.9, None)  # the three bands of the default edges 0.3, 0.7, and unset
CLASSES = (DEFAULTS.max_workloads + 2) * len(TEMPERATURES)  # + other + unset workloads
SCENARIO = {"name": "budget", "models": [{
    "name": MODEL, "num_speculative_tokens": 3, "drafts_per_second": 100,
    "workloads": [{"name": w, "acceptance_rate": ALPHAS[i % 3], "temperature": 0.0} for i, w in enumerate(WORKLOADS)]}]}
# Series of one histogram: its bounds, +Inf, _count and _sum.
ACCEPTANCE_SERIES = len(m.ACCEPTANCE_RATIO_BUCKETS) + 1 + 2
LENGTH_SERIES = len(LENGTH_BUCKETS) + 1 + 2
SPEED_SERIES = len(SPEED_BUCKETS) + 1 + 2
ROUTE_SERIES_PER_CLASS = 4 + 1 + 2
WINDOWS = tuple(monitoring_config.shipped().sidecar_windows)  # the default config's windows

FEATURES: dict[str, tuple[m.MetricSpec, ...]] = {
    "latency": (m.TIME_PER_OUTPUT_TOKEN, m.TIME_PER_OUTPUT_TOKEN_TAIL, m.TIME_TO_FIRST_TOKEN, m.REQUESTS_RUNNING,
                m.REQUESTS_WAITING, m.REQUEST_TPOT, m.OBSERVED_SPEEDUP, m.CALIBRATED_COST, m.BREAK_EVEN_AT_LOAD,
                m.BASELINE_INFO),
    "speculation share and capacity": (m.SPECULATIVE_TOKEN_SHARE, m.GENERATED_TOKENS, m.PREEMPTIONS,
                                       m.KV_CACHE_USAGE, m.SCHEDULED_STEPS),
    "batch-size schedule": (m.RECOMMENDED_K_BY_BATCH_SIZE, m.EXPECTED_SPEEDUP_BY_BATCH_SIZE,
                            m.SCHEDULE_EXPECTED_GAIN),
    "tap counters": (m.REQUESTS, m.REQUEST_DRAFT_TOKENS, m.REQUEST_ACCEPTED_TOKENS, m.REQUESTS_WITHOUT_SPEC,
                     m.TAP_CONNECTIONS, m.TAP_BUFFERED_BYTES),
    "per-request histograms": (m.REQUEST_ACCEPTANCE, m.REQUEST_MEAN_LENGTH, m.REQUEST_SPEED),
    "measured variance": (m.REQUEST_DRAFT_TOKENS_SQUARED, m.REQUEST_ACCEPTED_TOKENS_SQUARED,
                          m.REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT, m.ACCEPTANCE_VARIANCE),
    "routing": m.ROUTE,
}


def feature_of(family: str) -> str:
    for feature, specs in FEATURES.items():
        if any(family == spec.name for spec in specs):
            return feature
    if family.startswith("specdecode_"):
        return "core counters and windows"
    return "process and runtime"  # process_*, python_*: prometheus_client's own


@dataclass(frozen=True)
class Count:
    """The series of one scrape: those of the model (or of no model: the pod's own), by feature; and the models
    the page names."""

    by_feature: Counter[str]
    models: frozenset[str]

    @property
    def total(self) -> int:
        return sum(self.by_feature.values())


def count_series(text: str) -> Count:
    by_feature: Counter[str] = Counter()
    models: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model_name")
            if model is not None:
                models.add(model)
            if model in (None, MODEL):
                by_feature[feature_of(family.name)] += 1
    return Count(by_feature, frozenset(models))


@dataclass(frozen=True)
class Pod:
    sidecar: Process
    tap: str


@dataclass(frozen=True)
class Pods:
    default: Pod
    class_histograms: Pod
    routing: Pod


def _sidecar(stack: contextlib.ExitStack, workdir: Path, name: str, upstream: str, **settings: object) -> Pod:
    tap = f"127.0.0.1:{free_port()}"
    sidecar = start_sidecar(stack, workdir, {
        "targets": [{"name": "vllm", "url": f"{upstream}/metrics"}],
        "collect": {"interval": "1s"},  # only how soon every window has data: no series depend on it
        "tap": {"listen_address": tap, **settings},
    }, name=name)
    return Pod(sidecar, f"http://{tap}")


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    workdir = tmp_path_factory.mktemp("budget")
    scenario = workdir / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    with contextlib.ExitStack() as stack:
        pod = start_simulator(stack, workdir, "vllm", "--scenario", str(scenario), "--pace", "false",
                              "--time-scale", "10", "--request-acceptance-histogram", "true",
                              "--spec-decode-scheduled-steps", "true")
        fallback = start_simulator(stack, workdir, "fallback", "--scenario", str(scenario), "--pace", "false",
                                   "--spec-decode", "false")
        found = Pods(_sidecar(stack, workdir, "default", pod.url),
                     _sidecar(stack, workdir, "class-histograms", pod.url, class_histograms=True),
                     _sidecar(stack, workdir, "routing", pod.url, route={"fallback_upstream": fallback.url}))
        for each in (found.default, found.class_histograms, found.routing):
            drive(each.tap)
        yield found


def ask(tap: str, model: str, workload: str | None, temperature: float | None) -> int:
    body: dict[str, object] = {"model": model, "prompt": "a b c d", "max_tokens": 24, "stream": True,
                               "stream_options": {"include_usage": True}}
    if temperature is not None:
        body["temperature"] = temperature
    headers = {"x-workload": workload} if workload is not None else {}
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{tap}/v1/completions", json=body, headers=headers) as response:
        response.read()
        return response.status_code


def drive(tap: str) -> None:
    """Every workload slot × every temperature band, a few requests each (so every acceptance band of the speed
    histogram fills); then a hostile client: 60 workload names for the model, 50 model names."""
    plan: list[tuple[str, str | None, float | None]] = [
        (MODEL, workload, temperature)
        for _ in range(3) for workload in (*WORKLOADS, None) for temperature in TEMPERATURES]
    hostile = [(MODEL, f"hostile-{i}", 0.2) for i in range(60)] + [(f"model-{i}", "w0", 0.2) for i in range(50)]
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda item: ask(tap, *item), plan + hostile))
    assert statuses[:len(plan)] == [200] * len(plan)
    assert set(statuses[len(plan):len(plan) + 60]) == {200}
    assert set(statuses[len(plan) + 60:]) == {404}, "the pod serves one model"


def settled(pod: Pod, ready: Callable[[Count], bool]) -> Count:
    """The count once every window and the schedule have data: it grows with collections, then stays."""
    deadline = time.monotonic() + 60
    previous = None
    while True:
        count = count_series(httpx.get(f"{pod.sidecar.url}/metrics", timeout=10).text)
        if ready(count) and count == previous:
            return count
        assert time.monotonic() < deadline, f"series never settled: {count}"
        previous = count
        time.sleep(2.5)


def complete(count: Count) -> bool:
    return all(count.by_feature[f] for f in ("latency", "speculation share and capacity", "batch-size schedule",
                                             "tap counters", "per-request histograms", "measured variance"))


def report(name: str, count: Count) -> None:
    print(f"\n{name}: {count.total} series for model {MODEL!r}")
    for feature, n in sorted(count.by_feature.items()):
        print(f"  {feature}: {n}")


def test_one_model_fits_the_budget_at_the_default_config(pods: Pods) -> None:
    count = settled(pods.default, complete)
    report("default config, tap on", count)
    assert count.total <= BUDGET, count
    # The per-request distribution stays, per model: α, mean acceptance length, speed by acceptance band.
    assert count.by_feature["per-request histograms"] == ACCEPTANCE_SERIES + LENGTH_SERIES + 3 * SPEED_SERIES
    # Exact α per class stays: three counters per class in use, every class of the worst case.
    assert count.by_feature["tap counters"] >= 3 * CLASSES
    # The variance's sums per model, not per class (3 × 48 more would break the budget), and v per window.
    assert count.by_feature["measured variance"] == 3 + len(WINDOWS)
    assert "routing" not in count.by_feature
    # The hostile names are capped: the model names a page can carry are max_models + other.
    assert MODEL in count.models and len(count.models) <= MAX_MODELS + 1


def samples(pod: Pod, name: str) -> list[dict[str, str]]:
    """The labels of ``name``'s samples for the model, each with its value under "value"."""
    text = httpx.get(f"{pod.sidecar.url}/metrics", timeout=10).text
    return [{**s.labels, "value": str(s.value)} for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name and s.labels.get("model_name") == MODEL]


def observations(pod: Pod) -> float:
    return sum(float(s["value"]) for s in samples(pod, m.REQUEST_ACCEPTANCE.name + "_count"))


def test_the_per_model_histogram_holds_every_request(pods: Pods) -> None:
    """One α histogram for the model, without class labels, with one observation per request (each drafted): the
    classes' histograms pooled, not one of them."""
    [count] = samples(pods.default, m.REQUEST_ACCEPTANCE.name + "_count")
    assert "workload" not in count and "temperature" not in count
    requests = sum(float(s["value"]) for s in samples(pods.default, m.REQUESTS.exposed_name))
    assert float(count["value"]) == requests == 3 * (len(WORKLOADS) + 1) * len(TEMPERATURES) + 60
    by_class = samples(pods.class_histograms, m.REQUEST_ACCEPTANCE.name + "_count")
    assert len(by_class) == CLASSES and all("workload" in s and "temperature" in s for s in by_class)
    assert observations(pods.class_histograms) == observations(pods.default)


def test_the_variance_is_measured_per_model_on_the_tapped_requests(pods: Pods) -> None:
    """The three sums per model agree with the per-class drafted and accepted counters (Cauchy–Schwarz: ΣD² ≥
    (ΣD)²/N; A ≤ D per request); over the longest window every request counts, so v there is measured, on all of
    them, and the status API says the same."""
    def total(name: str) -> float:
        return sum(float(s["value"]) for s in samples(pods.default, name))

    requests, drafted, accepted = (total(spec.exposed_name) for spec in
                                   (m.REQUESTS, m.REQUEST_DRAFT_TOKENS, m.REQUEST_ACCEPTED_TOKENS))
    squared, accepted_squared, product = (total(spec.exposed_name) for spec in (
        m.REQUEST_DRAFT_TOKENS_SQUARED, m.REQUEST_ACCEPTED_TOKENS_SQUARED, m.REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT))
    assert squared >= drafted**2 / requests > 0 and accepted_squared >= accepted**2 / requests > 0
    assert accepted_squared <= product <= squared  # each request accepts at most what it drafted: A² ≤ A·D ≤ D²
    gauge = {s["window"]: s for s in samples(pods.default, m.ACCEPTANCE_VARIANCE.name)}
    assert set(gauge) == set(WINDOWS)
    longest = gauge[WINDOWS[-1]]
    assert longest["source"] == "measured" and float(longest["value"]) > 0
    status = httpx.get(f"{pods.default.sidecar.url}/api/v1/status", timeout=10).json()
    rows = {row["window"]: row for row in status["targets"][0]["requests"]["variance"] if row["model_name"] == MODEL}
    assert rows[WINDOWS[-1]]["source"] == "measured" and rows[WINDOWS[-1]]["requests"] == requests


def class_labels(pod: Pod) -> set[tuple[str, str]]:
    text = httpx.get(f"{pod.sidecar.url}/metrics", timeout=10).text
    return {(s.labels["workload"], s.labels["temperature"]) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == m.REQUESTS.exposed_name and s.labels.get("model_name") == MODEL}


def test_every_class_slot_is_in_use(pods: Pods) -> None:
    classes = class_labels(pods.default)
    assert len(classes) == CLASSES
    assert {"other", "unset"} <= {workload for workload, _ in classes}
    assert "unset" in {temperature for _, temperature in classes}


def test_class_histograms_cost_what_the_docs_state(pods: Pods) -> None:
    default = settled(pods.default, complete)
    drilled = settled(pods.class_histograms, complete)
    report("with tap.class_histograms", drilled)
    extra = drilled.by_feature["per-request histograms"] - default.by_feature["per-request histograms"]
    # The α and mean-length histograms once per class instead of once per model.
    assert extra == (CLASSES - 1) * (ACCEPTANCE_SERIES + LENGTH_SERIES)
    assert drilled.total - default.total == extra


def test_routing_costs_what_the_docs_state(pods: Pods) -> None:
    default = settled(pods.default, complete)
    routed = settled(pods.routing, lambda count: complete(count) and count.by_feature["routing"] > 0)
    report("with routing (observe)", routed)
    # At least each class's request counter (speculative, unrouted) and its state; at most, per class, the four
    # (upstream, reason) counters, the state and the two measured speedups (enforce mode, a routed class). The
    # hostile client's 60 requests route the "other" class here (α 0.3 against the break-even 0.5).
    assert 2 * CLASSES <= routed.by_feature["routing"] <= ROUTE_SERIES_PER_CLASS * CLASSES
    assert routed.total - default.total == routed.by_feature["routing"]
