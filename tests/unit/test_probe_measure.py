"""The probe's pure parts against hand computations: quantiles, α, acceptance length, per-position acceptance from
histograms and counters, TPOT, speedup, the verdict bands; prompts files; the monitoring config's probe section;
the output shapes."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.probe import measure as m
from specdecode_exporter.probe.progress import Progress
from specdecode_exporter.probe.prompts import Prompt, PromptsError, builtin_prompts, by_group, load_prompts
from specdecode_exporter.probe.report import (
    COLUMNS,
    PlotError,
    check_plot_path,
    render_csv,
    render_html,
    render_json,
    render_table,
)
from specdecode_exporter.probe.run import Outcome, Plan
from tests.helpers import fixture_text

BANDS = m.Bands(0.5, 0.65, 1.3)


def result(tokens: int = 41, server: float | None = 0.01, client: float | None = 0.012,
           spec: m.RequestSpec | None = None, started: float = 0.0, finished: float = 1.0,
           error: str | None = None) -> m.RequestResult:
    return m.RequestResult(tokens, server, client, spec, started, finished, error)


def test_quantile_interpolates_between_closest_ranks() -> None:
    assert m.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5  # between the 2nd and 3rd of 1 2 3 4
    assert m.quantile([1.0, 2.0, 3.0, 4.0], 0.99) == pytest.approx(3.97)  # rank 2.97: 3 + 0.97 × (4 − 3)
    assert m.quantile([1.0, 2.0, 3.0, 4.0], 0.0) == 1.0
    assert m.quantile([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0
    assert m.quantile([7.0], 0.99) == 7.0
    assert m.quantile([], 0.5) is None
    assert m.quantile([0.1 * i for i in range(1, 21)], 0.99) == pytest.approx(1.981)  # rank 18.81 of 0.1 … 2.0


def test_positions_from_a_histogram() -> None:
    # 2 steps accepted 0, 1 accepted 1, 8 accepted 3 (vLLM's fixture): position 0 is accepted by 9 steps,
    # positions 1 and 2 by the 8 that accepted all three; Σ = 25 = accepted tokens.
    assert m.positions_from_histogram([2, 1, 0, 8]) == [9, 8, 8]
    assert m.positions_from_histogram([0, 0, 5, 0]) == [5, 5, 0]


def test_request_spec_reads_vllm_and_llamacpp() -> None:
    body = json.loads(fixture_text("vllm_0.32.0/completion_nonstream.json"))
    spec = m.request_spec(body["metrics"], None)
    assert spec == m.RequestSpec(33.0, 25.0, 11.0, (2, 1, 0, 8))
    assert m.server_tpot(body["metrics"], 40) == pytest.approx(58.67423200004396 / 1000 / 39)
    assert m.request_spec(None, {"draft_n": 10, "draft_n_accepted": 7}) == m.RequestSpec(10.0, 7.0, None, None)
    assert m.request_spec({"speculative_decoding": None, "generation_time_ms": 5.0}, None) is None
    assert m.request_spec(None, None) is None


def test_tpot_from_server_and_client() -> None:
    assert m.server_tpot({"generation_time_ms": 390.0}, 40) == pytest.approx(0.01)  # 0.39 s / 39
    assert m.server_tpot({"generation_time_ms": None}, 40) is None
    assert m.server_tpot({"generation_time_ms": 390.0}, 1) is None
    assert m.client_tpot(10.0, 10.5, 51) == pytest.approx(0.01)  # 0.5 s / 50
    assert m.client_tpot(None, 10.5, 51) is None
    assert m.client_tpot(10.0, 10.0, 51) is None


def test_per_request_counts_pool_numerators_and_denominators() -> None:
    a = m.RequestSpec(33, 25, 11, (2, 1, 0, 8))
    b = m.RequestSpec(30, 0, 10, (10, 0, 0, 0))
    counts = m.per_request_counts([result(spec=a), result(spec=b), result(spec=None, error="timeout")])
    assert counts == m.SpecCounts(21, 63, 25, (9.0, 8.0, 8.0))
    assert counts.acceptance_ratio == pytest.approx(25 / 63)  # not (25/33 + 0/30) / 2
    assert counts.mean_acceptance_length == pytest.approx(1 + 25 / 21)
    assert counts.position_acceptance_ratios == pytest.approx((9 / 21, 8 / 21, 8 / 21))
    assert m.per_request_counts([result(spec=None)]) is None
    llama = m.per_request_counts([result(spec=m.RequestSpec(10, 7, None, None))])
    assert llama is not None and llama.acceptance_ratio == 0.7
    assert llama.mean_acceptance_length is None and llama.position_acceptance_ratios is None


def counters(drafts: float, accepted: float, per_pos: tuple[float, ...], generation: float | None = 0.0,
             in_flight: float = 0.0) -> m.Counters:
    return m.Counters(drafts, drafts * 3, accepted, per_pos, generation, in_flight)


def test_counter_increase_and_restart() -> None:
    before = counters(100, 150, (60, 50, 40), 500)
    after = counters(130, 190, (80, 60, 50), 620)
    grew = after.minus(before)
    assert grew == m.SpecCounts(30, 90, 40, (20, 10, 10))
    assert grew.acceptance_ratio == pytest.approx(40 / 90)
    assert grew.mean_acceptance_length == pytest.approx(1 + 40 / 30)
    restarted = counters(5, 6, (3, 2, 1), 10).minus(before)  # a counter that went down: the increase is the value
    assert restarted == m.SpecCounts(5, 15, 6, (3, 2, 1))


def test_other_traffic_checks() -> None:
    idle = counters(100, 150, (60, 50, 40), 500)
    assert m.idle_traffic(idle, idle) is None
    moved = m.idle_traffic(idle, counters(101, 151, (61, 50, 40), 503))
    assert moved is not None and "no request in flight" in moved and "1 drafts" in moved
    busy = m.idle_traffic(idle, counters(100, 150, (60, 50, 40), 500, in_flight=2))
    assert busy is not None and "2 other requests" in busy
    assert m.extra_tokens(idle, counters(130, 190, (80, 60, 50), 700), 200) is None
    extra = m.extra_tokens(idle, counters(130, 190, (80, 60, 50), 701), 200)
    assert extra == "generation tokens grew by 201 while the probe's requests generated 200"
    assert m.extra_tokens(counters(1, 1, (1,), None), counters(2, 2, (2,), None), 5) is None


@pytest.mark.parametrize(("alpha", "speedup", "expected"), [
    (None, None, m.NO_DRAFTS),
    (0.49, None, m.DISABLE),
    (0.40, 2.0, m.DISABLE),  # α below the page threshold wins over a good speedup
    (0.50, None, m.MEASURE),
    (0.649, None, m.MEASURE),
    (0.60, 1.5, m.MEASURE),
    (0.65, None, m.SHIP),
    (0.90, 1.3, m.SHIP),
    (0.90, 1.29, m.DO_NOT_SHIP),
    (0.55, 1.0, m.DO_NOT_SHIP),
])
def test_verdict_bands(alpha: float | None, speedup: float | None, expected: str) -> None:
    assert m.verdict(alpha, speedup, BANDS)[0] == expected


def test_a_row_with_a_baseline() -> None:
    spec = m.RequestSpec(30, 24, 10, (1, 2, 3, 4))
    mine = [result(41, server=t, spec=spec, started=i, finished=i + 2) for i, t in enumerate((0.010, 0.012, 0.020))]
    theirs = [result(41, server=t) for t in (0.016, 0.018, 0.021)]
    row = m.make_row(m.Cell(0.4, "code", mine, m.per_request_counts(mine), m.PER_REQUEST, theirs), BANDS)
    assert row.tpot_source == m.SERVER_TIMINGS
    assert row.tpot_p50_seconds == 0.012
    assert row.tpot_p99_seconds == pytest.approx(0.012 + 0.98 * 0.008)  # rank 1.98 of 0.010 0.012 0.020
    assert row.baseline_tpot_p50_seconds == 0.018
    assert row.speedup_p50 == pytest.approx(0.018 / 0.012)
    assert row.speedup_p99 == pytest.approx((0.018 + 0.98 * 0.003) / (0.012 + 0.98 * 0.008))
    assert row.acceptance_ratio == pytest.approx(72 / 90)
    assert row.tokens_per_second == pytest.approx(123 / 4)  # 3 × 41 tokens from t=0 to t=4
    assert row.verdict == m.SHIP and row.requests == 3 and row.failed_requests == 0


def test_tpot_source_is_the_same_on_both_sides() -> None:
    mine = [result(server=0.01, client=0.011)]
    theirs = [result(server=None, client=0.02)]
    assert m.tpot_source(mine, theirs) == m.CLIENT_TIMINGS  # one side without server timings: both from the client
    row = m.make_row(m.Cell(0.0, "all", mine, None, m.COUNTERS, theirs), BANDS)
    assert row.tpot_p50_seconds == 0.011 and row.speedup_p50 == pytest.approx(0.02 / 0.011)
    assert row.verdict == m.NO_DRAFTS


def test_monitoring_config_has_the_probe_bands() -> None:
    cfg = monitoring_config.load()
    assert cfg.probe == monitoring_config.ProbeSettings(measure_below=0.65, ship_speedup=1.3)
    assert cfg.thresholds.page_acceptance_ratio == 0.5


@pytest.mark.parametrize(("probe", "message"), [
    ({"measure_below": 1.5, "ship_speedup": 1.3}, "probe.measure_below: expected a number between 0 and 1, got 1.5"),
    ({"measure_below": 0.4, "ship_speedup": 1.3}, "probe.measure_below: 0.4 must not be below "
                                                  "thresholds.page_acceptance_ratio (0.5)"),
    ({"measure_below": 0.65, "ship_speedup": -1}, "probe.ship_speedup: expected a number > 0, got -1"),
    ({"measure_below": 0.65, "ship_speedup": 0}, "probe.ship_speedup: expected a number > 0, got 0"),
    ({"measure_below": 0.65, "ship_speedup": 1.3, "ship": 2},
     "probe.ship: unknown key (allowed: measure_below, ship_speedup)"),
    ({"ship_speedup": 1.3}, "probe.measure_below: required"),
])
def test_monitoring_config_validates_the_probe_section(probe: dict[str, float], message: str) -> None:
    raw = monitoring_config.read_yaml(monitoring_config.DEFAULT_FILE)
    raw["probe"] = probe
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        monitoring_config.from_mapping(raw)


def test_prompts_file_with_groups(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "def f(", "group": "code"}\n\n{"prompt": "hi"}\n'
                    '{"messages": [{"role": "user", "content": "x"}], "prompt": "y", "group": "code"}\n')
    prompts = load_prompts(path, chat=False)
    groups = by_group(prompts)
    assert list(groups) == ["code", "all"] and len(groups["code"]) == 2
    assert prompts[0].payload(chat=False) == {"prompt": "def f("}
    assert prompts[1].payload(chat=True) == {"messages": [{"role": "user", "content": "hi"}]}
    assert prompts[2].payload(chat=True) == {"messages": [{"role": "user", "content": "x"}]}
    assert {p.group for p in builtin_prompts()} == {"code", "chat", "summarization", "copy-heavy"}


@pytest.mark.parametrize(("text", "chat", "message"), [
    ("{nope\n", False, "line 1: not JSON"),
    ('{"prompt": "a"}\n[1]\n', False, "line 2: expected a JSON object"),
    ('{"messages": [{"role": "user", "content": "x"}]}\n', False, "pass --chat"),
    ('{"messages": [{"role": "robot", "content": "x"}]}\n', True, "messages[0]: expected"),
    ('{"prompt": ""}\n', False, "prompt: expected a non-empty string"),
    ('{"prompt": "a", "group": 3}\n', False, "group: expected a printable string"),
    ("\n\n", False, "no prompts"),
])
def test_bad_prompts_files_name_the_line(tmp_path: Path, text: str, chat: bool, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(PromptsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_prompts(path, chat)
    with pytest.raises(PromptsError, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl", chat)


def sample_rows() -> list[m.Row]:
    spec = m.RequestSpec(30, 24, 10, (1, 2, 3, 4))
    out = []
    for t in (0.0, 1.0):
        mine = [result(41, server=0.01 + t / 100, spec=spec)]
        out.append(m.make_row(m.Cell(t, "code <&>", mine, m.per_request_counts(mine), m.PER_REQUEST, mine), BANDS))
    return out


def test_json_csv_and_table_shapes() -> None:
    rows = sample_rows()
    data = json.loads(render_json(rows))
    assert isinstance(data, list) and len(data) == 2
    assert {"temperature", "group", "requests", "acceptance_ratio", "mean_acceptance_length",
            "position_acceptance_ratios", "tpot_p50_seconds", "tpot_p99_seconds", "tokens_per_second",
            "speedup_p50", "speedup_p99", "verdict", "source"} <= set(data[0])
    assert data[0]["position_acceptance_ratios"] == pytest.approx([0.9, 0.7, 0.4])
    table = list(csv.reader(io.StringIO(render_csv(rows))))
    assert tuple(table[0]) == COLUMNS and len(table) == 3
    assert table[1][COLUMNS.index("position_acceptance_ratios")] == "0.9 0.7 0.4"
    plan = Plan("http://a:1", "http://b:2", None, (0.0, 1.0), (("code", (Prompt("code", "x", None),)),), 1, 1, 8)
    outcome = Outcome(model="m", source=m.PER_REQUEST, rows=rows)
    text = render_table(plan, outcome)
    assert "speedup p50" in text and "0.800" in text and "exact" in text
    page = render_html(plan, outcome)
    assert "<svg" in page and "<script" not in page and "code &lt;&amp;&gt;" in page


@pytest.mark.parametrize("baseline", ["http://b:2", None])
def test_the_verdict_line_names_only_the_rules_it_applied(baseline: str | None) -> None:
    """probe.ship_speedup decides only with --baseline-url; without one the line must not cite it."""
    plan = Plan("http://a:1", baseline, None, (0.0, 1.0), (("code", (Prompt("code", "x", None),)),), 1, 1, 8)
    line = render_table(plan, Outcome(model="m", source=m.PER_REQUEST, rows=sample_rows())).split("verdict: ")[1]
    line = line.splitlines()[0]
    assert ("median speedup" in line) == ("probe.ship_speedup" in line) == (baseline is not None), line


def test_plot_path_checks() -> None:
    check_plot_path("a.html")
    check_plot_path("a.PNG")
    with pytest.raises(PlotError, match=r"expected a \.png or \.html"):
        check_plot_path("a.svg")


def test_progress_bar_on_a_terminal_and_lines_elsewhere() -> None:
    tty, log = io.StringIO(), io.StringIO()
    for stream, is_tty in ((tty, True), (log, False)):
        progress = Progress(stream, tty=is_tty, every=0.0)
        progress.start(4, 2)
        progress.working_on("T=0 code")
        progress.advance()
        progress.row_done(sample_rows()[0])
        progress.close()
    assert "\r\x1b[Kprobe [" in tty.getvalue() and "1/4 requests" in tty.getvalue()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and lines[0] == "probe: measuring 2 rows, 4 requests"
    assert any(line.startswith("probe: row 1/2 T=0 code <&>: α 0.800") for line in lines)
