"""Smoke test of bench/tap.py: its processes start, talk, and report what it claims to measure. Never timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import tap as bench

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_direct_and_through_the_tap() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tap.py"), "--streams", "4", "--seconds", "0.6", "--quiet-wait", "0",
         "--variants", "tap-uvloop,raw-relay-uvloop"],
        capture_output=True, text=True, timeout=60, check=True, cwd=ROOT,
    )  # fmt: skip
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [row["variant"] for row in rows] == ["direct", "tap-uvloop", "raw-relay-uvloop"]
    for row in rows:
        assert row["errors"] == 0 and row["requests"] >= 4
        # Every stream is whole: 100 events, the tap's stripped usage event not among them.
        assert row["events"] == row["requests"] * bench.EVENTS_PER_STREAM + row["requests"]  # + [DONE]
    assert rows[1]["cpu_per_chunk"] > 0
    assert "| 4 | tap-uvloop |" in result.stdout


def test_medians_over_rounds() -> None:
    rows = [
        {"streams": 4, "variant": "direct", "requests": 2, "events": 10, "stalls": 0, "errors": 0, "ttfb_p50": x}
        for x in (0.3, 0.1, 0.2)
    ]
    (merged,) = bench._medians(rows)
    assert merged["requests"] == 6 and merged["ttfb_p50"] == 0.2
