"""The suite's slow tests, each with why it is slow: what `make test-fast` leaves out (with the real engines) and
what `make test` starts first on its pytest-xdist workers, longest first, so that the longest ones do not
begin last (docs/tests.md, whose table this is).

A run with `-n N` hands its tests to the workers in units (tests/conftest.py): an entry here names a directory, a
file or one test (all its parameters) by node id or its prefix, and the tests it names are one unit, run on one
worker in their order, so that whatever they share (a module's or the session's servers) is set up once. Name a
single test only where it shares no module-scoped fixture with its neighbours. Every other test is in its file's
unit. `seconds` is about what the unit took in CI's last `make test` (its tests'
setup, call and teardown, one at a time on CI's 2 cores): it orders the units, and tells a reader what to expect.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slow:
    where: str  # node id or its prefix: "tests/vllm/", "tests/e2e/test_alert_chain.py", "...py::test_x"
    seconds: int
    why: str

    def names(self, nodeid: str) -> bool:
        if self.where.endswith("/"):
            return nodeid.startswith(self.where)
        return nodeid == self.where or nodeid.startswith((f"{self.where}::", f"{self.where}["))


PROMTOOL = "tests/rules/test_rules.py::test_promtool_unit_tests"

SLOW: tuple[Slow, ...] = (
    Slow("tests/integration/test_demo_timeline.py::test_the_demo_does_what_its_page_says_when_it_says", 510,
         "the demo for one whole loop of its scenario in real time (it has no faster clock), every claim of "
         "docs/demo.md's timeline checked over its span"),
    Slow("tests/vllm/", 390, "a real vLLM (CPU build): five server starts of 30-40 s, two pairs side by side (the "
         "session's ngram server and its no-spec baseline; two small-KV servers) and a draft-model server, and CPU "
         "inference"),
    Slow(f"{PROMTOOL}[page.test.yaml]", 185, "promtool evaluates every rule every 15 s over three simulated hours, "
         "for each of six scenarios"),
    Slow("tests/bench/test_bench_fleet.py::test_run_py_measures_the_fleet_and_keeps_the_other_sections", 175,
         "the fleet bench at its smoke size: simulated pods through a real Prometheus, and the steady state's "
         "backfilled two hours"),
    Slow("tests/e2e/test_alert_chain.py", 160, "the page end to end on Prometheus' and Alertmanager's real "
         "clocks: restart, blip, page and resolve, dip (for: 15s, 1 s evaluations)"),
    Slow(f"{PROMTOOL}[page_days.test.yaml]", 145, "promtool evaluates every rule every minute over three simulated "
         "days (the page's 2h windows over a day's records)"),
    Slow("tests/integration/test_demo_draft_length.py", 137, "the packaged demo's busy phase in real time "
         "(25 s healthy, 80 s busy so that a 1m window lies inside it, 30 s recovered)"),
    Slow("tests/e2e/test_speculation_alerts.py", 110, "fake vLLMs until an acceptance gate closes and the KV "
         "cache starves, then the alerts' for: on Prometheus' real clock"),
    Slow("tests/e2e/test_latency_alerts.py", 80, "three latency alerts fire on Prometheus' real clock"),
    Slow("tests/e2e/test_victoriametrics.py", 75, "vmagent shards, vmalert and Alertmanager on their real clocks, "
         "and the dashboard's queries on VictoriaMetrics"),
    Slow("tests/grafana/test_grafana_prometheus.py", 60, "every dashboard query on a real Prometheus that "
         "scraped a live sidecar for a minute or more"),
    Slow("tests/bench/test_bench_paging.py::test_a_small_run_pages_on_drops_and_agrees_with_promtool", 53,
         "the paging bench's small run: simulated days through promtool's rule evaluation"),
    Slow(f"{PROMTOOL}[drift.test.yaml]", 50, "promtool evaluates every rule every minute over 26 simulated hours "
         "(the drift alert's 1-day baseline)"),
    Slow("tests/e2e/test_hidden_workload.py", 45, "the tap's per-request alerts on Prometheus' real clock"),
    Slow("tests/e2e/test_tpot_quantiles.py", 40, "TPOT histograms scraped by a real Prometheus for two windows"),
    Slow("tests/integration/test_series_budget.py", 35, "simulated pods and three sidecar processes until every "
         "window, class and workload slot has data"),
    Slow("tests/soak/", 30, "a soak: restarts, failures and label churn over simulated hours"),
    Slow(f"{PROMTOOL}[two_stages.test.yaml]", 25, "promtool evaluates every rule every 15 s over 2.5 simulated "
         "hours and holds the stage's α to the one-stage rate() at every window, over a reset, a gap, churn and a "
         "sidecar restart"),
)


def find(nodeid: str) -> Slow | None:
    """The entry that names this test, the most specific first."""
    found = [slow for slow in SLOW if slow.names(nodeid)]
    return max(found, key=lambda slow: len(slow.where), default=None)


def unit(nodeid: str) -> str:
    """The unit a test runs in on a pytest-xdist worker: its entry's, or its file."""
    entry = find(nodeid)
    return entry.where if entry is not None else nodeid.split("::", 1)[0]


def seconds(nodeid: str) -> int:
    entry = find(nodeid)
    return entry.seconds if entry is not None else 0
