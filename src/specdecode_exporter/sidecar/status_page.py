"""The status page (/): per target and series the numbers that answer "is it paying off?", the verdict with its
reason, and up to the last hour as small inline-SVG charts (α, time per output token, observed and modelled
speedup). It renders the same dict as /api/v1/status, so the two never disagree. No JavaScript, no external
assets."""

from __future__ import annotations

import html
import math
from typing import Any

from specdecode_exporter.core.svg.charts import (
    Axis,
    Frame,
    Rule,
    Series,
    bar_chart,
    fit,
    line_chart,
    nice_ticks,
    tick_format,
)
from specdecode_exporter.pipeline.store import STANDSTILL_COLLECTIONS
from specdecode_exporter.sidecar.series import ago

VERDICT_COLOURS = {"paying off": "#1a7f37", "marginal": "#9a6700", "hurting": "#cf222e", "no traffic": "#57606a",
                   "not speculating": "#cf222e", "no data": "#57606a"}
HISTORY_MINUTES = 60  # what the charts show at most; the sidecar keeps an hour of history
STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#1f2328}table{border-collapse:collapse}
td,th{border:1px solid #d0d7de;padding:.4em .7em;text-align:left;vertical-align:top}th{background:#f6f8fa}
.charts td{border-top:none;background:#fff}.chart{margin-right:1em}.verdict{font-weight:bold}"""
HEADER = ("target", "model", "engine", "α by window", "mean acceptance length", "speedup", "break-even α",
          "recommended / current k", "verdict")


def _cell(value: float | int | None, fmt: str = "{:.3f}") -> str:
    return "–" if value is None else html.escape(fmt.format(value))


def _history(series: dict[str, Any], key: str, scale: float = 1.0) -> list[tuple[float, float]]:
    return [(-point["seconds_ago"] / 60.0, point[key] * scale) for point in series["history"]
            if point.get(key) is not None and point["seconds_ago"] <= HISTORY_MINUTES * 60]


def minutes_axis(series: dict[str, Any]) -> Axis:
    """The x axis of a series' charts: as far back as its history goes, in whole minutes (at least one, at most
    HISTORY_MINUTES), so a sidecar started a minute ago fills the chart instead of its last sixtieth."""
    oldest = max((point["seconds_ago"] for point in series["history"]), default=0.0)
    span = float(min(HISTORY_MINUTES, max(1, math.ceil(oldest / 60.0 - 1e-9))))
    return Axis(-span, 0.0, "{:g} min", nice_ticks(-span, 0.0))


def _last(axis: Axis) -> str:
    return "last hour" if axis.low <= -HISTORY_MINUTES else f"last {-axis.low:g} min"


def alpha_chart(series: dict[str, Any], page_threshold: float) -> str:
    rules = [Rule(page_threshold, f"page {page_threshold:g}")]
    if series["break_even_acceptance_ratio"] is not None:
        rules.append(Rule(series["break_even_acceptance_ratio"], "break-even", "#9a6700"))
    x = minutes_axis(series)
    return line_chart(f"α, {_last(x)}", [Series("α", _history(series, "acceptance_ratio"))], x,
                      Axis(0.0, 1.0, "{:.1f}", (0.0, 0.5, 1.0)), rules)


def tpot_chart(series: dict[str, Any]) -> str:
    points = _history(series, "tpot_mean_seconds", 1000.0)
    low, high = fit([y for _, y in points])
    x = minutes_axis(series)
    return line_chart(f"time per output token (ms), {_last(x)}", [Series("TPOT mean", points, "#8250df")], x,
                      Axis(low, high, tick_format(low, high)), empty="no requests yet")


def speedup_chart(series: dict[str, Any], has_baseline: bool) -> str:
    """Observed (against the baseline) and modelled (the cost model) speedup side by side, labelled."""
    observed = _history(series, "observed_speedup")
    modelled = _history(series, "expected_speedup")
    low, high = fit([y for _, y in (*observed, *modelled)], floor=0.0, include=(1.0,))
    lines = [Series("observed", observed, "#1a7f37"), Series("modelled", modelled, "#57606a", dashed=True)]
    return line_chart("speedup (×)", lines, minutes_axis(series), Axis(low, high, "{:.2f}"), [Rule(1.0, "1×")],
                      empty="measured once requests finish" if has_baseline else "no baseline configured",
                      legend=True)


def speedup_cell(window: dict[str, Any], has_baseline: bool) -> str:
    """Both speedups, each labelled: measured against the baseline, and modelled from α, k and the cost model."""
    observed = window.get("observed_speedup", {}).get("mean")
    missing = "" if observed is not None or has_baseline else " <small>(no baseline)</small>"
    return (f"{_cell(observed, '{:.2f}×')} observed{missing}<br>"
            f"{_cell(window.get('expected_speedup'), '{:.2f}×')} modelled")


def alpha_by_window(series: dict[str, Any], names: list[str], stale: bool = False) -> str:
    """α over every configured window, each one without a value saying why (never left out: a window that
    drops out would leave a longer one's α in its place)."""
    if not series["spec_decode"]:
        return served(series, names)
    stopped = (series.get("speculation") or {}).get("state") == "stopped"
    cells = []
    for name in names:
        window = series["windows"].get(name)
        if window is None:
            why = "stale: the target cannot be read" if stale else "no data yet"
        elif window.get("proposed_token_acceptance_ratio") is not None:  # α withheld: its lower bound instead
            cells.append(f"{html.escape(name)} ≥ {_cell(window['proposed_token_acceptance_ratio'], '{:.2f}')} "
                         "<small>(accepted per proposed token: a lower bound, not α)</small>")
            continue
        elif window.get("acceptance_ratio") is None:
            why = "nothing drafted (speculation stopped)" if stopped else "nothing drafted"
        else:
            cells.append(f"{html.escape(name)} {_cell(window['acceptance_ratio'], '{:.2f}')}")
            continue
        cells.append(f"{html.escape(name)} – <small>({why})</small>")
    return " · ".join(cells)


def served(series: dict[str, Any], names: list[str]) -> str:
    """What a control series (spec decode off) served, by window: it has no α, but it has traffic."""
    requests = [(name, (series["windows"].get(name, {}).get("latency") or {}).get("requests")) for name in names]
    generated = series["totals"]["generated_tokens"]
    if not generated and not any(count for _, count in requests):
        return "no traffic"
    by_window = " · ".join(f"{html.escape(name)} {_cell(count, '{:.0f}')}" for name, count in requests)
    return f"spec decode off; requests finished: {by_window}; {_cell(generated, '{:.0f}')} tokens generated since start"


def series_rows(target: dict[str, Any], series: dict[str, Any], page_threshold: float,
                window_names: list[str]) -> list[str]:
    e = html.escape
    windows = series["windows"]
    window = windows.get(series["verdict_window"] or "", {})
    alphas = alpha_by_window(series, window_names, target.get("windows_stale", False))
    speedup = speedup_cell(window, target["baseline"] is not None)
    state = target_state(target)
    if target.get("not_applicable"):
        return ["<tr>"
                f"<td>{e(target['name'])}<br><small>{state}, {e(target['api'] or '?')}</small></td>"
                f"<td>{e(series['model_name'] or '')}</td><td>{e(series['engine'] or '')}</td>"
                f"<td colspan={len(HEADER) - 3}>{e(target['not_applicable'])}</td></tr>"]
    charts = [tpot_chart(series)] if not series["spec_decode"] else [
        alpha_chart(series, page_threshold), tpot_chart(series),
        speedup_chart(series, target["baseline"] is not None)]
    colour = VERDICT_COLOURS.get(series["verdict"], "#57606a")
    verdict = "control (spec decode off)" if not series["spec_decode"] else e(series["verdict"])
    for note in (target.get("withheld"), target.get("verification")):
        if note:
            state += f"; {e(note)}"
    return [
        "<tr>"
        f"<td>{e(target['name'])}<br><small>{state}, {e(target['api'] or '?')}</small></td>"
        f"<td>{e(series['model_name'] or '')}</td><td>{e(series['engine'] or '')}</td>"
        f"<td>{alphas or 'no windows'}</td>"
        f"<td>{_cell(window.get('mean_acceptance_length'), '{:.2f}')}</td><td>{speedup}</td>"
        f"<td>{_cell(series['break_even_acceptance_ratio'], '{:.2f}')}<br>"
        f"<small>{e(series['cost_basis_words'])}</small></td>"
        f"<td>{_cell(window.get('recommended_num_speculative_tokens'), '{}')} "
        f"/ {_cell(series['num_speculative_tokens'], '{}')}</td>"
        f"<td class='verdict' style='color:{colour}'>{verdict}<br><small>{e(series['verdict_reason'])}</small>"
        f"{verdict_since(series)}</td></tr>",
        f"<tr class='charts'><td colspan={len(HEADER)}>{''.join(charts)}</td></tr>",
    ]


def target_state(target: dict[str, Any]) -> str:
    """Up, or down with its error, and since when its windowed figures are stale (they are dropped after
    windows_grace_failed_collections failed collections in a row; counters stay)."""
    if target["up"]:
        return "up"
    e = html.escape
    state = f"down ({e(target['last_error'] or '')})"
    if target.get("windows_stale"):
        since = target.get("no_data_since")
        grace = target["windows_grace_failed_collections"]
        state += (f"; no data since {e(since.replace('T', ' ').replace('Z', ' UTC')) if since else 'the start'}: "
                  f"windowed figures dropped (kept through {grace} failed collection{'s' if grace != 1 else ''}), "
                  "counters kept")
    return state


def verdict_since(series: dict[str, Any]) -> str:
    """Since when the verdict is in force (one waiting out the hysteresis is in the reason: "held: …")."""
    since = series.get("verdict_since")
    if since is None or not series["spec_decode"]:
        return ""
    return (f"<br><small class='since'>in force since {html.escape(since[11:19])} UTC, "
            f"{ago(series['verdict_seconds'] or 0.0)} ago</small>")


def speculation_row(series: dict[str, Any]) -> str:
    """Whether it still speculates, what it costs against the control target, and the batch-size advice."""
    if not series["spec_decode"]:
        return ""
    e = html.escape
    parts = []
    speculation = series.get("speculation")
    if speculation is not None:
        colour = "#cf222e" if speculation["state"] == "stopped" else "#1f2328"
        parts.append(f"<p class='speculation' style='color:{colour}'><b>Speculation:</b> {e(speculation['reason'])}"
                     "</p>")
    window = series["windows"].get(series["verdict_window"] or "", {})
    if window.get("position_acceptance_unproven"):
        parts.append(f"<p class='unproven'><b>Per position:</b> {e(window['position_acceptance_unproven'])} "
                     f"(mean draft length {_cell(window.get('mean_draft_length'), '{:.2f}')})</p>")
    versus = window.get("against_control")
    if versus is not None:
        parts.append(f"<p class='cost'><b>Against {e(versus['control'])}:</b> {e(_cost_words(versus))}</p>")
    schedule = series.get("schedule")
    if schedule is not None:
        parts.append(schedule_block(schedule))
    if not parts:
        return ""
    return f"<tr class='charts'><td colspan={len(HEADER)}>{''.join(parts)}</td></tr>"


def _cost_words(versus: dict[str, Any]) -> str:
    words = [f"KV cache {_cell(versus['kv_cache_usage'], '{:.0%}')} full "
             f"(control {_cell(versus['control_kv_cache_usage'], '{:.0%}')})"]
    if versus["preemptions_per_request_increase"] is not None:
        words.append(f"{versus['preemptions_per_request_increase']:+.3f} preemptions per request")
    words.append(f"{_cell(versus['throughput_ratio'], '{:.2f}×')} the control's generated tokens/s while requests "
                 "wait" if versus["throughput_ratio"] is not None else "throughput compared only while requests wait")
    return "; ".join(words)


def schedule_block(schedule: dict[str, Any]) -> str:
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(r['batch_size'])}</td><td>{r['recommended_num_speculative_tokens']}</td>"
        f"<td>{_cell(r['expected_speedup_fixed'], '{:.2f}×')}</td>"
        f"<td>{_cell(r['expected_speedup_recommended'], '{:.2f}×')}</td>"
        f"<td>{r['observed_seconds']:.0f}s{'' if r['own_acceptance'] else ' *'}</td></tr>" for r in schedule["ranges"])
    pastes = "".join(f"<p><small>{name}</small><br><code>{e(text)}</code></p>"
                     for name, text in (("vLLM", schedule["vllm"]), ("TensorRT-LLM", schedule["trtllm"])) if text)
    k = schedule["num_speculative_tokens"]
    return (f"<p><b>Batch-size schedule</b> ({e(schedule['window'] or '')}): {e(schedule['summary'])}</p>"
            f"<table class='schedule'><tr><th>batch size</th><th>k</th><th>speedup at k = {k}</th>"
            "<th>speedup at k</th><th>time seen</th></tr>"
            f"{rows}</table><p><small>* acceptance of all batch sizes (too few drafts at this one); speedups are "
            f"modelled</small></p>{pastes or '<p>no batch size pays: turn speculation off</p>'}")


