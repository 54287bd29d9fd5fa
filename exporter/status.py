"""The human views: /api/v1/status (JSON) and / (a small HTML page), from the same TargetViews."""

from __future__ import annotations

import html
import time
from typing import Any

from exporter.collection import SeriesView, TargetView
from exporter.config import Config
from exporter.derive import WindowStats


def verdict_stats(series: SeriesView) -> WindowStats | None:
    """The statistics of the window the series' verdict is for."""
    return next((stats for window, stats in series.windows if window.name == series.verdict_window), None)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def window_json(stats: WindowStats) -> dict[str, Any]:
    return {
        "acceptance_ratio": _round(stats.acceptance_ratio),
        "mean_acceptance_length": _round(stats.mean_acceptance_length),
        "position_acceptance_ratios": [_round(r) for r in stats.position_acceptance_ratios],
        "token_acceptance_probability": _round(stats.token_acceptance_probability),
        "draft_tokens_per_second": _round(stats.draft_tokens_per_second, 3),
        "accepted_tokens_per_second": _round(stats.accepted_tokens_per_second, 3),
        "expected_speedup": _round(stats.expected_speedup),
        "expected_speedup_by_length": [_round(s) for s in stats.speedup_by_length],
        "recommended_num_speculative_tokens": stats.recommended_num_speculative_tokens,
    }


def series_json(view: TargetView, series: SeriesView) -> dict[str, Any]:
    totals = series.totals
    return {
        "model_name": series.key.model_name,
        "engine": series.key.engine,
        "num_speculative_tokens": series.num_speculative_tokens,
        "break_even_acceptance_ratio": _round(view.config.cost.break_even_acceptance_ratio),
        "verdict": series.judgement.verdict.value,
        "verdict_basis": series.judgement.basis,
        "verdict_reason": series.judgement.reason,
        "verdict_window": series.verdict_window,
        "totals": {
            "drafts": totals.drafts,
            "draft_tokens": totals.draft_tokens,
            "accepted_tokens": totals.accepted_tokens,
            "emitted_tokens": totals.emitted_tokens,
            "accepted_tokens_by_position": list(totals.accepted_by_position),
        },
        "reported_by_engine": {spec.name: _round(value) for spec, value in series.reported},
        "restarts": series.restarts,
        "windows": {window.name: window_json(stats) for window, stats in series.windows},
    }


def status_json(views: list[TargetView], ready: tuple[bool, str], version: str, uptime: float,
                config: Config) -> dict[str, Any]:
    bands = config.verdict
    return {
        "version": version,
        "uptime_seconds": round(uptime, 1),
        "ready": ready[0],
        "ready_reason": ready[1],
        "page_threshold": bands.page_acceptance_ratio,
        "verdict_bands": {"hurting_below": bands.hurting_below, "paying_off_from": bands.paying_off_from,
                          "page_acceptance_ratio": bands.page_acceptance_ratio, "window": config.verdict_window},
        "targets": [
            {
                "name": view.config.name,
                "url": view.config.url,
                "up": view.up,
                "api": view.api,
                "method": view.method,
                "interval_seconds": view.interval,
                "collect_duration_seconds": _round(view.collect_duration, 6),
                "last_success": None if view.last_success_wall is None
                else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(view.last_success_wall)),
                "last_error": view.last_error,
                "errors": dict(view.errors),
                "dropped_series": view.dropped_series,
                "cost_model": {"c_draft": view.config.cost.c_draft, "c_verify": view.config.cost.c_verify},
                "series": [series_json(view, s) for s in view.series],
            }
            for view in views
        ],
    }


_VERDICT_COLOURS = {"paying off": "#1a7f37", "marginal": "#9a6700", "hurting": "#cf222e", "no traffic": "#57606a"}


def _cell(value: float | int | None, fmt: str = "{:.3f}") -> str:
    return "–" if value is None else html.escape(fmt.format(value))


def status_html(status: dict[str, Any], telemetry_path: str) -> str:
    e = html.escape
    rows: list[str] = []
    for target in status["targets"]:
        state = "up" if target["up"] else f"down ({e(target['last_error'] or '')})"
        if not target["series"]:
            rows.append(f"<tr><td>{e(target['name'])}</td><td colspan=8>{state}</td></tr>")
        for series in target["series"]:
            windows = series["windows"]
            window = windows.get(series["verdict_window"] or "", {})
            alphas = " · ".join(f"{e(name)} {_cell(w['acceptance_ratio'], '{:.2f}')}" for name, w in windows.items())
            colour = _VERDICT_COLOURS.get(series["verdict"], "#57606a")
            rows.append(
                "<tr>"
                f"<td>{e(target['name'])}<br><small>{state}, {e(target['api'] or '?')}</small></td>"
                f"<td>{e(series['model_name'] or '')}</td><td>{e(series['engine'] or '')}</td>"
                f"<td>{alphas or 'no traffic'}</td>"
                f"<td>{_cell(window.get('mean_acceptance_length'), '{:.2f}')}</td>"
                f"<td>{_cell(window.get('expected_speedup'), '{:.2f}×')}</td>"
                f"<td>{_cell(series['break_even_acceptance_ratio'], '{:.2f}')}</td>"
                f"<td>{_cell(window.get('recommended_num_speculative_tokens'), '{}')} "
                f"/ {_cell(series['num_speculative_tokens'], '{}')}</td>"
                f"<td style='color:{colour};font-weight:bold'>{e(series['verdict'])}"
                f"<br><small>{e(series['verdict_reason'])}</small></td>"
                "</tr>"
            )
    body = "\n".join(rows) or "<tr><td colspan=9>no targets configured</td></tr>"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>specdecode-exporter</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #d0d7de;padding:.4em .7em;text-align:left;vertical-align:top}}th{{background:#f6f8fa}}</style>
</head><body>
<h1>specdecode-exporter</h1>
<p>Is speculative decoding paying off? α = accepted / drafted tokens; below the break-even α it costs more than
it saves. Verdict over the {e(status['verdict_bands']['window'])} window: hurting below
{status['verdict_bands']['hurting_below']:g}× speedup, paying off from {status['verdict_bands']['paying_off_from']:g}×
with α not below the page threshold {status['page_threshold']:g}, marginal between.</p>
<table><tr><th>target</th><th>model</th><th>engine</th><th>α by window</th><th>mean acceptance length</th>
<th>expected speedup</th><th>break-even α</th><th>recommended / current k</th><th>verdict</th></tr>
{body}
</table>
<p><a href="{e(telemetry_path)}">Metrics</a> · <a href="/api/v1/status">Status (JSON)</a> ·
<a href="/healthz">Health</a> · <a href="/readyz">Readiness</a></p>
<p><small>version {e(status['version'])}, up {status['uptime_seconds']:.0f}s,
{'ready' if status['ready'] else 'not ready: ' + e(status['ready_reason'])}</small></p>
</body></html>
"""
