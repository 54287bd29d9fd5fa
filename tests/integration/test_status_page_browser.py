"""The status page as a person sees it: a real headless Chromium loads it from the sidecar over loopback, a
screenshot is taken, and the rendered page's text and charts are checked.

Chromium is Debian's package (scripts/install-tools.sh): skipped without it, failed in CI."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdecode_exporter.sidecar.config import BaselineConfig
from specdecode_exporter.simulator import ModelSpec, steady_scenario
from tests.helpers import Harness, harness_fixture, require_tool, start_harness

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium() -> str:
    return require_tool(shutil.which("chromium") or shutil.which("chromium-browser"), "chromium (Debian package)")


def browse(url: str, tmp: Path, *action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}",
                           "--window-size=1400,700", *action, url],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def harness() -> Iterator[Harness]:
    """Ten minutes of a model at α 0.75, then ten at 0.40, against a measured baseline of 24 ms per token."""
    h = start_harness(steady_scenario(ModelSpec(acceptance_rate=0.75)), windows="1m,5m")
    target = dataclasses.replace(h.exporter.config.targets[0],
                                 baseline=BaselineConfig(time_per_output_token_seconds=0.024, p50=0.025, p99=0.03))
    h.exporter.apply_config(dataclasses.replace(h.exporter.config, targets=(target,)))
    for step in range(240):
        if step == 120:
            h.simulator.set_override(acceptance_rate=0.40)
        h.step(5.0)
    yield from harness_fixture(h)


def test_the_page_in_a_real_browser(harness: Harness, tmp_path: Path) -> None:
    shot = tmp_path / "status.png"
    taken = browse(harness.sidecar_url + "/", tmp_path, f"--screenshot={shot}")
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000, "a blank or broken screenshot"

    dom = browse(harness.sidecar_url + "/", tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    text = re.sub(r"<[^>]+>", " ", page)
    for words in ("α, last hour", "time per output token (ms)", "observed speedup (×)", "meta-llama/Llama-3.1-8B"):
        assert words in text, words
    # Three charts, each with a line of the last ten minutes (one point per 30 s).
    assert page.count("<svg") == 3
    lines = re.findall(r'<polyline[^>]* points="([^"]+)"', page)
    assert len(lines) == 3 and all(len(points.split()) >= 15 for points in lines), lines
    # The verdict with its reason in words: measured against the baseline, not modelled.
    status = harness.status()["targets"][0]["series"][0]  # type: ignore[index]
    assert status["verdict_basis"] == "observed"
    assert status["verdict_reason"].startswith("observed ")
    assert "against the measured baseline" in status["verdict_reason"]
    assert status["verdict"] in text and status["verdict_reason"] in text