def target_rows(status: dict[str, Any]) -> list[str]:
    rows: list[str] = []
    for target in status["targets"]:
        if not target["series"]:
            state = target_state(target)
            rows.append(f"<tr><td>{html.escape(target['name'])}</td><td colspan={len(HEADER) - 1}>{state}</td></tr>")
        for series in target["series"]:
            rows += series_rows(target, series, status["page_threshold"], status["windows"])
            rows.append(speculation_row(series))
        rows.append(requests_rows(target, status["page_threshold"], status["uptime_seconds"]))
        rows.append(routing_rows(target))
    return rows


def status_html(status: dict[str, Any], telemetry_path: str) -> str:
    e = html.escape
    bands = status["verdict_bands"]
    body = "\n".join(target_rows(status)) or f"<tr><td colspan={len(HEADER)}>no targets configured</td></tr>"
    head = "".join(f"<th>{e(name)}</th>" for name in HEADER)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>specdecode-exporter</title><style>{STYLE}</style></head><body>
<h1>specdecode-exporter</h1>
<p>Is speculative decoding paying off? α = accepted / drafted tokens; below the break-even α it costs more than
it saves. Verdict over the {e(bands['window'])} window, from the observed speedup where there is a baseline, else the
modelled one: hurting below {bands['hurting_below']:g}×, paying off from {bands['paying_off_from']:g}× with α not below
the page threshold {status['page_threshold']:g}, marginal between (or with a tail regression). A new verdict takes
over once it has held {bands['hold_seconds']:g} s, or at once {bands['margin']:g} past a band edge; "not speculating"
(no drafted token at {STANDSTILL_COLLECTIONS} collections in a row while it generates) and "no data" take over at
once.</p>
<table><tr>{head}</tr>
{body}
</table>
<p><a href="{e(telemetry_path)}">Metrics</a> · <a href="/api/v1/status">Status (JSON)</a> ·
<a href="/healthz">Health</a> · <a href="/readyz">Readiness</a></p>
<p><small>version {e(status['version'])}, up {status['uptime_seconds']:.0f}s,
{'ready' if status['ready'] else 'not ready: ' + e(status['ready_reason'])}</small></p>
</body></html>
"""


def requests_rows(target: dict[str, Any], page_threshold: float, uptime_seconds: float) -> str:
    """The request tap's part of a target: the per-request α distribution per model as bars (red below the page
    threshold), α per workload and temperature band, and what is missing and why; all counted since the sidecar
    started (the tap's counters in Prometheus give any other window)."""
    requests = target.get("requests")
    if requests is None:
        return ""
    e = html.escape
    charts = []
    for model, distribution in requests["models"].items():
        if distribution is None:
            continue
        counts = distribution["cumulative_counts"]
        per_bucket = [c - (counts[i - 1] if i else 0) for i, c in enumerate(counts)]
        total = max(1, distribution["requests"])
        bars = [(f"{bound:g}", n / total) for bound, n in zip(distribution["buckets"], per_bucket, strict=True)]
        colours = ["#cf222e" if bound <= page_threshold else "#1a7f37" for bound in distribution["buckets"]]
        charts.append(bar_chart(f"per-request α, {model}", bars, colours, Frame(width=360)) +
                      f"<p><small>{distribution['requests']} requests; P10 {_cell(distribution['p10'], '{:.2f}')}, "
                      f"{_cell(distribution['share_below_page_threshold'], '{:.0%}')} below {page_threshold:g}"
                      "</small></p>")
    bands = "".join(
        f"<tr><td>{e(b['model_name'])}</td><td>{e(b['workload'])}</td><td>{e(b['temperature'])}</td>"
        f"<td>{b['requests']}</td><td>{_cell(b['acceptance_ratio'], '{:.2f}')}</td></tr>" for b in requests["bands"])
    missing = ", ".join(f"{e(reason)} {count}" for reason, count in requests["without_spec_metrics"].items())
    hint = "".join(f"<p class='hint'>{e(note)}</p>" for note in (requests.get("withheld"), requests["hint"]) if note)
    table = ("<table><tr><th>model</th><th>workload</th><th>temperature</th><th>requests since start</th>"
             "<th>α since start</th></tr>"
             f"{bands}</table>") if bands else "<p>no tapped request with spec-decode metrics yet</p>"
    since = (f"counted since the sidecar started, {ago(uptime_seconds)} ago; for another window, rate() of "
             "specdecode_request_accepted_tokens_total / specdecode_request_draft_tokens_total in Prometheus")
    return (f"<tr class='charts'><td colspan={len(HEADER)}><b>Per request (the request tap)</b> "
            f"<small class='window'>{e(since)}</small>"
            f"<div>{''.join(charts)}</div>{table}{variance_table(requests)}"
            f"<p><small>without spec-decode metrics: {missing or 'none'}</small></p>{hint}</td></tr>")


def variance_table(requests: dict[str, Any]) -> str:
    """The page's variance per drafted token per model and window: measured or assumed, on how many requests."""
    rows = requests.get("variance") or []
    if not rows:
        return ""
    e = html.escape
    body = "".join(
        f"<tr><td>{e(r['model_name'])}</td><td>{e(r['window'])}</td>"
        f"<td>{_cell(r['variance_per_draft_token'], '{:.2f}')}</td><td>{e(r['source'])}</td>"
        f"<td>{r['requests']}</td><td>{_cell(r['estimate'], '{:.2f}')}</td></tr>" for r in rows)
    return ("<p><small>The page's variance per drafted token (v): "
            f"{e(requests.get('variance_method', ''))}</small></p>"
            "<table><tr><th>model</th><th>window</th><th>v</th><th>source</th><th>requests</th>"
            f"<th>estimate</th></tr>{body}</table>")


def _speedup(measured: dict[str, Any] | None) -> str:
    if measured is None:
        return "–"
    return (f"{_cell(measured['speedup'], '{:.2f}×')} <small>({_cell(measured['lower'], '{:.2f}')}–"
            f"{_cell(measured['upper'], '{:.2f}')})</small>")


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


# Each outcome's sentence: how its bound compares with the break-even (upper bound for an unrouted class's block,
# lower bound for a canary block), and whose α it is.
DECISION_WORDS = {"routed": ("&lt;", "α"), "stays on speculation": ("≥", "α"), "stays routed": ("≤", "canary α"),
                  "back on speculation": ("&gt;", "canary α")}


def decision_sentence(decision: dict[str, Any]) -> str:
    """One decision in its own words and with its own numbers."""
    compared, whose = DECISION_WORDS[decision["outcome"]]
    return (f"{decision['outcome']}: {whose} {_cell(decision['acceptance_ratio'], '{:.2f}')}, "
            f"{decision['bound_kind']} bound {_cell(decision['bound'], '{:.2f}')} {compared} break-even "
            f"{_cell(decision['break_even_acceptance_ratio'], '{:.2f}')} in force then, "
            f"{decision['requests']} requests")


def decisions(route: dict[str, Any]) -> str:
    """The decision that put the class in its state, then the latest block's, where that one left it as it was."""
    state, last = route.get("state_decision"), route["last_decision"]
    if last is None:
        return "–"
    if state is None or state == last:
        return decision_sentence(last)
    return f"{decision_sentence(state)}<br><small>latest: {decision_sentence(last)}</small>"


def _routing_row(route: dict[str, Any]) -> str:
    e = html.escape
    sent = {"speculative": 0, "fallback": 0}
    for item in route["requests"]:
        sent[item["upstream"]] += item["requests"]
    decision = decisions(route)
    state = (f"<b style='color:#cf222e'>routed</b> for {_duration(route['seconds_in_state'])}" if route["routed"]
             else "speculative")
    experiment = route["measured_speedup"] or route["last_episode_measured_speedup"]
    measured = "–" if experiment is None else (
        f"TPOT {_speedup(experiment['time_per_output_token'])}, end to end {_speedup(experiment['end_to_end'])}"
        f"<br><small>{experiment['speculative_requests']} canary / {experiment['fallback_requests']} fallback "
        f"requests{'' if route['measured_speedup'] else ', last time routed'}</small>")
    band = f" · {e(route['prompt_length'])} tokens" if "prompt_length" in route else ""
    return (f"<tr><td>{e(route['model_name'])}</td><td>{e(route['workload'])}</td>"
            f"<td>{e(route['temperature'])}{band}</td><td>{state}</td>"
            f"<td>{sent['speculative']} / {sent['fallback']}</td><td>{decision}</td><td>{measured}</td></tr>")


def routing_rows(target: dict[str, Any]) -> str:
    """Routing (the tap sends the classes spec decode slows down to a pool without it): each class's state, the
    evidence it was last judged on, and, while routed, its measured speedup (fallback / canary latency)."""
    routing = target.get("routing")
    if routing is None:
        return ""
    e = html.escape
    available = {True: "reachable", False: "unavailable (its requests go to the speculative pool)", None: "?"}
    rows = "".join(_routing_row(route) for route in routing["classes"])
    table = ("<table><tr><th>model</th><th>workload</th><th>temperature</th><th>state</th>"
             "<th>requests speculative / fallback</th><th>decisions</th>"
             "<th>measured speedup (95 % interval)</th></tr>" + rows + "</table>") if rows else (
        "<p>no routed request yet</p>")
    observe = (" In observe mode nothing is sent to the fallback: the counts say where enforce would have sent "
               "requests." if routing["mode"] == "observe" else "")
    return (f"<tr class='charts'><td colspan={len(HEADER)}><b>Routing</b> ({e(routing['mode'])}; fallback "
            f"{e(routing['fallback_upstream'])}, {available[routing['fallback_available']]})"
            f"<p><small>A class is routed when a block of {routing['min_requests']} of its requests shows α below "
            f"the break-even: its {1 - routing['statistics']['route_level']:.0%} one-sided upper bound (from a "
            f"request-level standard error) is below it. {routing['canary_share']:.0%} of it stays on speculative "
            f"decoding (the canary) and brings it back when a block's lower bound is above the break-even. The "
            f"break-even is the one in force when the block was judged (it moves as calibration does).{observe} "
            f"Only α decides routing: the measured speedups (fallback latency / canary latency, a randomized "
            f"split of the class's traffic) say what routing did and are not used to decide. TPOT is per output "
            f"token, what the break-even models; end to end adds queueing and prefill, so the two can point "
            f"opposite ways under load.</small></p>{table}</td></tr>")
