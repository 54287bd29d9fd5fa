"""The status page's pieces: the history the charts draw, their x axis, the labels kept off the plotted area, the
speedups shown side by side, the page's variance. (The page as laid out by a real browser:
tests/integration/test_status_page_browser.py.)"""

from __future__ import annotations

import itertools
import re

import pytest

from specdecode_exporter.core.stats.dispersion import Variance, WindowVariance
from specdecode_exporter.core.svg.charts import Axis, Frame, Rule, Series, fit, line_chart, nice_ticks, tick_format
from specdecode_exporter.sidecar.collection import HISTORY_SECONDS, HISTORY_STEP_SECONDS, HistoryPoint, extended
from specdecode_exporter.sidecar.status import requests_json
from specdecode_exporter.sidecar.status_page import ago, minutes_axis, speedup_cell, variance_table
from specdecode_exporter.tap.request_stats import RequestRecorder
from tests.tap.harness import tap_settings


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


@pytest.mark.parametrize(("oldest_seconds", "span", "ticks"), [
    (0.0, 1.0, (-1.0, -0.5, 0.0)), (50.0, 1.0, (-1.0, -0.5, 0.0)), (60.0, 1.0, (-1.0, -0.5, 0.0)),
    (61.0, 2.0, (-2.0, -1.5, -1.0, -0.5, 0.0)), (1000.0, 17.0, (-15.0, -10.0, -5.0, 0.0)),
    (3600.0, 60.0, (-60.0, -40.0, -20.0, 0.0)), (9000.0, 60.0, (-60.0, -40.0, -20.0, 0.0))])
def test_the_x_axis_spans_the_history_there_is_up_to_the_hour(oldest_seconds: float, span: float,
                                                              ticks: tuple[float, ...]) -> None:
    """Its ticks at round minutes (17 minutes of history were -17 / -8.5 / 0)."""
    history = [{"seconds_ago": oldest_seconds}, {"seconds_ago": 0.0}]
    assert minutes_axis({"history": history}) == Axis(-span, 0.0, "{:g} min", ticks)


@pytest.mark.parametrize(("values", "floor", "include", "ticks", "labels"), [
    ([0.62, 1.38], 0.0, (1.0,), (0.0, 0.5, 1.0, 1.5, 2.0), ["0.0", "0.5", "1.0", "1.5", "2.0"]),  # was 0.69 / 1.38
    ([8.0, 19.2], 0.0, (), (0.0, 10.0, 20.0, 30.0), ["0", "10", "20", "30"]),  # was 0 / 10 / 21
    ([0.31, 0.42], None, (), (0.25, 0.3, 0.35, 0.4, 0.45), ["0.25", "0.30", "0.35", "0.40", "0.45"]),
])
def test_a_fitted_axis_ticks_at_round_values(values: list[float], floor: float | None, include: tuple[float, ...],
                                             ticks: tuple[float, ...], labels: list[str]) -> None:
    low, high = fit(values, floor=floor, include=include)
    assert (low, high) == (ticks[0], ticks[-1])
    assert nice_ticks(low, high) == pytest.approx(ticks)
    assert [tick_format(low, high).format(t) for t in nice_ticks(low, high)] == labels


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


def test_the_routing_table_says_each_decision_with_its_own_numbers() -> None:
    """Each decision names the bound its test compared (upper for an unrouted class's block, lower for a canary
    block) and the break-even in force then; a class that stays routed says so in its own words, below the decision
    that routed it; the note says that α decides, not the measured speedups, and why TPOT and end to end can
    disagree."""
    from specdecode_exporter.sidecar.status_page import routing_rows

    def decision(outcome: str, alpha: float, bound: float, break_even: float) -> dict[str, object]:
        was_routed = outcome in ("stays routed", "back on speculation")
        return {"outcome": outcome, "acceptance_ratio": alpha, "bound": bound,
                "bound_kind": "lower" if was_routed else "upper", "break_even_acceptance_ratio": break_even,
                "requests": 50, "routed": outcome in ("routed", "stays routed")}

    def route(routed: bool, state: dict[str, object] | None, last: dict[str, object]) -> dict[str, object]:
        return {"model_name": "m", "workload": "code", "temperature": "0", "routed": routed, "seconds_in_state": 60.0,
                "requests": [{"upstream": "speculative", "reason": "x", "requests": 50}],
                "state_decision": state, "last_decision": last,
                "measured_speedup": None, "last_episode_measured_speedup": None}

    routed_by = decision("routed", 0.533, 0.592, 0.604)
    routing = {"mode": "enforce", "fallback_upstream": "http://f:1", "fallback_available": True, "min_requests": 50,
               "canary_share": 0.05, "statistics": {"route_level": 0.01, "return_level": 0.01},
               "classes": [route(True, routed_by, routed_by),
                           route(True, routed_by, decision("stays routed", 0.47, 0.36, 0.55)),
                           route(False, None, decision("stays on speculation", 0.71, 0.8, 0.55))]}
    html = routing_rows({"routing": routing})
    said_route = "routed: α 0.53, upper bound 0.59 &lt; break-even 0.60 in force then, 50 requests"
    assert html.count(said_route) == 2
    assert (f"{said_route}<br><small>latest: stays routed: canary α 0.47, lower bound 0.36 ≤ break-even 0.55 in "
            "force then, 50 requests</small>") in html
    assert "stays on speculation: α 0.71, upper bound 0.80 ≥ break-even 0.55 in force then, 50 requests" in html
    assert "its 99% one-sided upper bound" in html
    assert "Only α decides routing: the measured speedups" in html and "are not used to decide" in html


def test_the_page_s_variance_shows_its_value_source_and_requests() -> None:
    """Status JSON and page: per model and window, v, measured or assumed, on how many requests."""
    view = RequestRecorder(tap_settings()).view()
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
