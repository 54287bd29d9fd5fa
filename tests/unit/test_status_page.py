"""The status page's pieces: the history the charts draw, their x axis, the labels kept off the plotted area, the
speedups shown side by side, the page's variance. (The page as laid out by a real browser:
tests/integration/test_status_page_browser.py.)"""

from __future__ import annotations

import itertools
import re

import pytest

from specdecode_exporter.core.charts import Axis, Frame, Rule, Series, line_chart
from specdecode_exporter.core.dispersion import Variance, WindowVariance
from specdecode_exporter.sidecar.collection import HISTORY_SECONDS, HISTORY_STEP_SECONDS, HistoryPoint, extended
from specdecode_exporter.sidecar.status import requests_json
from specdecode_exporter.sidecar.status_page import ago, minutes_axis, speedup_cell, variance_table
from specdecode_exporter.tap.request_stats import RequestRecorder


def test_history_keeps_about_one_point_a_step_and_always_the_latest() -> None:
    interval = 5.0
    points: tuple[HistoryPoint, ...] = ()
    for i in range(2 * 3600 // 5):
        now = i * interval
        points = extended(points, HistoryPoint(now, 0.7, None, None))
        assert points[-1].at == now, "the charts reach up to now"
    ages = [now - p.at for p in points]
    assert max(ages) <= HISTORY_SECONDS
    gaps = [b.at - a.at for a, b in itertools.pairwise(points[:-1])]
    assert min(gaps) >= HISTORY_STEP_SECONDS - interval
    assert len(points) <= HISTORY_SECONDS / (HISTORY_STEP_SECONDS - interval) + 2


@pytest.mark.parametrize(("oldest_seconds", "span"), [(0.0, 1.0), (50.0, 1.0), (60.0, 1.0), (61.0, 2.0),
                                                      (1000.0, 17.0), (3600.0, 60.0), (9000.0, 60.0)])
def test_the_x_axis_spans_the_history_there_is_up_to_the_hour(oldest_seconds: float, span: float) -> None:
    history = [{"seconds_ago": oldest_seconds}, {"seconds_ago": 0.0}]
    assert minutes_axis({"history": history}) == Axis(-span, 0.0, "{:g} min", (-span, -span / 2, 0.0))


def test_reference_line_labels_lie_right_of_the_plot_and_apart() -> None:
    frame = Frame()
    svg = line_chart("α", [Series("α", [(-1.0, 0.5), (0.0, 0.5)])], Axis(-1.0, 0.0), Axis(0.0, 1.0),
                     [Rule(0.5, "page 0.5"), Rule(0.5, "break-even")], frame)
    plot_right = frame.left + frame.plot_width
    labels = {m[2]: (float(m[0]), float(m[1]))
              for m in re.findall(r'<text x="([\d.]+)" y="([\d.]+)" font-size="9" fill="[^"]+">([^<]+)</text>', svg)}
    assert set(labels) == {"page 0.5", "break-even"}
    assert all(x > plot_right for x, _ in labels.values())
    assert abs(labels["page 0.5"][1] - labels["break-even"][1]) >= 10, "two rules at one value: labels stacked"
    width = int(re.search(r'<svg[^>]* width="(\d+)"', svg).group(1))  # type: ignore[union-attr]
    assert width >= plot_right + len("break-even") * 5, "the frame grew to hold them"


def test_the_speedup_cell_labels_both() -> None:
    window = {"observed_speedup": {"mean": 1.31}, "expected_speedup": 1.26}
    assert speedup_cell(window, has_baseline=True) == "1.31× observed<br>1.26× modelled"
    assert speedup_cell({"expected_speedup": 1.26}, has_baseline=False) == (
        "– observed <small>(no baseline)</small><br>1.26× modelled")


@pytest.mark.parametrize(("seconds", "words"), [(12, "12 s"), (60, "1 min"), (3599, "59 min"), (3900, "1 h 5 min"),
                                                (50 * 3600, "2 d 2 h")])
def test_ago(seconds: float, words: str) -> None:
    assert ago(seconds) == words


def test_the_page_s_variance_shows_its_value_source_and_requests() -> None:
    """Status JSON and page: per model and window, v, measured or assumed, on how many requests."""
    view = RequestRecorder().view()
    rows = [WindowVariance("llama", "1m", Variance(1.83, "assumed", 3)),
            WindowVariance("llama", "1h", Variance(0.91, "measured", 412, 0.84))]
    requests = requests_json(view, 0.5, 600.0, rows)
    assert requests["variance"] == [
        {"model_name": "llama", "window": "1m", "variance_per_draft_token": 1.83, "source": "assumed", "requests": 3,
         "estimate": None},
        {"model_name": "llama", "window": "1h", "variance_per_draft_token": 0.91, "source": "measured",
         "requests": 412, "estimate": 0.84}]
    html_table = variance_table(requests)
    assert "<td>1h</td><td>0.91</td><td>measured</td><td>412</td><td>0.84</td>" in html_table
    assert "<td>1m</td><td>1.83</td><td>assumed</td><td>3</td><td>–</td>" in html_table
    assert variance_table(requests_json(view, 0.5, 600.0)) == ""
