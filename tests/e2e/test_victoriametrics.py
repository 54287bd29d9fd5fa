"""The generated rules on a horizontally scalable backend (issue #23): Debian's VictoriaMetrics (victoria-metrics,
vmagent, vmalert) instead of Prometheus.

Four simulated pods, each the simulator and a real sidecar: two serve fleet/paged at α 0.35, two fleet/healthy at
α 0.75 → two vmagent shards (-promscrape.cluster.membersCount=2, memberNum 0 and 1) scrape the sidecars and
remote-write to one victoria-metrics → vmalert evaluates the generated rules (e2e profile, the groups as generated)
against it, writes its records and ALERTS back to it → Alertmanager with the example routing → webhook. A second
vmalert with the shipped recording groups writes to a second victoria-metrics the shards also feed. devtools.fleet
builds it.

1. the shards split the targets: each scrapes some, none the same, together all; every sidecar's samples land;
2. the page the Prometheus chain delivers (tests/e2e/test_alert_chain.py: SpecDecodeAcceptanceRateLow, critical,
   {namespace, model_name}, the pager receiver, the same summary) reaches Alertmanager for fleet/paged, from records
   vmalert wrote to the store and read back; fleet/healthy, with the same traffic, never goes pending;
3. every rule of both rulers (the e2e profile's, and a second vmalert with the shipped recording groups, which the
   dashboard reads) evaluates without an error, and every query of the dashboard runs on VictoriaMetrics'
   /api/v1/query_range (MetricsQL) without an error, over data: vmagent also scrapes vLLM's own /metrics.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devtools import chain as c
from devtools.fleet import (
    Fleet,
    PodSpec,
    running_fleet,
    victoria_metrics_binary,
    vmagent_binary,
    vmalert_binary,
)
from devtools.procs import alertmanager_binary
from devtools.stack import wait_until
from specdecode_exporter.monitoring import stage
from tests.grafana.grafana_dashboard_helpers import (
    all_selection,
    annotation_queries,
    load_dashboard,
    panel_queries,
    substitute,
)
from tests.helpers import require_tool

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(360)]

PAGED, HEALTHY = "fleet/paged", "fleet/healthy"
LOW_ALPHA, HEALTHY_ALPHA = 0.35, 0.75
SPECS = [PodSpec("paged", PAGED, LOW_ALPHA), PodSpec("healthy", HEALTHY, HEALTHY_ALPHA),
         PodSpec("paged", PAGED, LOW_ALPHA), PodSpec("healthy", HEALTHY, HEALTHY_ALPHA)]
STARTUP_S = 60.0
SHIPPED_ALPHA = "model:specdecode_acceptance_ratio:rate5m"  # a record of the shipped rules the dashboard reads
# VictoriaMetrics' vmalert adds the group's name to every alert it sends; the rest of the labels are the rules'.
VMALERT_LABELS = {"alertgroup"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    for path, what in ((victoria_metrics_binary(), "victoria-metrics"), (vmagent_binary(), "vmagent"),
                       (vmalert_binary(), "vmalert")):
        require_tool(path, f"{what} (Debian package victoria-metrics)")
    require_tool(alertmanager_binary(), "alertmanager (Debian package prometheus-alertmanager)")
    with running_fleet(tmp_path_factory.mktemp("vm-fleet"), SPECS) as running:
        yield running


def model_states(fleet: Fleet) -> dict[str, set[str]]:
    """model_name -> the states vmalert has the page in now."""
    states: dict[str, set[str]] = {}
    for alert in fleet.rule_alerts(c.PAGE_ALERT):
        states.setdefault(alert["labels"].get("model_name", ""), set()).add(str(alert["state"]))
    return states


def test_the_shards_split_the_targets(fleet: Fleet, record: list[dict[str, Any]]) -> None:
    sidecars = {pod.address for pod in fleet.pods}
    every = sidecars | {pod.simulator.url.removeprefix("http://") for pod in fleet.pods}
    taken = [fleet.shard_targets(shard) for shard in fleet.shards]
    assert all(shard & sidecars for shard in taken), f"a shard scrapes no sidecar: {taken}"
    assert not taken[0] & taken[1], f"both shards scrape {taken[0] & taken[1]}"
    assert taken[0] | taken[1] == every, taken
    # Each shard's samples reach the store: every sidecar is up there, under the pod label its target carries.
    up = f'up{{job="{c.JOB}", namespace="{c.NAMESPACE}"}} == 1'
    wait_until(lambda: fleet.values(up, "instance").keys() == sidecars, STARTUP_S,
               "every sidecar up in VictoriaMetrics", fleet.processes)
    assert fleet.values(up, "pod").keys() == set(fleet.pod_names.values())
    line = f"vmagent shards: {len(taken[0])} + {len(taken[1])} of {len(every)} targets, disjoint, all in the store"
    print("\n" + line)
    record.append({"line": line, "scenario": "vm-shards", "shard_targets": [len(t) for t in taken]})


def stage_records(fleet: Fleet) -> dict[str, dict[str, float]]:
    """What the α record was computed from, per model: each stage record's samples and sum over the page window."""
    window = fleet.settings.statistics.page_windows[0]
    records = (stage.record(fleet.settings, "accepted_tokens"), stage.record(fleet.settings, "draft_tokens"))
    return {f"{fn}({record})": fleet.values(f"{fn}({record}[{window}])", "model_name")
            for record in records for fn in ("count_over_time", "sum_over_time")}


