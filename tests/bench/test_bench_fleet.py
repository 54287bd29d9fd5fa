"""The fleet bench as `make bench` runs it (bench/run.py, section 8): at its smoke size the real sidecar's page and
vLLM's go through a real Prometheus, the table comes out with figures that follow the fleet (series grow with pods,
every target up, every rule group evaluated without failures, the rules produce samples from the sidecar's page),
the steady-state part's backfilled history fills the rules' longest window, and only its own section of the results
is rewritten. Correctness only: no timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import fleet, fleet_common, fleet_steady, stage_floor
from devtools.procs import in_ci, prometheus_binary
from specdecode_exporter.monitoring import stage

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## 8. Fleet"


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def test_the_page_moves_its_counters_and_keeps_its_gauges() -> None:
    page = fleet_common.MovingPage.parse(fleet_common.VLLM_PAGE.read_text(encoding="utf-8"))
    start, later = _samples(page.render(0, 3)), _samples(page.render(fleet_common.RAMP_S, 3))
    assert len(start) == page.samples and start.keys() == later.keys()
    kinds = {f.name: f.type for f in text_string_to_metric_families(fleet_common.VLLM_PAGE.read_text(encoding="utf-8"))}
    moved = {name for (name, labels), value in start.items() if later[(name, labels)] != value}
    assert any(name.endswith("_bucket") for name in moved) and any(name.endswith("_total") for name in moved)
    for (name, labels), value in start.items():
        family = fleet_common.family(name)
        if kinds.get(family, kinds.get(name)) == "gauge":
            assert later[(name, labels)] == value, name  # a gauge stays
        elif name in moved:
            assert later[(name, labels)] == pytest.approx(2 * value), name  # doubled after RAMP_S: ratios stay
    # the pod's model: every model_name rewritten, nothing else
    assert {dict(labels).get("model_name") for _, labels in start} - {None} == {
        page.model_label.removeprefix('model_name="').removesuffix('"') + "-3"}


def test_the_backfilled_history_is_what_the_pod_server_serves_at_that_second() -> None:
    """The history continues the live series: the same values at the same second, the labels Prometheus gives
    the live scrape (job, namespace, pod, instance), only the series the rules read."""
    page = fleet_common.MovingPage.parse((ROOT / "tests" / "fixtures" / "captured_vllm_cpu_0.32.0_ngram.prom")
                                         .read_text(encoding="utf-8"))
    names = frozenset(sorted(fleet_steady.sample_names(page))[::3])  # a third of the page, whatever it holds
    history = fleet_steady.History(page, names, fleet_common.JOBS[fleet_common.VLLM], pods=13, origin=1_000_000,
                                   step_s=15)
    second = 1_000_000 + 20 * 15
    pod_labels = {"job": fleet_common.JOBS[fleet_common.VLLM], **fleet_common.pod_labels(7)}
    lines = history.block(second, 7 % fleet_common.MODELS).replace(fleet_steady.POD_SLOT, history.pod_labels()[7])
    backfilled = _samples((lines + "# EOF\n").encode().replace(f" {second}\n".encode(), b"\n"))
    live = {(name, tuple(sorted({**dict(labels), **pod_labels}.items()))): value
            for (name, labels), value in _samples(page.render(second - history.origin, 7 % fleet_common.MODELS)).items()
            if name in names}
    assert backfilled == live and len(live) > 0
    assert all(f" {second}\n" in line + "\n" for line in lines.splitlines())


def test_the_rules_read_no_range_of_the_sidecars_series_and_nothing_of_vllms_page() -> None:
    """Two stages: the rules read the pods' series a step back, never over a range; their two hours are the stage's
    records' (what the steady bench backfills, and proves full)."""
    rules = fleet_common.shipped_rules_yaml()
    vllm = fleet_steady.rule_reads(rules, fleet_steady.sample_names(fleet_common.MovingPage.parse(
        fleet_common.VLLM_PAGE.read_text(encoding="utf-8"))))
    assert vllm.names == frozenset() and vllm.longest_s == 0
    sidecar_names = frozenset({"specdecode_draft_tokens_total", "specdecode_accepted_tokens_total", "process_cpu"})
    sidecar = fleet_steady.rule_reads(rules, sidecar_names)
    assert sidecar.names == sidecar_names - {"process_cpu"}
    assert sidecar.longest_s == 0 and sidecar.longest_selector == ""
    assert sidecar.proof_s > 7000 and ":stage_" in sidecar.proof_selector  # [1h59m44s999ms]: a stage record's
    assert any("[1d] offset 1h" in r for r in sidecar.record_ranges)  # the baseline's range over its own records
    assert fleet_common.duration_s("1h30m") == 5400


