"""The request-tap bench as `make bench` runs it (bench/run.py, section 6): it runs end to end in its smoke size,
reports every figure against a baseline measured in the same run, and rewrites only its own section of the results.
Correctness only: no timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import run as bench_run
from bench import tap as tap_bench

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## 6. Request tap"


def _row(streams: int, variant: str, ttfb_p99: float, cpu_per_chunk: float) -> dict[str, Any]:
    return {"variant": variant, "streams": streams, "requests": 10, "events": 1010, "stalls": 0, "errors": 0,
            "ttfb_p50": ttfb_p99 / 2, "ttfb_p99": ttfb_p99, "ttfb_first_p50": ttfb_p99,
            "cpu_per_chunk": cpu_per_chunk, "cpu_share": 0.1, "background_cores": 0.0, "proxy_rss_peak_mb": 50.0}


def _table_rows(text: str) -> dict[str, list[str]]:
    section = text[text.index(SECTION):]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| 4 |")]
    return {cells[1].strip(): [c.strip() for c in cells] for cells in rows}


def test_run_py_measures_the_tap_and_keeps_the_other_sections(tmp_path: Path) -> None:
    output = tmp_path / "results.md"
    previous = (ROOT / "bench" / "results.md").read_text(encoding="utf-8")
    output.write_text(previous, encoding="utf-8")
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--only", "tap", "--smoke", "--output",
                             str(output)], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    text = output.read_text(encoding="utf-8")
    rows = _table_rows(text)
    assert list(rows) == [tap_bench.BASELINE, "tap-uvloop", tap_bench.FLOOR, tap_bench.CHECKED, tap_bench.ROUTING]
    for cells in rows.values():
        requests, chunks, stalls, errors = int(cells[2]), int(cells[3]), cells[-3], cells[-2]
        assert requests >= 4 and errors == "0", cells
        # Whole streams came back through every relay: 100 events each plus [DONE], the tap's usage event removed.
        assert chunks == requests * (tap_bench.EVENTS_PER_STREAM + 1), cells
        assert stalls.isdigit()
    # Ratios against the same run's baselines: the floor against itself is 1, direct has none.
    assert rows[tap_bench.FLOOR][9] == "**1.00×**"
    assert rows[tap_bench.BASELINE][7] == rows[tap_bench.BASELINE][9] == "—"
    assert rows["tap-uvloop"][9].startswith("**") and rows["tap-uvloop"][9].endswith("×**")
    # Routing on, against the tap without it in the same run.
    assert re.search(r"Routing on \(tap-routing-uvloop, 4 streams\): [\d.]+ µs a chunk against [\d.]+ µs for the tap "
                     r"without routing in the same run: \*\*\d+\.\d\d×\*\*", text)
    # The tap against the floor with the tap's own per-chunk check, in the same run.
    assert re.search(r"The tap against the checked relay \(checked-relay-uvloop: .*; 4 streams\): [\d.]+ µs a chunk "
                     r"against [\d.]+ µs for checked-relay-uvloop in the same run: \*\*\d+\.\d\d×\*\*", text)
    # Every other section (1-5, and the page's 7) is kept as it was, byte for byte, and said to be from its run.
    others = sorted(int(n) for n in re.findall(r"\n## (\d+)\. ", previous) if int(n) != 6)
    assert others[:5] == [1, 2, 3, 4, 5], others
    for number in others:
        assert _section(text, number) == _section(previous, number), number
    # each kept section is said to be from the run that measured it (results.md may hold several runs)
    notes = re.findall(r"Not measured in this run, kept from an earlier one: sections? ([\d, ]+) \(", text)
    assert sorted(int(n) for note in notes for n in note.split(", ")) == others


def _section(text: str, number: int) -> str:
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end >= 0 else len(text)]
    return "\n".join(line for line in body.splitlines() if not line.startswith("_Total bench time")).strip()


def test_ratios_are_against_the_baselines_of_the_same_streams() -> None:
    rows = [_row(64, "direct", 0.001, 0.0), _row(64, "tap-uvloop", 0.002, 30e-6),
            _row(64, tap_bench.FLOOR, 0.0015, 20e-6),
            _row(256, "direct", 0.004, 0.0), _row(256, "tap-uvloop", 0.010, 15e-6)]
    by_key = {(r["streams"], r["variant"]): r for r in tap_bench.with_ratios(rows)}
    tap64, tap256 = by_key[(64, "tap-uvloop")], by_key[(256, "tap-uvloop")]
    assert tap64["ttfb_p99_vs_direct"] == pytest.approx(2.0) and tap64["added_p99"] == pytest.approx(0.001)
    assert tap64["cpu_vs_floor"] == pytest.approx(1.5)
    assert tap256["ttfb_p99_vs_direct"] == pytest.approx(2.5)
    assert tap256["cpu_vs_floor"] is None, "no raw relay ran at 256 streams: no ratio made up from another run"
    assert by_key[(64, "direct")]["cpu_vs_floor"] is None and by_key[(64, "direct")]["added_p99"] is None


def test_ratios_take_medians_over_rounds_first() -> None:
    rows = [_row(4, "direct", t, 0.0) for t in (0.001, 0.003, 0.002)]
    rows += [_row(4, "tap-uvloop", t, c) for t, c in ((0.004, 10e-6), (0.002, 30e-6), (0.009, 20e-6))]
    (direct, tap) = tap_bench.with_ratios(rows)
    assert direct["requests"] == 30 and tap["ttfb_p99"] == pytest.approx(0.004)
    assert tap["ttfb_p99_vs_direct"] == pytest.approx(2.0)


def test_merge_replaces_only_the_sections_run() -> None:
    previous = "# t\n\nold date UTC · x\n\n## 1. One\n\nold one\n\n## 6. Tap\n\nold tap\n\n_Total bench time 9 s._\n"
    fresh = ["# t\n", "new date UTC · y", "\n## 6. Tap\n", "new tap", "\n_Total bench time 1 s._"]
    merged = "\n".join(bench_run.merge_sections(previous, fresh))
    assert "old one" in merged and "new tap" in merged and "old tap" not in merged
    assert merged.index("## 1. One") < merged.index("## 6. Tap")
    assert "Not measured in this run, kept from an earlier one: section 1 (old date UTC · x)." in merged
    assert merged.count("_Total bench time") == 1 and "_Total bench time 1 s._" in merged
    assert "\n\n\n" not in merged
    # Measured again later on its own, the kept section still says when it was measured, not when it was kept.
    later = "\n".join(bench_run.merge_sections(merged, ["# t\n", "later date UTC · z", "\n## 6. Tap\n", "newer tap"]))
    assert "Not measured in this run, kept from an earlier one: section 1 (old date UTC · x)." in later
    assert "later date UTC · z" in later and "newer tap" in later


def test_smoke_is_refused_for_sections_without_a_smoke_size() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--only", "collect", "--smoke"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 2 and "--smoke" in result.stderr


def test_round_ranges_pair_each_round_with_its_own_baselines() -> None:
    rows = []
    for index, (direct_p99, floor_cpu, tap_cpu) in enumerate(((0.001, 10e-6, 12e-6), (0.004, 20e-6, 30e-6))):
        for row in (_row(64, "direct", direct_p99, 0.0), _row(64, tap_bench.FLOOR, 0.002, floor_cpu),
                    _row(64, "tap-uvloop", 0.004, tap_cpu)):
            rows.append({**row, "round": index})
    spans = tap_bench.round_ranges(rows)
    low, high = spans[(64, "tap-uvloop")]["cpu_vs_floor"]
    assert (low, high) == (pytest.approx(1.2), pytest.approx(1.5))  # 12/10 and 30/20, never 12/20 or 30/10
    assert spans[(64, "tap-uvloop")]["ttfb_p99_vs_direct"] == (pytest.approx(1.0), pytest.approx(4.0))
    assert (64, "direct") not in spans


def test_the_tap_is_set_against_the_checked_relay_of_the_same_streams() -> None:
    rows = [_row(64, tap_bench.CHECKED, 0.002, 20e-6), _row(64, "tap-uvloop", 0.003, 30e-6),
            _row(256, "tap-uvloop", 0.010, 15e-6)]
    (line,) = tap_bench.floor_lines(rows)  # no checked relay ran at 256 streams: no line made up for it
    assert "64 streams" in line and "30.0 µs a chunk against 20.0 µs" in line and "**1.50×**" in line
    assert "TTFB p99 +1.00 ms" in line