def test_the_page_reaches_alertmanager(fleet: Fleet, record: list[dict[str, Any]]) -> None:
    settings = fleet.settings
    for_s, threshold = c.seconds(settings.alert(c.PAGE_ALERT).for_), settings.thresholds.page_acceptance_ratio
    t0 = time.time()

    def paged() -> c.Notification | None:
        assert HEALTHY not in model_states(fleet), f"{HEALTHY} went pending: {model_states(fleet)}"
        found = fleet.webhook.find(receiver="/pager", alertname=c.PAGE_ALERT, status="firing")
        return found[0] if found else None

    window_s = c.seconds(settings.statistics.page_windows[0])
    page = wait_until(paged, window_s + for_s + 90, f"{c.PAGE_ALERT} at the pager webhook", fleet.processes)
    t_page = time.time()

    (alert,) = page.alerts(c.PAGE_ALERT, "firing")
    labels = {k: v for k, v in alert["labels"].items() if k not in VMALERT_LABELS}
    assert labels == {"alertname": c.PAGE_ALERT, "severity": "critical", "namespace": c.NAMESPACE,
                      "model_name": PAGED}, alert["labels"]
    assert alert["labels"].get("alertgroup", "specdecode.alerts") == "specdecode.alerts"
    assert page.payload["receiver"] == "pager"
    ann = alert["annotations"]
    assert ann["summary"] == f"Speculative decoding acceptance rate for {PAGED} is below {threshold:.0%}", ann
    value = re.search(r"accepted only ([0-9.]+)%", ann["description"])
    assert value is not None and LOW_ALPHA * 100 - 5 <= float(value.group(1)) < threshold * 100, ann["description"]
    assert ann["runbook_url"].endswith("/alerts/runbook.md#" + c.PAGE_ALERT.lower()), ann

    # The healthy model had the same traffic for as long: watch it past another for: and the delivery.
    deadline = time.monotonic() + for_s + 2 * c.GROUP_INTERVAL_S
    while time.monotonic() < deadline:
        fleet.check_alive()
        assert HEALTHY not in model_states(fleet), f"{HEALTHY} went pending: {model_states(fleet)}"
        time.sleep(0.5)
    for notification in fleet.webhook.all():
        assert not notification.alerts(c.PAGE_ALERT) or all(
            a["labels"]["model_name"] == PAGED for a in notification.alerts(c.PAGE_ALERT)), notification.payload
    # The records vmalert wrote to the store and its alert group read back: α per model, as the pods serve it.
    alpha = fleet.values(c.alpha_record(settings, settings.statistics.page_windows[0]) +
                         f'{{namespace="{c.NAMESPACE}"}}', "model_name")
    assert alpha[PAGED] == pytest.approx(LOW_ALPHA, abs=0.05), alpha
    assert alpha[HEALTHY] == pytest.approx(HEALTHY_ALPHA, abs=0.05), (alpha, stage_records(fleet))
    firing = fleet.values(f'ALERTS{{alertname="{c.PAGE_ALERT}", alertstate="firing"}}', "model_name")
    assert set(firing) == {PAGED}, firing

    line = (f"VictoriaMetrics: {c.PAGE_ALERT} for {PAGED} at the pager {t_page - t0:.1f}s into the test "
            f"(α {alpha[PAGED]:.3f}; {HEALTHY} at α {alpha[HEALTHY]:.3f} never pending)")
    print("\n" + line)
    record.append({"line": line, "scenario": "vm-page", "alpha": alpha})


