"""The fleet bench as `make bench` runs it (bench/run.py, section 8): at its smoke size the real sidecar's page and
vLLM's go through a real Prometheus, the table comes out with figures that follow the fleet (series grow with pods,
every target up, every rule group evaluated without failures, the rules produce samples from the sidecar's page),
and only its own section of the results is rewritten. Correctness only: no timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench import fleet
from devtools.procs import in_ci, prometheus_binary

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## 8. Fleet"


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def test_the_page_moves_its_counters_and_keeps_its_gauges() -> None:
    page = fleet.MovingPage.parse(fleet.VLLM_PAGE.read_text(encoding="utf-8"))
    start, later = _samples(page.render(0, 3)), _samples(page.render(fleet.RAMP_S, 3))
    assert len(start) == page.samples and start.keys() == later.keys()
    kinds = {f.name: f.type for f in text_string_to_metric_families(fleet.VLLM_PAGE.read_text(encoding="utf-8"))}
    moved = {name for (name, labels), value in start.items() if later[(name, labels)] != value}
    assert any(name.endswith("_bucket") for name in moved) and any(name.endswith("_total") for name in moved)
    for (name, labels), value in start.items():
        family = fleet._family(name)
        if kinds.get(family, kinds.get(name)) == "gauge":
            assert later[(name, labels)] == value, name  # a gauge stays
        elif name in moved:
            assert later[(name, labels)] == pytest.approx(2 * value), name  # doubled after RAMP_S: ratios stay
    # the pod's model: every model_name rewritten, nothing else
    assert {dict(labels).get("model_name") for _, labels in start} - {None} == {
        page.model_label.removeprefix('model_name="').removesuffix('"') + "-3"}


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
    assert sorted(rows) == sorted((page, pods) for page in (fleet.SIDECAR, fleet.VLLM) for pods in fleet.SMOKE.pods)
    groups = fleet.rule_groups_in_file()
    for (_page, pods), row in rows.items():
        assert int(row["targets up"]) == pods, row
        assert row["groups evaluated"] == f"{groups}/{groups}" and row["rule failures"] == "0", row
        # Prometheus holds each pod's series plus its own few per target and the rules' outputs.
        assert int(row["head series"]) >= pods * int(row["series per pod (scraped)"]) > 0, row
    for page in (fleet.SIDECAR, fleet.VLLM):
        small, large = (int(rows[(page, pods)]["head series"]) for pods in fleet.SMOKE.pods)
        assert large > small, page  # series grow with pods
    # The sidecar exports more than nothing and less than a runaway, and its counters move: the rules record values.
    assert int(rows[(fleet.SIDECAR, fleet.SMOKE.pods[-1])]["rule samples"]) > 0
    assert re.search(r"\| head series \| \d+ \| \d+ \| \*\*\d+\.\d\d×\*\* \|", text)
    assert "every target up" in text
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
