"""A bounded atheris (libFuzzer) run in `make test`; `make fuzz` runs a long one. Skipped without atheris."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.target import FIXTURES

pytest.importorskip("atheris")
RUNS = int(os.environ.get("SPECDECODE_ATHERIS_RUNS", "500"))
SCRIPT = Path(__file__).with_name("atheris_parser.py")


def test_atheris_bounded_run(tmp_path: Path) -> None:
    for fixture in FIXTURES.glob("*.prom"):
        shutil.copy(fixture, tmp_path)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), f"-runs={RUNS}", "-max_len=65536", "-timeout=10", "-rss_limit_mb=2048",
         f"-artifact_prefix={tmp_path}/", str(tmp_path)],
        capture_output=True, text=True, timeout=max(120, RUNS // 20),
    )
    done = re.search(r"Done (\d+) runs", result.stderr)
    assert result.returncode == 0 and done, result.stderr[-3000:]
    sys.stderr.write(f"\natheris runs: {done.group(1)}\n")
    report = os.environ.get("SPECDECODE_FUZZ_REPORT")
    if report:
        with open(report, "a", encoding="utf-8") as out:
            out.write(f"atheris runs: {done.group(1)}\n")