def test_the_floor_bench_reads_every_stage_rule_once_and_twice() -> None:
    """bench.stage_floor times every shipped stage rule beside its raw reads: each counter's rule as shipped, its series
    now and a step ago summed as it sums them; a gauge's rule reads once as shipped. A stage rule of another form is
    refused, not timed as something else."""
    rules_yaml = fleet_common.shipped_rules_yaml()
    rules = stage_floor.stage_rules(rules_yaml)
    shipped = [r for g in yaml.safe_load(rules_yaml)["groups"] if g["name"].startswith("specdecode.rules.stage.")
               for r in g["rules"] if r["record"] != stage.CLOCK]
    assert [r.record for r in rules] == [r["record"] for r in shipped]
    assert {r.group for r in rules} == set(stage.STAGE_GROUPS)
    band = next(r for r in rules if r.record == "model_band:specdecode_requests:stage_increase")
    assert band.selector == "specdecode_requests_total"
    assert band.now == "sum by (namespace, model_name, workload, temperature) (specdecode_requests_total)"
    assert band.before == ("sum by (namespace, model_name, workload, temperature) "
                           "(specdecode_requests_total offset 1m)")
    page = next(r for r in rules if r.record == "model:specdecode_draft_tokens:stage_increase")
    assert page.before is not None and page.before.endswith("offset 15s)")  # the evidence's own step
    gauges = [r for r in rules if r.before is None]
    assert gauges and all(r.now == r.shipped and r.record.endswith(("stage_avg", "stage_count")) for r in gauges)
    with pytest.raises(ValueError, match="not a stage rule"):
        stage_floor.stage_rules(yaml.safe_dump({"groups": [{"name": "specdecode.rules.stage.page", "rules": [
            {"record": "model:x:stage_increase", "expr": "sum(rate(x_total[5m]))"}]}]}))


def _rows(text: str) -> list[list[str]]:
    section = text[text.index(SECTION):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if re.match(r"\| (sidecar|vllm) \| \d+ \|", line)]


def _section(text: str, number: int) -> str:
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end >= 0 else len(text)]
    return "\n".join(line for line in body.splitlines() if not line.startswith("_Total bench time")).strip()


@pytest.mark.timeout(900)
def test_run_py_measures_the_fleet_and_keeps_the_other_sections(tmp_path: Path) -> None:
    if prometheus_binary() is None:
        if in_ci():
            pytest.fail("prometheus not found: run scripts/install-tools.sh")
        pytest.skip("prometheus not found")
    output = tmp_path / "results.md"
    previous = (ROOT / "bench" / "results.md").read_text(encoding="utf-8")
    output.write_text(previous, encoding="utf-8")
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--only", "fleet", "--smoke", "--output",
                             str(output)], capture_output=True, text=True, timeout=840, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text(encoding="utf-8")
    header = fleet.TABLE_HEADER
    rows = {(cells[0], int(cells[1])): dict(zip(header, cells, strict=True)) for cells in _rows(text)}
    assert sorted(rows) == sorted((page, pods) for page in (fleet_common.SIDECAR, fleet_common.VLLM)
                                  for pods in fleet.SMOKE.pods)
    groups = fleet_common.rule_groups_in_file()
    for (_page, pods), row in rows.items():
        assert int(row["targets up"]) == pods, row
        assert row["groups evaluated"] == f"{groups}/{groups}" and row["rule failures"] == "0", row
        # Prometheus holds each pod's series plus its own few per target and the rules' outputs.
        assert int(row["head series"]) >= pods * int(row["series per pod (scraped)"]) > 0, row
    for page in (fleet_common.SIDECAR, fleet_common.VLLM):
        small, large = (int(rows[(page, pods)]["head series"]) for pods in fleet.SMOKE.pods)
        assert large > small, page  # series grow with pods
    # The sidecar exports more than nothing and less than a runaway, and its counters move: the rules record values.
    assert int(rows[(fleet_common.SIDECAR, fleet.SMOKE.pods[-1])]["rule samples"]) > 0
    assert re.search(r"\| head series \| \d+ \| \d+ \| \*\*\d+\.\d\d×\*\* \|", text)
    assert "every target up" in text
    _assert_steady_rows(text)
    _assert_floor_rows(text)
    # Every other section is kept as it was, byte for byte, and said to be from its run.
    others = sorted(int(n) for n in re.findall(r"\n## (\d+)\. ", previous) if int(n) != 8)
    for number in others:
        assert _section(text, number) == _section(previous, number), number
    notes = re.findall(r"Not measured in this run, kept from an earlier one: sections? ([\d, ]+) \(", text)
    assert sorted(int(n) for note in notes for n in note.split(", ")) == others


