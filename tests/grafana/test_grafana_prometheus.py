"""End to end: every query of the Grafana dashboard, run against a real Prometheus that scrapes the sidecar
(fed by the simulator) and the simulator itself (standing in for vLLM's own /metrics), with the project's
recording and alerting rules loaded. Every panel query, annotation and variable query must parse, succeed
and return data with no NaN/Inf — for "All" selections and for one concrete selection of every variable.

Needs the Debian `prometheus` binary (scripts/install-tools.sh): skipped without it, failed in CI."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from devtools.chain import write_shipped_rules
from devtools.procs import Process, exporter_command, free_port, prometheus_binary, running, tail
from specdecode_exporter.demo import send_traffic
from tests.grafana.grafana_dashboard_helpers import (
    all_selection,
    annotation_queries,
    load_dashboard,
    panel_queries,
    substitute,
    variable_queries,
)
from tests.helpers import require_tool

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ACCEPTANCE = 0.7  # the simulator's steady acceptance rate
SIDECAR_JOB = "specdecode-exporter"  # matches the alerts' exporter_job_selector job=~".*specdecode.*"
# Labels a Kubernetes scrape would add; given to both scrape jobs so namespace/pod variables are exercised.
K8S_LABELS = {"namespace": "llm", "pod": "vllm-0"}
RECENT_S = 20  # the range over which the sidecar's counters and vLLM's are compared
DEADLINE_S = 75.0  # for every query to have data
STARTUP_S = 60.0  # for the first sidecar sample in Prometheus (the machine may be busy with other tests)

# Queries that are legitimately empty in a steady, healthy run of a few seconds, and why.
ALLOWED_EMPTY: dict[str, str] = {
    "Firing alerts": "nothing is wrong in a steady α=0.7 run, and every alert has a `for:` of minutes",
    "annotation": "the firing-alerts annotation: no alert fires in a healthy run",
    "α as the alerts see it (recording rules) [C]": "the 1-day baseline ends 1h ago: no history that old here",
    "α as the alerts see it (recording rules) [D]": "the drift threshold is derived from the 1-day baseline",
    "Tapped requests without spec-decode metrics": "every tapped request of a healthy run carries its metrics",
    "Measured speedup of routed classes (randomized canary)": "routing observes only (no randomized split) and "
                                                              "no class is below break-even at α=0.7",
    "The page's variance per drafted token: measured or assumed [B]": "the rules' bound reads the hour before the "
                                                                     "last 10 minutes: no history that old here",
}


@dataclass
class Stack:
    prometheus: str  # base URL
    sidecar_instance: str
    model_name: str
    traffic_started: float  # time.monotonic() when the tap's traffic began


def instant(client: httpx.Client, expr: str) -> dict[str, Any]:
    resp = client.get("/api/v1/query", params={"query": expr})
    # Until its storage is ready Prometheus answers 503 in plain text, not JSON.
    assert resp.status_code == 200, f"{expr}\n→ {resp.status_code} {resp.text[:200]}"
    body: dict[str, Any] = resp.json()
    assert body.get("status") == "success", f"{expr}\n→ {body}"
    return body


def samples(body: Mapping[str, Any]) -> list[tuple[dict[str, str], float]]:
    data = body["data"]
    if data["resultType"] == "scalar":
        return [({}, float(data["result"][1]))]
    return [(r["metric"], float(r["value"][1])) for r in data["result"]]


def sidecar_config(spec_url: str, control_url: str) -> dict[str, Any]:
    """The spec-decode simulator with the control one (spec decode off) as its baseline, and the request tap."""
    return {"targets": [{"name": "vllm", "url": f"{spec_url}/metrics", "baseline": {"target": "control"}},
                        {"name": "control", "url": f"{control_url}/metrics", "spec_decode": False}],
            "collect": {"interval": "1s"}, "windows": [f"{RECENT_S}s", "1m", "5m", "15m", "1h"]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = require_tool(prometheus_binary(), "prometheus (Debian package prometheus)")
    tmp = tmp_path_factory.mktemp("grafana-e2e")
    cli = exporter_command()
    tap_port = free_port()
    stop = threading.Event()
    with contextlib.ExitStack() as started:
        simulator = started.enter_context(running("simulator", lambda port: [
            *cli, "simulate", "--web.listen-address", f"127.0.0.1:{port}", "--acceptance-rate", str(ACCEPTANCE),
            "--pace", "false", "--spec-decode-scheduled-steps", "true"], tmp, "/health"))
        control = started.enter_context(running("control", lambda port: [
            *cli, "simulate", "--web.listen-address", f"127.0.0.1:{port}", "--acceptance-rate", str(ACCEPTANCE),
            "--spec-decode", "false"], tmp, "/health"))
        (tmp / "sidecar.yaml").write_text(yaml.safe_dump(sidecar_config(simulator.url, control.url)))
        sidecar = started.enter_context(running("sidecar", lambda port: [
            *cli, "run", "--config.file", str(tmp / "sidecar.yaml"), "--web.listen-address", f"127.0.0.1:{port}",
            "--tap.listen-address", f"127.0.0.1:{tap_port}",
            # routing in observe mode: every class is judged and counted, every request still goes to the simulator
            "--tap.route.fallback-upstream", control.url], tmp, "/healthz"))
        sidecar_address = sidecar.url.removeprefix("http://")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(write_shipped_rules(tmp / "rules.yaml"))],
            "scrape_configs": [
                {"job_name": SIDECAR_JOB, "static_configs": [{"targets": [sidecar_address], "labels": K8S_LABELS}]},
                {"job_name": "vllm", "static_configs": [{"targets": [simulator.url.removeprefix("http://")],
                                                         "labels": K8S_LABELS}]},
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        prom = started.enter_context(running("prometheus", lambda port: [
            prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ], tmp, "/-/ready"))
        model = wait_for_model(prom.url, (simulator, control, sidecar, prom))
        traffic = threading.Thread(target=send_traffic, args=(f"http://127.0.0.1:{tap_port}", model, stop),
                                   daemon=True)
        traffic.start()
        traffic_started = time.monotonic()
        started.callback(traffic.join, 5)
        started.callback(stop.set)
        yield Stack(prometheus=prom.url, sidecar_instance=sidecar_address, model_name=model,
                    traffic_started=traffic_started)


def wait_for_model(prometheus: str, processes: tuple[Process, ...]) -> str:
    """The model name, once Prometheus has scraped the sidecar."""
    deadline = time.monotonic() + STARTUP_S
    with httpx.Client(base_url=prometheus, timeout=5) as client:
        while time.monotonic() < deadline:
            for proc in processes:
                assert proc.alive(), f"{proc.name} exited:\n{tail(proc.log)}"
            with contextlib.suppress(httpx.HTTPError, AssertionError):
                result = instant(client, "specdecode_drafts_total")["data"]["result"]
                if result:
                    return str(result[0]["metric"]["model_name"])
            time.sleep(0.5)
    raise AssertionError("Prometheus never scraped the sidecar:\n" + "\n".join(
        f"--- {p.name}\n{tail(p.log)}" for p in processes))


def grafana_regex(value: str) -> str:
    """How Grafana's Prometheus datasource interpolates a multi-value variable holding one value."""
    escaped = value.replace("\\", "\\\\\\\\")
    for ch in "$^*{}[]'+?.()|":
        escaped = escaped.replace(ch, "\\\\" + ch)
    return f"({escaped})"


