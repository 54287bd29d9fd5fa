"""The status page as a person sees it: a real headless Chromium loads it from the sidecar over loopback, a
screenshot is taken, and the rendered page's text and charts are checked.

Chromium is Debian's package (scripts/install-tools.sh): skipped without it, failed in CI."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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


def started(minutes: float) -> Harness:
    """A model at α 0.75 for the first half of ``minutes``, then at 0.40, against a measured baseline of 24 ms per
    token, collected every 5 s."""
    h = start_harness(steady_scenario(ModelSpec(acceptance_rate=0.75)), windows="1m,5m")
    target = dataclasses.replace(h.exporter.config.targets[0],
                                 baseline=BaselineConfig(time_per_output_token_seconds=0.024, p50=0.025, p99=0.03))
    h.exporter.apply_config(dataclasses.replace(h.exporter.config, targets=(target,)))
    steps = int(minutes * 12)
    for step in range(steps):
        if step == steps // 2:
            h.simulator.set_override(acceptance_rate=0.40)
        h.step(5.0)
    return h


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    """Twenty simulated minutes (about 8 s of collections), once for the module: its tests only read the page."""
    yield from harness_fixture(started(20))


@pytest.fixture
def one_minute() -> Iterator[Harness]:
    yield from harness_fixture(started(1))


# Run in the browser on a copy of the page: where every chart's plot area, texts and lines were laid out.
MEASURE = """<script>
const box = (e) => { const b = e.getBBox(); return [b.x, b.y, b.x + b.width, b.y + b.height]; };
const charts = [...document.querySelectorAll("svg.chart")].map((svg) => ({
  title: svg.getAttribute("aria-label"),
  size: [svg.width.baseVal.value, svg.height.baseVal.value],
  plot: svg.querySelector("rect.plot") ? box(svg.querySelector("rect.plot")) : null,
  texts: [...svg.querySelectorAll("text")].map((t) => ({text: t.textContent, box: box(t)})),
  lines: [...svg.querySelectorAll("polyline")].map(box),
}));
const out = document.createElement("pre");
out.id = "geometry";
out.textContent = JSON.stringify(charts);
document.body.appendChild(out);
</script>"""


def laid_out(url: str, tmp: Path) -> list[dict[str, Any]]:
    """Every chart of the page at ``url`` as Chromium lays it out."""
    page = tmp / "measured.html"
    page.write_text(httpx.get(url, timeout=5).text.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = browse(page.as_uri(), tmp, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="geometry">(.*?)</pre>', dom.stdout, re.S)
    assert found, dom.stdout[-2000:]
    charts: list[dict[str, Any]] = json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<")
                                              .replace("&gt;", ">"))
    return charts


def overlap(a: list[float], b: list[float]) -> bool:
    """Whether two boxes share more than a hairline (half a pixel)."""
    return min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5


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
    for words in ("α, last 20 min", "time per output token (ms)", "speedup (×)", "meta-llama/Llama-3.1-8B"):
        assert words in text, words
    # Three charts: α, TPOT and the speedup (observed and modelled), each line of the last minutes (one point per
    # 30 s or so).
    assert page.count("<svg") == 3
    lines = re.findall(r'<polyline[^>]* points="([^"]+)"', page)
    assert len(lines) == 4 and all(len(points.split()) >= 15 for points in lines), lines
    # The verdict with its reason in words: measured against the baseline, not modelled.
    status = harness.status()["targets"][0]["series"][0]  # type: ignore[index]
    assert status["verdict_basis"] == "observed"
    assert status["verdict_reason"].startswith("observed ")
    assert "against the measured baseline" in status["verdict_reason"]
    assert status["verdict"] in text and status["verdict_reason"] in text


def test_no_label_lies_over_the_data_or_another_label(harness: Harness, tmp_path: Path) -> None:
    """Tick labels, reference-line labels (page, break-even, 1×), titles and legends all lie outside the plotted
    area, inside the chart, and clear of each other, as the browser lays them out."""
    charts = laid_out(harness.sidecar_url + "/", tmp_path)
    assert len(charts) == 3
    for chart in charts:
        plot, texts = chart["plot"], chart["texts"]
        width, height = chart["size"]
        for text in texts:
            assert not overlap(text["box"], plot), (chart["title"], text)
            x0, y0, x1, y1 = text["box"]
            assert x0 >= -0.5 and y0 >= -0.5 and x1 <= width + 0.5 and y1 <= height + 0.5, (chart["title"], text)
        for i, a in enumerate(texts):
            for b in texts[i + 1:]:
                assert not overlap(a["box"], b["box"]), (chart["title"], a, b)
        for line in chart["lines"]:
            assert plot[0] - 0.5 <= line[0] and line[2] <= plot[2] + 0.5, (chart["title"], line, plot)
    alpha = next(c for c in charts if c["title"].startswith("α"))
    assert {"page 0.5", "break-even"} <= {t["text"] for t in alpha["texts"]}, "both rules are labelled"


def test_a_minute_after_start_the_charts_are_not_a_sliver(one_minute: Harness, tmp_path: Path) -> None:
    """The x axis spans the history there is (growing to the hour), so the first minute fills the chart."""
    charts = laid_out(one_minute.sidecar_url + "/", tmp_path)
    alpha = next(c for c in charts if c["title"].startswith("α"))
    assert alpha["title"] == "α, last 1 min"
    (line,) = alpha["lines"]
    plot_width = alpha["plot"][2] - alpha["plot"][0]
    assert line[2] - line[0] >= 0.75 * plot_width, (line, alpha["plot"])
    assert abs(line[2] - alpha["plot"][2]) <= 1.0, "the line reaches now, the right edge"
    assert {"-1 min", "0 min"} <= {t["text"] for t in alpha["texts"]}


def test_the_page_shows_the_observed_and_the_modelled_speedup(harness: Harness) -> None:
    page = httpx.get(harness.sidecar_url + "/", timeout=5).text
    window = harness.status()["targets"][0]["series"][0]["windows"]["5m"]  # type: ignore[index]
    observed, modelled = window["observed_speedup"]["mean"], window["expected_speedup"]
    assert f"{observed:.2f}× observed<br>{modelled:.2f}× modelled" in page
    speedup = re.search(r'<svg[^>]*aria-label="speedup \(×\)".*?</svg>', page, re.S)
    assert speedup is not None
    assert re.findall(r"<title>([^<]+)</title></polyline>", speedup.group(0)) == ["observed", "modelled"]
    assert ">observed</text>" in speedup.group(0) and ">modelled</text>" in speedup.group(0), "a legend names both"
