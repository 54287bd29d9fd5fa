"""One monitoring config feeds the rules, the dashboard, the deploy manifests and the sidecar's own verdict: a
change of one threshold and one verdict band reaches all of them, and the sidecar's verdict and the dashboard's
verdict query (evaluated by the real Prometheus engine in promtool) agree on a grid of α, k and costs."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.contract.verdict import Evidence, Verdict, judge
from specdecode_exporter.monitoring import build, stage
from specdecode_exporter.monitoring.rules import RULE_FILES
from specdecode_exporter.pipeline.capacity import CapacityStats, against_control
from specdecode_exporter.pipeline.derive import CostModel, counts_stats
from specdecode_exporter.sidecar.config import load_config_file
from tests.grafana.grafana_dashboard_helpers import all_selection, content_panels, substitute
from tests.helpers import require_tool, start_harness

ROOT = Path(__file__).resolve().parents[2]
USER_CONFIG = {"thresholds": {"page_acceptance_ratio": 0.6}, "verdict": {"paying_off_from": 1.25}}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every artefact, built into an empty directory from a user's file that changes one threshold and one band
    (what a user does: `build --config mine.yaml --root out/`)."""
    root = tmp_path_factory.mktemp("out")
    user = tmp_path_factory.mktemp("user") / "my-monitoring.yaml"
    user.write_text(yaml.safe_dump(USER_CONFIG))
    assert build.main(["--config", str(user), "--root", str(root), "--mixin", str(ROOT / "mixin")]) == 0
    for own in ("README.md", "docs/metrics.md"):
        assert not (root / own).exists(), f"the project's {own} is not an artefact of the user's build"
    assert (root / "mixin/mixin.libsonnet").exists() and (root / "deploy/sidecar/generated/pod-patch.yaml").exists()
    return root


def _alert(groups: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for g in groups["groups"] for r in g["rules"] if r.get("alert") == name)


def _record(groups: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for g in groups["groups"] for r in g["rules"] if r.get("record") == name)


def test_the_change_reaches_the_rules_and_the_prometheus_rule(built: Path) -> None:
    files = [yaml.safe_load((built / "alerts" / name).read_text()) for name in RULE_FILES]
    rules = {"groups": [g for f in files for g in f["groups"]]}
    page = _alert(rules, "SpecDecodeAcceptanceRateLow")
    assert ") < 0.6\n" in page["expr"]
    proof = _record(rules, "model:specdecode_acceptance_ratio:proven_below_page_rate2m")["expr"]
    assert "model:specdecode_acceptance_ratio:rate2m < 0.6" in proof
    assert "(0.65 - model:specdecode_acceptance_ratio:rate2m)" in proof  # proof below threshold + margin
    assert "below 60%" in page["annotations"]["summary"]
    operator_rule = yaml.safe_load((built / "deploy/base/prometheusrule.yaml").read_text())
    assert operator_rule["spec"]["groups"] == rules["groups"]


