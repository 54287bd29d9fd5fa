"""The speculation alerts (issue #22), end to end, each firing in its scenario and silent in a healthy one: fake
vLLMs → the sidecar (a spec-decode target with a control target as its baseline) → Debian's Prometheus with the
real rules built with the e2e profile (1m/2m windows, `for: 15s`).

    model    spec decode                                           expected
    gated    α 0.3, an acceptance gate like TensorRT-LLM's (20      SpecDecodeSpeculationStopped: the engine generates
             requests, mean acceptance length 2.0): it closes      on without drafting
             after about 14 s
    starved  α 0.75; the draft model takes half of a 30000-token    SpecDecodePreemptionsRaised and
             KV cache: 23 requests run where 30 want to, the rest   SpecDecodeThroughputCut against the control
             wait and the excess preempts                           pods, which fit the same demand
    healthy  α 0.75, the same gate (never closes), room to spare    nothing
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.chain import NAMESPACE, rules_settings, seconds, write_rules
from devtools.procs import Process, prometheus_binary
from devtools.stack import (
    Prometheus,
    scrape_job,
    start_prometheus,
    start_sidecar,
    start_spec_and_control,
    wait_until,
)
from tests.helpers import require_tool

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STOPPED, PREEMPTIONS, THROUGHPUT = ("SpecDecodeSpeculationStopped", "SpecDecodePreemptionsRaised",
                                    "SpecDecodeThroughputCut")
JOB = "specdecode-sidecar"
GATE = {"acceptance_rate_window_size": 270, "acceptance_rate_threshold": 0.5}  # 20 iterations/s: 13.5 s
MEMORY = {"kv_cache_capacity_tokens": 30_000}
MODELS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # (spec-decode pod, control pod)
    "gated": ({"acceptance_rate": 0.3, **GATE}, {"drafts_per_second": 200 * 1.9}),
    "starved": ({"acceptance_rate": 0.75, "drafts_per_second": 600, "draft_memory_share": 0.5, **MEMORY},
                {"drafts_per_second": 600 * 3.25, **MEMORY}),  # the same tokens wanted
    "healthy": ({"acceptance_rate": 0.75, **GATE}, {"drafts_per_second": 200 * 3.25}),
}
FIRING_TIMEOUT_S = 180.0


def scenario(spec_decode: bool) -> dict[str, Any]:
    models = [{"name": name, "num_speculative_tokens": 3, "spec_decode": spec_decode,
               **(spec if spec_decode else control)} for name, (spec, control) in MODELS.items()]
    return {"name": "speculation-alerts" if spec_decode else "speculation-alerts-control", "models": models}


@dataclass
class Stack:
    prometheus: Prometheus
    processes: tuple[Process, ...]
    started: float

    def wait_firing(self, alertname: str, model: str) -> dict[str, Any]:
        def firing() -> dict[str, Any] | None:
            return next((a for a in self.prometheus.alerts(alertname, "firing")
                         if a["labels"].get("model_name") == model), None)
        return wait_until(firing, FIRING_TIMEOUT_S, f"{alertname} firing for {model}", self.processes)

    def ever(self, alertname: str) -> set[str]:
        """The models ``alertname`` was ever pending or firing for since the stack started."""
        rng = f"{int(time.time() - self.started) + 5}s"
        found = self.prometheus.query(f'count_over_time(ALERTS{{alertname="{alertname}"}}[{rng}])')
        return {r["metric"]["model_name"] for r in found}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = require_tool(prometheus_binary(), "prometheus (Debian package prometheus)")
    tmp: Path = tmp_path_factory.mktemp("speculation-alerts")
    settings = rules_settings()
    write_rules(tmp / "rules.yaml")
    with contextlib.ExitStack() as started:
        spec, control = start_spec_and_control(started, tmp, scenario)
        sidecar = start_sidecar(started, tmp, {
            "targets": [{"name": "vllm", "url": f"{spec.url}/metrics", "baseline": {"target": "control"}},
                        {"name": "control", "url": f"{control.url}/metrics", "spec_decode": False}],
            "collect": {"interval": "1s"},
            "windows": ",".join(sorted({settings.sidecar_alert_window, settings.long_window}, key=seconds)),
        })
        prom = start_prometheus(started, tmp, prometheus, [scrape_job(JOB, [sidecar], {"namespace": NAMESPACE})],
                                rules=tmp / "rules.yaml")
        yield Stack(prom, (spec, control, sidecar, prom.process), time.time())


def test_a_gate_that_stops_speculation_fires_for_that_engine_only(stack: Stack) -> None:
    alert = stack.wait_firing(STOPPED, "gated")
    assert alert["labels"]["target"] == "vllm" and alert["labels"]["engine"] == "0"
    assert float(alert["value"]) == 0.0  # the share: nothing from speculative steps
    description = alert["annotations"]["description"]
    # The rate is Prometheus' over a 1m window of a simulator on a shared machine: about 200, not exactly.
    generated = re.search(r"generated (\d+) tokens/s, of which speculative steps produced 0%", description)
    assert generated is not None, description
    assert abs(int(generated.group(1)) - 200) <= 20, description
    assert stack.ever(STOPPED) == {"gated"}


def test_a_draft_model_that_starves_the_kv_cache_fires_the_capacity_alerts(stack: Stack) -> None:
    preempting = stack.wait_firing(PREEMPTIONS, "starved")
    assert 0.2 < float(preempting["value"]) < 0.4  # the simulator's truth: 0.29 more per request
    cut = stack.wait_firing(THROUGHPUT, "starved")
    assert 0.7 < float(cut["value"]) < 0.85  # the truth: 23 of 30 requests run, 0.77 of the control's tokens
    assert stack.ever(PREEMPTIONS) == {"starved"} and stack.ever(THROUGHPUT) == {"starved"}