def test_python_m_bench_fleet_refuses_an_unknown_size() -> None:
    result = subprocess.run([sys.executable, "-m", "bench.fleet", "--size", "huge"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 2 and "--size" in result.stderr


def _assert_floor_rows(text: str) -> None:
    """The floor's table: one row per stage group and the total, every stage rule counted, each group reading the
    pods' series (the sidecar's page has every family the stage reads)."""
    floor = text[text.index("### The stage's floor"):]
    floor = floor[:floor.find("\n## ")] if "\n## " in floor else floor
    rows = {cells[0]: dict(zip(stage_floor.TABLE_HEADER, cells, strict=True))
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in floor.splitlines()
                          if line.startswith("| ") and not line.startswith("| stage group"))}
    groups = set(stage.STAGE_GROUPS)
    assert set(rows) == groups | {f"**all {len(groups)}**"}, rows
    total = rows[f"**all {len(groups)}**"]
    assert int(total["rules"]) == len(stage_floor.stage_rules(fleet_common.shipped_rules_yaml()))
    assert int(total["rules"]) == sum(int(rows[g]["rules"]) for g in groups)
    for group in groups:
        assert int(rows[group]["raw series read"]) > 0, rows[group]
        assert all(float(rows[group][k]) >= 0 for k in ("shipped (ms)", "read twice (ms)", "read once (ms)"))
    assert "No stage that reads every raw series once a step can cost less" in floor


def _assert_steady_rows(text: str) -> None:
    """The steady-state rows: every target up and every group evaluated without failure on both pages, and the
    sidecar's longest window full (without the backfill it would hold the few samples of a minute's run)."""
    rows = {cells[1]: dict(zip(fleet_steady.STEADY_HEADER, cells, strict=True))
            for cells in ([c.strip() for c in line.strip("|").split("|")]
                          for line in text.splitlines() if re.match(r"\| \d+ \| (sidecar|vllm) \|", line))}
    assert sorted(rows) == sorted((fleet_common.SIDECAR, fleet_common.VLLM)), rows
    groups = fleet_common.rule_groups_in_file()
    for row in rows.values():
        assert int(row["pods"]) == int(row["targets up"]) == fleet_steady.STEADY_SMOKE.pods[-1], row
        assert row["groups evaluated"] == f"{groups}/{groups}" and row["rule failures"] == "0", row
        # The live heap (Go's heap goal halved) is a GC's figure: never above the heap in use plus what one cycle adds.
        assert 0 < float(row["live heap after GC (MB)"]) <= 2 * float(row["heap in use (MB)"]), row
        # Retained after a forced GC: a heap, and one no larger than the process' memory.
        assert 0 < float(row["retained after a forced GC (MB)"]) < float(row["RSS (MB)"]), row
    longest = rows[fleet_common.SIDECAR]["longest window: samples per series (fewest / full)"]
    fewest, full = map(int, longest.split(" / "))
    # The longest window is a stage record's (2 h less one step, at the stage's 15 s), the raw series read a step back.
    assert full == int((2 * 3600 - 15 - 0.001) // 15) and fewest >= 0.95 * full, rows[fleet_common.SIDECAR]
    assert int(rows[fleet_common.SIDECAR]["history backfilled (samples)"]) > 0
    assert 0 < int(rows[fleet_common.VLLM]["history backfilled (samples)"]) < 1000  # the stage's clock alone
    alone = {cells[1]: dict(zip(fleet_steady.STEADY_HEADER, cells, strict=True))
             for cells in ([c.strip() for c in line.strip("|").split("|")]
                           for line in text.splitlines() if re.match(r"\| \d+ \| (sidecar|vllm), no rules \|", line))}
    # Each page scraped alone too: nothing backfilled, no group loaded, every target up.
    pages = (fleet_common.SIDECAR, fleet_common.VLLM)
    assert sorted(alone) == sorted(f"{page}{fleet_steady.NO_RULES}" for page in pages), alone
    for row in alone.values():
        assert row["history backfilled (samples)"] == "0" and row["groups evaluated"] == f"0/{groups}", row
        assert int(row["targets up"]) == fleet_steady.STEADY_SMOKE.pods[-1], row
    own_cpu = r"The rules' own CPU \(the sidecar's page with them, less without\): \*\*-?\d+\.\d{3} cores, "
    assert re.search(own_cpu, text)
    assert re.search(r"The groups. evaluation times summed: \*\*\d+\.\d\d s per round\*\*", text)
    assert "Extrapolated, not measured" in text and "cores" in text