def test_the_change_reaches_the_dashboard_and_its_configmap(built: Path) -> None:
    dashboard = json.loads((built / "grafana/dashboards/specdecode.json").read_text())
    verdict = next(p for p in content_panels(dashboard) if p["title"] == "Verdict")
    expr = verdict["targets"][0]["expr"]
    assert ">= bool 1.25)" in expr and ">= bool 0.6)" in expr and ">= bool 1)\n" in expr
    assert "from 1.25×" not in verdict["description"] and "below 1.25×" in verdict["description"]
    alpha = next(p for p in content_panels(dashboard) if p["title"] == "Acceptance rate α")
    assert [s["value"] for s in alpha["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 0.6, 0.6]
    assert not (built / "deploy/base/grafana-dashboard.yaml").exists()  # kustomize makes the ConfigMap from the JSON


def test_the_change_reaches_the_sidecars_verdict(built: Path, tmp_path: Path) -> None:
    """The in-cluster sidecar reads deploy/base/monitoring.yaml, which the same build wrote."""
    harness = start_harness(windows="1m,5m")  # the simulator's steady α = 0.75, k = 3: modelled 1.30×
    try:
        sidecar_config = tmp_path / "config.yaml"
        sidecar_config.write_text(yaml.safe_dump({
            "monitoring": {"config_file": str(built / "deploy/base/monitoring.yaml")},
            "targets": [{"name": "vllm", "url": harness.exporter.config.targets[0].url}],
        }))
        config = load_config_file(str(sidecar_config))
        assert config.verdict.page_acceptance_ratio == 0.6 and config.verdict.paying_off_from == 1.25
        harness.exporter.apply_config(config)
        for _ in range(13):
            harness.step(5.0)
        series = harness.status()["targets"][0]["series"][0]  # type: ignore[index]
        assert series["verdict"] == "paying off"  # 1.30 ≥ 1.25 and α 0.75 ≥ 0.6
        assert harness.status()["page_threshold"] == 0.6
        harness.simulator.set_override(acceptance_rate=0.58)  # S = (1 + 1.74) / 2.5 = 1.096
        for _ in range(62):
            harness.step(5.0)
        series = harness.status()["targets"][0]["series"][0]  # type: ignore[index]
        assert series["verdict"] == "marginal"
        assert series["verdict_reason"] == "modelled 1.10×, but α 0.58 is below the page threshold 0.6"
    finally:
        harness.stop()


# ------------------------------------------------------------------ the sidecar and the dashboard agree


ALPHAS = (0.2, 0.35, 0.45, 0.52, 0.58, 0.64, 0.75, 0.9)
KS = (1, 2, 3, 5)
COSTS = (CostModel(0.0, 0.1), CostModel(0.1, 0.4), CostModel(0.3, 0.5), CostModel(0.05, 0.2))
DRAFTS_PER_MINUTE = 600


# Observed (mean, P99) speedups for some grid points, as the pods' sidecars would export them: they decide the
# verdict over the model where they exist (including the tail-regression case).
OBSERVED = ((0.9, 0.8), (1.05, 1.0), (1.3, 0.9), (1.3, 1.2), (1.6, 1.1))


# Against control pods, per minute: (preemptions, finished requests, generated tokens, mean waiting) of the
# spec-decode pod and of the control pod; with an observed speedup that pays off, these decide the verdict.
Pod = tuple[float, float, float, float]
CAPACITY: tuple[tuple[Pod, Pod], ...] = (
    ((12.0, 60.0, 6000.0, 0.0), (0.6, 60.0, 6000.0, 0.0)),  # +0.19 preemptions per request: marginal
    ((1.2, 60.0, 6000.0, 0.0), (0.6, 60.0, 6000.0, 0.0)),  # +0.01: within the bound
    ((0.0, 60.0, 4200.0, 3.0), (0.0, 60.0, 6000.0, 0.0)),  # 0.7× the control's tokens/s, queued: marginal
    ((0.0, 60.0, 4200.0, 0.0), (0.0, 60.0, 6000.0, 0.0)),  # the same without a queue: not compared
    ((0.0, 60.0, 5700.0, 3.0), (0.0, 60.0, 6000.0, 0.0)),  # 0.95×: within the bound
)


def capacity_costs(spec: Pod, control: Pod) -> tuple[float | None, float | None]:
    """The sidecar's code path: window counts → CapacityStats → against_control."""
    def stats(pod: Pod) -> CapacityStats:
        preemptions, requests, generated, waiting = pod
        return CapacityStats(600.0, None, generated * 10, preemptions * 10, requests * 10, 0.5, waiting)

    bounds = monitoring_config.shipped().verdict.capacity
    versus = against_control(stats(spec), stats(control), "control", bounds.min_waiting_requests)
    return versus.preemptions_per_request_increase, versus.throughput_ratio


def sidecar_verdict(alpha: float, k: int, cost: CostModel, observed: tuple[float, float] | None = None,
                    capacity: tuple[Pod, Pod] | None = None) -> Verdict:
    """What the sidecar says for a window of these counts (its code path: counts → stats → judge)."""
    drafted = DRAFTS_PER_MINUTE * k * 10.0
    stats = counts_stats(600.0, drafted, drafted * alpha, DRAFTS_PER_MINUTE * 10.0, (), cost, k)
    assert stats is not None
    mean, p99 = observed if observed is not None else (None, None)
    costs = capacity_costs(*capacity) if capacity is not None else (None, None)
    evidence = Evidence(stats.acceptance_ratio, stats.expected_speedup, mean, None, p99, None, *costs)
    return judge(evidence, monitoring_config.shipped().verdict).verdict


def capacity_series(model: str, capacity: tuple[Pod, Pod]) -> list[dict[str, str]]:
    """Both pods' counters (marked spec_decode) and their waiting gauges with their info."""
    series = []
    for marked, (preemptions, requests, generated, waiting) in zip(("true", "false"), capacity, strict=True):
        pod = (f'namespace="grid", job="specdecode", pod="{marked}", instance="{marked}", engine="0", '
               f'model_name="{model}"')
        counted = f'{pod}, spec_decode="{marked}"'
        series += [
            {"series": f"specdecode_preemptions_total{{{counted}}}", "values": f"0+{preemptions!r}x10"},
            {"series": f"specdecode_request_time_per_output_token_seconds_count{{{counted}}}",
             "values": f"0+{requests!r}x10"},
            {"series": f"specdecode_generated_tokens_total{{{counted}}}", "values": f"0+{generated!r}x10"},
            {"series": f'specdecode_requests_waiting{{{pod}, window="5m"}}', "values": f"{waiting!r}x10"},
            {"series": f'specdecode_info{{{pod}, api="vllm-v1", num_speculative_tokens="3", '
                       f'method="{"eagle3" if marked == "true" else "off"}"}}', "values": "1x10"},
        ]
    return series


Point = tuple[float, int, CostModel, tuple[float, float] | None, tuple[Pod, Pod] | None]


def grid() -> list[Point]:
    points: list[Point] = [
        (alpha, k, cost, None, None) for alpha, k, cost in itertools.product(ALPHAS, KS, COSTS)
        if not _on_a_boundary(alpha, k, cost)]
    points += [(alpha, 3, CostModel(), observed, None) for alpha in (0.45, 0.6, 0.75) for observed in OBSERVED]
    points += [(0.75, 3, CostModel(), (1.3, 1.2), capacity) for capacity in CAPACITY]
    return points


def _on_a_boundary(alpha: float, k: int, cost: CostModel) -> bool:
    """Exactly on a band's edge both sides may round differently: such points are left out of the grid."""
    bands = monitoring_config.shipped().verdict
    speedup = (1 + k * alpha) / (1 + k * cost.per_draft_token)
    edges = ((speedup, bands.hurting_below), (speedup, bands.paying_off_from), (alpha, bands.page_acceptance_ratio))
    return any(abs(a - b) < 1e-9 for a, b in edges)


def test_sidecar_and_dashboard_verdicts_agree_on_a_grid(tmp_path: Path) -> None:
    promtool = require_tool(shutil.which("promtool"), "promtool (Debian package prometheus)")
    dashboard = json.loads((ROOT / "grafana/dashboards/specdecode.json").read_text())
    panel = next(p for p in content_panels(dashboard) if p["title"] == "Verdict")
    expr = substitute(panel["targets"][0]["expr"], all_selection(dashboard, "5m"))
    series: list[dict[str, str]] = []
    expected: list[dict[str, Any]] = []
    seen = set()
    for i, (alpha, k, cost, observed, capacity) in enumerate(grid()):
        labels = f'namespace="grid", job="specdecode", pod="p", instance="i", engine="0", model_name="g{i}"'
        series += capacity_series(f"g{i}", capacity) if capacity is not None else []
        per_minute = DRAFTS_PER_MINUTE * k
        series += [
            {"series": f"specdecode_drafts_total{{{labels}}}", "values": f"0+{DRAFTS_PER_MINUTE}x10"},
            {"series": f"specdecode_draft_tokens_total{{{labels}}}", "values": f"0+{per_minute}x10"},
            {"series": f"specdecode_accepted_tokens_total{{{labels}}}", "values": f"0+{per_minute * alpha!r}x10"},
            {"series": f'specdecode_break_even_acceptance_ratio{{{labels}, cost_basis="configured"}}',
             "values": f"{cost.per_draft_token!r}x10"},
        ]
        if observed is not None:
            for statistic, value in zip(("mean", "p99"), observed, strict=True):
                gauge = f'specdecode_observed_speedup{{{labels}, window="5m", statistic="{statistic}"}}'
                series.append({"series": gauge, "values": f"{value!r}x10"})
        verdict = sidecar_verdict(alpha, k, cost, observed, capacity)
        seen.add(verdict)
        expected.append({"labels": f'{{model_name="g{i}", namespace="grid"}}', "value": verdict.code})
    idle = 'namespace="grid", job="specdecode", pod="p", instance="i", engine="0", model_name="idle"'
    series += [{"series": f"specdecode_{name}_total{{{idle}}}", "values": "0x10"}
               for name in ("drafts", "draft_tokens", "accepted_tokens")]  # no traffic: no verdict at all
    assert seen == {Verdict.HURTING, Verdict.MARGINAL, Verdict.PAYING_OFF}, "the grid must cover every verdict"
    overruled = [p for p in grid() if p[3] is not None and sidecar_verdict(*p[:4]) != sidecar_verdict(*p[:3])]
    assert len(overruled) >= 5, "observed speedups must decide some verdicts against the model"
    costly = [p for p in grid() if p[4] is not None and sidecar_verdict(*p) != sidecar_verdict(*p[:4])]
    assert len(costly) == 2, "preemptions and a throughput cut must each make a paying-off speedup marginal"
    test_file = tmp_path / "verdict.test.yaml"
    # The dashboard reads the rules' short stage: its groups run beside the series (the verdict is made of ratios,
    # which the stage's steps give whatever interval promtool evaluates them at).
    stage_rules = tmp_path / "stage.rules.yaml"
    stage_rules.write_text(yaml.safe_dump({"groups": stage.stage_groups(monitoring_config.shipped())}))
    test_file.write_text(yaml.safe_dump({"rule_files": [str(stage_rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": expr, "eval_time": "10m", "exp_samples": expected}]}]}))
    proc = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(expected) > 100
