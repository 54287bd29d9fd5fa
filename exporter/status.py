"""/api/v1/status: the sidecar's state as JSON, from the latest TargetViews (the HTML page renders the same)."""

from __future__ import annotations

import time
from typing import Any

from exporter.collection import HistoryPoint, TargetView
from exporter.config import Config
from exporter.derive import WindowStats
from exporter.latency import LatencyStats, ObservedSpeedup
from exporter.series import SeriesView, WindowView


def verdict_stats(series: SeriesView) -> WindowStats | None:
    """The acceptance statistics of the window the series' verdict is for."""
    view = series.window(series.verdict_window)
    return view.acceptance if view is not None else None


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def acceptance_json(stats: WindowStats) -> dict[str, Any]:
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


def latency_json(stats: LatencyStats) -> dict[str, Any]:
    return {
        "time_per_output_token_seconds": {"mean": _round(stats.tpot_mean, 6), "p50": _round(stats.tpot(0.5), 6),
                                          "p90": _round(stats.tpot(0.9), 6), "p99": _round(stats.tpot(0.99), 6)},
        "time_to_first_token_seconds": {"p50": _round(stats.ttft(0.5), 6), "p99": _round(stats.ttft(0.99), 6)},
        "requests": stats.requests,
        "requests_running": _round(stats.running, 2),
        "requests_waiting": _round(stats.waiting, 2),
    }


def observed_json(observed: ObservedSpeedup) -> dict[str, Any]:
    return {"mean": _round(observed.mean), "p50": _round(observed.p50), "p99": _round(observed.p99),
            "baseline": observed.baseline}


def window_json(view: WindowView) -> dict[str, Any]:
    out: dict[str, Any] = acceptance_json(view.acceptance) if view.acceptance is not None else {}
    if view.acceptance is not None:
        out["recommended_num_speculative_tokens"] = view.recommended_k
    if view.latency is not None:
        out["latency"] = latency_json(view.latency)
    if view.observed is not None:
        out["observed_speedup"] = observed_json(view.observed)
    out["calibrated_cost_per_draft_token"] = _round(view.calibrated_cost)
    out["break_even_acceptance_ratio_at_load"] = _round(view.cost_at_load)
    return out


def history_json(points: tuple[HistoryPoint, ...], now: float) -> list[dict[str, Any]]:
    return [{"seconds_ago": round(now - p.at, 1), "acceptance_ratio": _round(p.acceptance_ratio),
             "tpot_mean_seconds": _round(p.tpot_mean, 6), "observed_speedup": _round(p.observed_speedup)}
            for p in points]


def series_json(view: TargetView, series: SeriesView, now: float) -> dict[str, Any]:
    totals = series.totals
    return {
        "model_name": series.key.model_name,
        "engine": series.key.engine,
        "num_speculative_tokens": series.num_speculative_tokens,
        "spec_decode": series.spec_decode,
        "break_even_acceptance_ratio": _round(series.break_even),
        "cost_basis": series.cost_basis,
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
        "windows": {view.window.name: window_json(view) for view in series.windows},
        "history": history_json(view.history.get(series.key, ()), now),
    }


def baseline_json(view: TargetView) -> dict[str, Any] | None:
    baseline = view.config.baseline
    if baseline is None:
        return None
    if baseline.target is not None:
        return {"target": baseline.target}
    return {"time_per_output_token_seconds": baseline.time_per_output_token_seconds, "p50": baseline.p50,
            "p99": baseline.p99}


def status_json(views: list[TargetView], ready: tuple[bool, str], version: str, uptime: float,
                config: Config, now: float) -> dict[str, Any]:
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
                "spec_decode": view.config.spec_decode,
                "baseline": baseline_json(view),
                "cost_model": {"c_draft": view.config.cost.c_draft, "c_verify": view.config.cost.c_verify,
                               "c_verify_max": view.config.cost.c_verify_max,
                               "saturating_batch": view.config.cost.saturating_batch},
                "series": [series_json(view, s, now) for s in view.series],
            }
            for view in views
        ],
    }
