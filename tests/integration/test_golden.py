"""Golden file of the sidecar's own exposition (names, HELP, TYPE, labels, values), and promtool on it.

Regenerate after an intended change of the contract: UPDATE_GOLDEN=1 pytest tests/integration/test_golden.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from specdecode_exporter.simulator import ModelSpec, steady_scenario
from tests.helpers import FIXTURES, start_harness

GOLDEN = FIXTURES / "golden_metrics.prom"
VOLATILE = re.compile(r"^(specdecode_collect_duration_seconds\{[^}]*\}) .*$", re.MULTILINE)


def sidecar_exposition() -> str:
    spec = ModelSpec(engines=2, num_speculative_tokens=3, acceptance_rate=0.7, drafts_per_second=150)
    harness = start_harness(steady_scenario(spec), windows="1m,5m")
    try:
        for _ in range(13):
            harness.step(5.0)
        text = httpx.get(harness.sidecar_url + "/metrics", timeout=5).text
    finally:
        harness.stop()
    return text


def own_families(text: str) -> str:
    """Our families only (process/python collectors vary by machine), volatile values masked."""
    lines = [line for line in text.splitlines() if "specdecode_" in line and "build_info" not in line]
    return VOLATILE.sub(r"\1 <duration>", "\n".join(lines)) + "\n"


@pytest.fixture(scope="module")
def exposition() -> str:
    return sidecar_exposition()


def test_exposition_matches_the_golden_file(exposition: str) -> None:
    actual = own_families(exposition)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(actual)
    assert actual == GOLDEN.read_text(), "exposition changed; if intended, rerun with UPDATE_GOLDEN=1"


def test_promtool_check_metrics_is_clean(exposition: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing: run scripts/install-tools.sh")
        pytest.skip("promtool not installed (scripts/install-tools.sh)")
    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def test_golden_file_covers_every_contract_family() -> None:
    from specdecode_exporter.core.contract.metrics import CONTRACT, RELOAD, ROUTE

    golden = GOLDEN.read_text()
    for spec in CONTRACT:
        if spec.name == "specdecode_exporter_build_info" or spec in RELOAD:  # only with a config file
            continue
        if spec in ROUTE:  # only with a routing tap (tests/integration/test_routing_sidecar.py)
            continue
        assert f"# TYPE {spec.exposed_name} {spec.type}" in golden, spec.name
        assert f"# HELP {spec.exposed_name} {spec.help}" in golden, spec.name
