"""bench/paging.py measures the right thing: its traffic has the stated overdispersion, it applies `for:` and the
ALERTS hysteresis as Prometheus' rule manager does, and a small run through the real Prometheus agrees with
promtool. Correctness only; the figures are the bench's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench import paging
from devtools.procs import in_ci, prometheus_binary, promtool_binary

STAGE_GROUP = """groups:
  - name: specdecode.rules.stage.page
    interval: 15s
    rules:
      - record: specdecode:stage_clock_seconds
        expr: time()
"""


def test_requests_are_overdispersed_as_stated() -> None:
    traffic = paging.Traffic()
    for alpha in (paging.LOW, paging.NEAR, paging.HEALTHY):
        pmf = paging.request_pmf(alpha, traffic)
        values = np.arange(pmf.size)
        mean = float(pmf @ values)
        sd = float(np.sqrt(pmf @ values**2 - mean**2))
        assert mean / traffic.tokens_per_request == pytest.approx(alpha, abs=1e-3)
        # A request's α scatters at least as much as its acceptance probability (sd 0.2), more for the draws inside
        # it, far more than 30 independent tokens would (sd ≈ 0.09).
        assert 0.2 < sd / traffic.tokens_per_request < 0.26


def test_firing_follows_the_rule_manager() -> None:
    step = 15.0
    proof = np.array([0, 15, 30, 90, 105]) + 1000.0
    holds = np.array([45, 60, 75, 120, 135]) + 1000.0
    # for: 0: fires with the proof, held while it fired at the evaluation before (45 … 75), then proof again; 120
    # holds only because 105 fired.
    assert paging.firing_runs(proof, holds, step, 0.0) == [(1000.0, 1135.0)]
    # Without the hold the same proof fires twice; for: 30s needs three evaluations in a row.
    assert paging.firing_runs(proof, np.zeros(0), step, 0.0) == [(1000.0, 1030.0), (1090.0, 1105.0)]
    assert paging.firing_runs(proof, np.zeros(0), step, 30.0) == [(1030.0, 1030.0)]
    # A hold never starts a page.
    assert paging.firing_runs(np.zeros(0), holds, step, 0.0) == []
    # Alertmanager: a page again only after group_interval without firing.
    assert paging.pages([(0.0, 10.0), (200.0, 300.0), (700.0, 800.0)], 300.0).tolist() == [0.0, 700.0]


@pytest.mark.timeout(600)
def test_a_small_run_pages_on_drops_and_agrees_with_promtool() -> None:
    if promtool_binary() is None or prometheus_binary() is None:
        if in_ci():
            pytest.fail("promtool/prometheus not found: run scripts/install-tools.sh")
        pytest.skip("promtool/prometheus not found")
    result = paging.run(paging.Size(month_days=1.0, drop_days=1.0), log=lambda line: None)
    assert result.cross.evaluations > 0 and result.cross.agree == result.cross.evaluations, result.cross.disagree
    assert result.cross.firing > 0
    for rate in (10.0, 100.0, 1000.0):
        drops = result.outcomes[f"drops-{rate:g}"]
        assert drops.delays.size >= 5 and np.isfinite(drops.delays).all(), rate
        assert drops.false_pages == 0
    # The old page needs its 5m window to cross and then 10 minutes more.
    assert result.before["drops-1000"].delay(50) > 600 > result.outcomes["drops-1000"].delay(50)
    assert np.isinf(result.before["drops-1"].delays).all()  # its traffic guard: never at 1 drafted token/s
    rows = list(paging.table_rows(result))
    assert [row[0] for row in rows] == [f"{r:g}" for r in paging.RATES] + ["10, then a 2 min pause"]


def _record_times(promtool: str, blocks: Path) -> list[int]:
    (blocks / "wal").mkdir(exist_ok=True)  # older promtools open a WAL to dump
    dump = subprocess.run([promtool, "tsdb", "dump", str(blocks)], capture_output=True, text=True, timeout=60,
                          check=True).stdout
    return sorted(int(line.split()[-1]) for line in dump.splitlines() if line.startswith("{"))


@pytest.mark.timeout(120)
def test_the_records_phase_does_not_follow_the_rule_files_directory(tmp_path: Path) -> None:
    """The same rule group in two directories gives records at the same times (promtool hashes the file's path
    into each group's offset; the bench's work directory is a fresh temporary one every run)."""
    promtool, prometheus = promtool_binary(), prometheus_binary()
    if promtool is None or prometheus is None:
        if in_ci():
            pytest.fail("promtool/prometheus not found: run scripts/install-tools.sh")
        pytest.skip("promtool/prometheus not found")
    samples = tmp_path / "in.om"
    samples.write_text(f"# TYPE x counter\nx_total 1 {paging.T0}\nx_total 2 {paging.T0 + 300}\n# EOF\n")
    paging.backfill(promtool, samples, tmp_path / "data")
    proc = paging.start_prometheus(prometheus, tmp_path, tmp_path / "data")
    times = []
    try:
        for directory in (tmp_path / "one", tmp_path / "two" / "deeper"):
            directory.mkdir(parents=True)
            (directory / "stage.rules.yaml").write_text(STAGE_GROUP)
            paging.rule_blocks(promtool, proc.url, directory / "stage.rules.yaml", paging.T0, paging.T0 + 120,
                               directory / "blocks")
            times.append(_record_times(promtool, directory / "blocks"))
    finally:
        proc.stop()
    assert len(times[0]) >= 7 and times[0] == times[1]
    assert set(np.diff(times[0]).tolist()) == {15_000}  # one record per 15 s interval