def concrete_selection(stack: Stack, window: str) -> dict[str, str]:
    values = {
        "namespace": K8S_LABELS["namespace"],
        "pod": K8S_LABELS["pod"],
        "job": SIDECAR_JOB,
        "instance": stack.sidecar_instance,
        "model_name": stack.model_name,
        "engine": "0",
    }
    selection = {k: grafana_regex(v) for k, v in values.items()}
    return {**all_selection(load_dashboard(), window), **selection}


@dataclass(frozen=True)
class Case:
    name: str
    expr: str


def cases(dashboard: Mapping[str, Any], values: Mapping[str, str]) -> list[Case]:
    out = [Case(f"{q.panel_title} [{q.ref_id}]", substitute(q.expr, values)) for q in panel_queries(dashboard)]
    out += [Case("annotation", substitute(e, values)) for e in annotation_queries(dashboard)]
    for name, query in variable_queries(dashboard).items():
        inner = query[len("label_values(") : query.rindex(",")]
        out.append(Case(f"variable {name}", f"count by ({name}) ({substitute(inner, values)})"))
    return out


def allowed_empty(case: Case) -> bool:
    return any(case.name == key or case.name.startswith(key + " [") for key in ALLOWED_EMPTY)


def run_until_data(client: httpx.Client, todo: list[Case]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Run every case (each must succeed every time); retry the empty ones until the deadline, since a
    freshly started Prometheus needs a few scrapes before rate() over the short ranges has two samples."""
    results: dict[str, list[tuple[dict[str, str], float]]] = {}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        for case in todo:
            results[case.name] = samples(instant(client, case.expr))
        missing = [c for c in todo if not results[c.name] and not allowed_empty(c)]
        if not missing or time.monotonic() > deadline:
            return results
        time.sleep(2)


@pytest.mark.parametrize("selection", ["all", "concrete"])
@pytest.mark.parametrize("window", ["1m", "5m"])
def test_every_query_returns_data(stack: Stack, window: str, selection: str) -> None:
    dashboard = load_dashboard()
    values = all_selection(dashboard, window) if selection == "all" else concrete_selection(stack, window)
    todo = cases(dashboard, values)
    assert len(todo) > 40
    with httpx.Client(base_url=stack.prometheus, timeout=10) as client:
        results = run_until_data(client, todo)
    empty = [c for c in todo if not results[c.name] and not allowed_empty(c)]
    assert not empty, "no data for:\n" + "\n".join(f"  {c.name}: {c.expr}" for c in empty)
    bad = [(c.name, v) for c in todo for _, v in results[c.name] if math.isnan(v) or math.isinf(v)]
    assert not bad, f"NaN/Inf values: {bad}"


def test_headline_numbers_agree(stack: Stack) -> None:
    """The dashboard's headline α, mean length and expected speedup equal the sidecar's own gauges over the same
    recent window, and at 5m the recording rules the alerts read; the sidecar's counters move as vLLM's do.

    Same window on both sides: the stack is younger than 5m, and the sidecar's 5m window opens at its first
    collection while Prometheus' opens at its first scrape of it, so the tap's lower-α traffic (temperature 1)
    weighs differently in each. Over the last RECENT_S seconds, once the traffic has run longer, it does not."""
    dashboard = load_dashboard()
    by_title = {q.panel_title: q for q in panel_queries(dashboard)}
    with httpx.Client(base_url=stack.prometheus, timeout=10) as client:
        run_until_data(client, [Case("rule", "model:specdecode_acceptance_ratio:rate5m")])
        time.sleep(max(0.0, stack.traffic_started + RECENT_S + 5 - time.monotonic()))

        def one(expr: str) -> float:
            found = samples(instant(client, expr))
            assert len(found) == 1, (expr, found)
            return found[0][1]

        def panel(title: str, window: str) -> float:
            return one(substitute(by_title[title].expr, all_selection(dashboard, window)))

        recent = f"{RECENT_S}s"
        # the same query; the rule's value is from its last evaluation, up to one interval earlier
        assert panel("Acceptance rate α", "5m") == pytest.approx(
            one("model:specdecode_acceptance_ratio:rate5m"), abs=0.01)
        assert panel("Mean acceptance length", "5m") == pytest.approx(
            one("model:specdecode_mean_acceptance_length:rate5m"), abs=0.03)
        alpha = panel("Acceptance rate α", recent)
        assert alpha == pytest.approx(one(f'specdecode_acceptance_ratio{{window="{recent}"}}'), abs=0.03)
        speedup = panel("Expected speedup", recent)
        assert speedup == pytest.approx(one(f'specdecode_expected_speedup{{window="{recent}"}}'), abs=0.05)

        def pooled(accepted: str, drafted: str, job: str) -> float:
            def rate(metric: str) -> str:
                return f'sum(rate({metric}{{job="{job}"}}[{recent}]))'
            return one(f"{rate(accepted)} / {rate(drafted)}")

        assert pooled("specdecode_accepted_tokens_total", "specdecode_draft_tokens_total", SIDECAR_JOB) == \
            pytest.approx(pooled("vllm:spec_decode_num_accepted_tokens_total",
                                 "vllm:spec_decode_num_draft_tokens_total", "vllm"), abs=0.03)
        assert alpha == pytest.approx(ACCEPTANCE, abs=0.1)  # the tap's hotter requests pull it a little lower
        assert speedup > 1.0  # α near 0.7 > break-even 0.5


def test_idle_selection_shows_no_traffic_not_nan(stack: Stack) -> None:
    """A model with no traffic (here: a name that matches nothing) gives empty results — Grafana then shows
    the panel's noValue ("No traffic") — never NaN."""
    dashboard = load_dashboard()
    values = {**all_selection(dashboard, "1m"), "model_name": "(no-such-model)"}
    with httpx.Client(base_url=stack.prometheus, timeout=10) as client:
        for q in panel_queries(dashboard):
            for _, v in samples(instant(client, substitute(q.expr, values))):
                assert not math.isnan(v), (q.panel_title, q.expr)
