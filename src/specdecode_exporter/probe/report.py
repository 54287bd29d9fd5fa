"""The probe's output: a table (stdout), JSON (a list of rows), CSV, and a plot of α and the observed speedup
against temperature — PNG with matplotlib (the optional `plot` extra) or one self-contained HTML file (inline
SVG from src/specdecode_exporter/core/svg/charts.py, no JavaScript, no external assets)."""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from specdecode_exporter.core.svg.charts import PALETTE, Axis, Frame, Rule, Series, fit, line_chart
from specdecode_exporter.probe.measure import (
    CLIENT_TIMINGS,
    COUNTERS,
    COUNTERS_SHARED,
    PER_REQUEST,
    SERVER_TIMINGS,
    Row,
)
from specdecode_exporter.probe.run import EXACT_FLAGS, Outcome, Plan

PLOT_FORMATS = (".png", ".html", ".htm")
MATPLOTLIB_MISSING = "--plot {path}: a PNG needs matplotlib: pip install 'specdecode-exporter[plot]' (or write .html)"
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Row))


class PlotError(ValueError):
    """A --plot path the probe cannot write: one line."""


def check_plot_path(path: str) -> None:
    """Before measuring: the format is known and, for PNG, matplotlib is installed."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise PlotError(f"--plot {path}: expected a .png or .html file name")
    if suffix == ".png":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PlotError(MATPLOTLIB_MISSING.format(path=path)) from None


def _num(value: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "–" if value is None else format(value, spec) + suffix


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f} ms"


def _positions(values: Sequence[float] | None) -> str:
    return "–" if not values else " ".join(f"{v:.2f}" for v in values)


def table_cells(row: Row, baseline: bool) -> list[str]:
    cells = [f"{row.temperature:g}", row.group, str(row.requests), _num(row.acceptance_ratio),
             _num(row.mean_acceptance_length, ".2f"), _positions(row.position_acceptance_ratios),
             _ms(row.tpot_p50_seconds), _ms(row.tpot_p99_seconds), _num(row.tokens_per_second, ".1f")]
    if baseline:
        cells += [_num(row.speedup_p50, ".2f", "×"), _num(row.speedup_p99, ".2f", "×")]
    return [*cells, row.verdict, row.source]


def table_header(baseline: bool) -> list[str]:
    head = ["T", "group", "requests", "α", "mean len", "accepted by position", "TPOT p50", "TPOT p99", "tok/s"]
    return [*head, *(["speedup p50", "speedup p99"] if baseline else []), "verdict", "source"]


def describe(plan: Plan, outcome: Outcome) -> list[str]:
    """The lines above the table: what was probed and how each figure was measured."""
    lines = [f"server    {plan.url}" + (f"  (model {outcome.model})" if outcome.model else "")]
    if plan.baseline_url:
        lines.append(f"baseline  {plan.baseline_url}  (the same prompts, temperatures, max_tokens and seeds)")
    if outcome.source == PER_REQUEST:
        lines.append("α         exact: each response's own metrics.speculative_decoding, summed per row")
    elif outcome.source == COUNTERS:
        lines.append("α         from /metrics counter deltas around each row, its requests alone on the server")
    tpot = {row.tpot_source for row in outcome.rows}
    if tpot == {SERVER_TIMINGS}:
        lines.append("TPOT      vLLM's per-request timings: metrics.generation_time_ms / (completion tokens − 1)")
    elif CLIENT_TIMINGS in tpot:
        lines.append("TPOT      measured by the client on the stream: (last − first token) / (completion tokens − 1)")
    return lines


def notes(plan: Plan, outcome: Outcome) -> list[str]:
    """The lines under the table: the bands, and what would make the numbers better."""
    bands = plan.bands
    out = [f"verdict: α < {bands.page_acceptance_ratio:g}: disable; α < {bands.measure_below:g}: measure P99 under "
           f"real load; else ship" + (f"; median speedup < {bands.ship_speedup:g}×: do not ship"
                                      if plan.baseline_url else "")
           + " (monitoring config: thresholds.page_acceptance_ratio, probe.measure_below"
           + (", probe.ship_speedup)" if plan.baseline_url else ")")]
    if outcome.source == COUNTERS:
        out.append(f"for exact per-request α start vLLM with {EXACT_FLAGS} "
                   "(and --enable-per-request-metrics for its own TPOT)")
    if any(row.tpot_source == CLIENT_TIMINGS for row in outcome.rows):
        out.append("for server-side TPOT start vLLM with --enable-per-request-metrics")
    for row in outcome.rows:
        if row.source == COUNTERS_SHARED:
            out.append(f"T={row.temperature:g} {row.group}: shared: {'; '.join(row.notes)}")
    failed = sum(row.failed_requests for row in outcome.rows)
    if failed:
        out.append(f"{failed} requests failed (timeouts or server errors) and are not in the numbers")
    refused = [url for url, took in outcome.seeds.items() if not took]
    if refused:
        out.append(f"{', '.join(refused)} did not take `seed`: outputs may differ between the servers")
    return out


def render_table(plan: Plan, outcome: Outcome) -> str:
    baseline = plan.baseline_url is not None
    grid = [table_header(baseline), *(table_cells(row, baseline) for row in outcome.rows)]
    widths = [max(len(line[i]) for line in grid) for i in range(len(grid[0]))]
    lines = [*describe(plan, outcome), ""]
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in grid]
    if not outcome.rows:
        lines.append("(no row finished)")
    return "\n".join([*lines, "", *notes(plan, outcome)]) + "\n"


def render_json(rows: Sequence[Row]) -> str:
    return json.dumps([row.as_dict() for row in rows], indent=2, ensure_ascii=False) + "\n"


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value)
    return value


def render_csv(rows: Sequence[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        data = row.as_dict()
        writer.writerow([_csv_value(data[name]) for name in COLUMNS])
    return out.getvalue()


def _by_group(rows: Sequence[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for row in sorted(rows, key=lambda r: r.temperature):
        groups.setdefault(row.group, []).append(row)
    return groups


def _temperature_axis(rows: Sequence[Row]) -> Axis:
    temperatures = sorted({row.temperature for row in rows}) or [0.0]
    low, high = temperatures[0], temperatures[-1]
    if high == low:
        low, high = low - 0.5, high + 0.5
    return Axis(low, high, "{:g}", tuple(temperatures))


def svg_charts(plan: Plan, rows: Sequence[Row]) -> list[str]:
    """α against temperature and, with a baseline, the observed speedup (P50 solid, P99 dashed)."""
    frame = Frame(width=560, height=260, left=48, bottom=22, top=20, right=12)
    x = _temperature_axis(rows)
    groups = _by_group(rows)
    colour = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(groups)}
    bands = plan.bands
    alpha = [Series(name, [(r.temperature, r.acceptance_ratio) for r in rs if r.acceptance_ratio is not None],
                    colour[name]) for name, rs in groups.items()]
    alpha_chart = line_chart("α (accepted / drafted) by temperature", alpha, x,
                             Axis(0.0, 1.0, "{:.2f}", (0.0, bands.page_acceptance_ratio, bands.measure_below, 1.0)),
                             [Rule(bands.page_acceptance_ratio, f"disable below {bands.page_acceptance_ratio:g}"),
                              Rule(bands.measure_below, f"ship from {bands.measure_below:g}", "#1a7f37")], frame)
    speedups: list[Series] = []
    for name, rs in groups.items():
        speedups.append(Series(f"{name} P50", [(r.temperature, r.speedup_p50) for r in rs
                                               if r.speedup_p50 is not None], colour[name]))
        speedups.append(Series(f"{name} P99", [(r.temperature, r.speedup_p99) for r in rs
                                               if r.speedup_p99 is not None], colour[name], dashed=True))
    values = [y for s in speedups for _, y in s.points]
    low, high = fit(values, floor=0.0, include=(1.0, bands.ship_speedup))
    rules = [Rule(1.0, "1×", "#57606a"), Rule(bands.ship_speedup, f"ship from {bands.ship_speedup:g}×", "#1a7f37")]
    speedup_chart = line_chart("observed speedup (baseline TPOT / TPOT): P50 solid, P99 dashed", speedups, x,
                               Axis(low, high, "{:.2f}×", (low, 1.0, bands.ship_speedup, high)), rules, frame,
                               empty="no baseline: pass --baseline-url")
    return [alpha_chart, speedup_chart]


def render_html(plan: Plan, outcome: Outcome) -> str:
    esc = html.escape
    baseline = plan.baseline_url is not None
    groups = _by_group(outcome.rows)
    legend = " ".join(f'<span style="color:{PALETTE[i % len(PALETTE)]}">■ {esc(name)}</span>'
                      for i, name in enumerate(groups))
    head = "".join(f"<th>{esc(cell)}</th>" for cell in table_header(baseline))
    body = "".join("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in table_cells(row, baseline)) + "</tr>"
                   for row in outcome.rows)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>specdecode-exporter probe: {esc(plan.url)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:1.5em;color:#1f2328}table{border-collapse:collapse;"
        "font-size:13px}td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}th{background:#f6f8fa}"
        "pre{font-size:13px}</style></head><body>",
        f"<h1>specdecode-exporter probe: {esc(outcome.model or '')}</h1>",
        f"<pre>{esc(chr(10).join(describe(plan, outcome)))}</pre>",
        f"<p>{legend}</p>", *svg_charts(plan, outcome.rows),
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
        "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in notes(plan, outcome)) + "</ul>",
        "</body></html>", ""])


def render_png(plan: Plan, outcome: Outcome, path: Path) -> None:
    from matplotlib.figure import Figure  # the optional `plot` extra; checked before measuring

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    alpha_axes, speedup_axes = figure.subplots(1, 2)
    bands = plan.bands
    for i, (name, rows) in enumerate(_by_group(outcome.rows).items()):
        colour = PALETTE[i % len(PALETTE)]
        points = [(r.temperature, r.acceptance_ratio) for r in rows if r.acceptance_ratio is not None]
        alpha_axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colour, label=name)
        for field_name, style in (("speedup_p50", "-"), ("speedup_p99", "--")):
            sp = [(r.temperature, getattr(r, field_name)) for r in rows if getattr(r, field_name) is not None]
            if sp:
                speedup_axes.plot([p[0] for p in sp], [p[1] for p in sp], style, marker="o", color=colour,
                                  label=f"{name} {field_name[-3:].upper()}")
    alpha_axes.axhline(bands.page_acceptance_ratio, color="#cf222e", linestyle=":", label="disable below")
    alpha_axes.axhline(bands.measure_below, color="#1a7f37", linestyle=":", label="ship from")
    alpha_axes.set(title="α (accepted / drafted)", xlabel="temperature", ylabel="α", ylim=(0, 1))
    speedup_axes.axhline(1.0, color="#57606a", linestyle=":")
    speedup_axes.axhline(bands.ship_speedup, color="#1a7f37", linestyle=":", label="ship from")
    speedup_axes.set(title="observed speedup (baseline TPOT / TPOT)", xlabel="temperature", ylabel="speedup ×")
    if not plan.baseline_url:
        speedup_axes.text(0.5, 0.5, "no baseline: pass --baseline-url", ha="center", transform=speedup_axes.transAxes)
    for axes in (alpha_axes, speedup_axes):
        axes.legend(fontsize="small")
    figure.suptitle(f"specdecode-exporter probe: {plan.url} ({outcome.model or ''})")
    figure.savefig(path, format="png", dpi=110)


def write_plot(path: str, plan: Plan, outcome: Outcome) -> None:
    """Write the plot; PlotError when the file cannot be written."""
    target = Path(path)
    try:
        if target.suffix.lower() == ".png":
            render_png(plan, outcome, target)
        else:
            target.write_text(render_html(plan, outcome), encoding="utf-8")
    except OSError as exc:
        raise PlotError(f"--plot {path}: cannot write: {exc.strerror or exc}") from None