def test_every_rule_evaluates_on_victoriametrics(fleet: Fleet) -> None:
    """Both rulers' last evaluation of every rule succeeded: the e2e profile's groups (alerts included) and the
    shipped recording groups, as MetricsQL runs them."""
    wait_until(lambda: fleet.query(SHIPPED_ALPHA, fleet.recordings), STARTUP_S,
               f"{SHIPPED_ALPHA} in VictoriaMetrics", fleet.processes)
    assert fleet.rule_errors(fleet.vmalert) == []
    assert fleet.rule_errors(fleet.recorder) == []
    # Each ruler writes to its own store: both record the short stage under the same names at different intervals,
    # and in one store each would add samples to the other's series (the healthy model's α read 0.655, not 0.75).
    assert fleet.query(SHIPPED_ALPHA) == [], "the shipped recordings reached the page's store"


@pytest.mark.parametrize("window", ["1m", "5m"])
def test_the_dashboard_queries_run_on_victoriametrics(fleet: Fleet, window: str, record: list[dict[str, Any]]) -> None:
    """Every panel and annotation query, with every variable at "All", over the stack's history: no query errors
    on MetricsQL. The data is there: vLLM's and the sidecars' series, the shipped recordings."""
    dashboard = load_dashboard()
    values = all_selection(dashboard, window)
    wait_until(lambda: len(fleet.query(SHIPPED_ALPHA, fleet.recordings)) >= 2, STARTUP_S,
               f"{SHIPPED_ALPHA} for both models", fleet.processes)
    end = time.time()
    start = end - 180
    queries = [(f"{q.panel_title} [{q.ref_id}]", q.expr) for q in panel_queries(dashboard)]
    queries += [("annotation", expr) for expr in annotation_queries(dashboard)]
    errors, empty = [], []
    for name, expr in queries:
        resp = fleet.query_range(substitute(expr, values), start, end, "5s")
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        if resp.status_code != 200 or body.get("status") != "success":
            errors.append(f"{name}: {resp.status_code} {resp.text[:300]}")
        elif not body["data"]["result"]:
            empty.append(name)
    assert not errors, "\n".join(errors)
    assert "α as the alerts see it (recording rules) [A]" not in empty
    assert len(empty) <= len(queries) // 2, f"{len(empty)} of {len(queries)} queries without data: {empty}"
    line = (f"dashboard on VictoriaMetrics ({window}): {len(queries)} queries, no error, {len(queries) - len(empty)} "
            "with data (the rest need the request tap's traffic or control pods)")
    print("\n" + line)
    record.append({"line": line, "scenario": f"vm-dashboard-{window}", "queries": len(queries), "empty": empty})
