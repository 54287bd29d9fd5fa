"""/api/v1/status: the sidecar's state as JSON, from the latest TargetViews (the HTML page renders the same)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from specdecode_exporter.core.stats.dispersion import WindowVariance
from specdecode_exporter.pipeline import latency, ratio_test
from specdecode_exporter.pipeline.capacity import AgainstControl, CapacityStats
from specdecode_exporter.pipeline.derive import WindowStats
from specdecode_exporter.pipeline.engines import NOT_APPLICABLE
from specdecode_exporter.pipeline.engines.vllm_v1 import ADAPTIVE_VERIFICATION_WHY, VERIFICATION_NOTES
from specdecode_exporter.pipeline.latency import LatencyStats, MeasuredSpeedup, ObservedSpeedup
from specdecode_exporter.pipeline.schedule import (
    BatchSchedule,
    schedule_summary,
    trtllm_draft_len_schedule,
    vllm_speculative_config,
)
from specdecode_exporter.sidecar.collection import WINDOW_GRACE_FAILURES, HistoryPoint, TargetView
from specdecode_exporter.sidecar.config import Config
from specdecode_exporter.sidecar.series import WALL_CLOCK_LEAD, SeriesView, Speculation, WindowView
from specdecode_exporter.tap.model import SPEC_DETAILS_NOT_REQUESTED
from specdecode_exporter.tap.request_stats import RequestsView
from specdecode_exporter.tap.route import ClassView, Decision, Experiment, RoutesView


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
        "mean_draft_length": _round(stats.mean_draft_length),
        "position_acceptance_ratios": [_round(r) for r in stats.position_acceptance_ratios],
        "position_acceptance_unproven": stats.unproven,
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
    elif (lower_bound := view.proposed_token_acceptance_ratio) is not None:
        out["proposed_token_acceptance_ratio"] = _round(lower_bound)
    if view.latency is not None:
        out["latency"] = latency_json(view.latency)
    if view.observed is not None:
        out["observed_speedup"] = observed_json(view.observed)
    out["calibrated_cost_per_draft_token"] = _round(view.calibrated_cost)
    out["break_even_acceptance_ratio_at_load"] = _round(view.break_even_at_load)
    if view.capacity is not None:
        out["capacity"] = capacity_json(view.capacity)
    if view.against_control is not None:
        out["against_control"] = against_control_json(view.against_control)
    return out


def capacity_json(stats: CapacityStats) -> dict[str, Any]:
    return {"speculative_token_share": _round(stats.speculative_token_share),
            "generated_tokens_per_second": _round(stats.generated_tokens_per_second, 3),
            "preemptions_per_request": _round(stats.preemptions_per_request),
            "kv_cache_usage": _round(stats.kv_cache_usage), "requests_waiting": _round(stats.requests_waiting, 2),
            "scheduled_steps_by_k": [round(n, 1) for n in stats.scheduled_steps]}


def against_control_json(versus: AgainstControl) -> dict[str, Any]:
    return {"control": versus.control,
            "preemptions_per_request_increase": _round(versus.preemptions_per_request_increase),
            "throughput_ratio": _round(versus.throughput_ratio),
            "kv_cache_usage": _round(versus.kv_cache_usage),
            "control_kv_cache_usage": _round(versus.control_kv_cache_usage)}


def iso_time(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


class Clock:
    """The collector's clock at a request (``now``), and how to say one of its times on the wall clock."""

    def __init__(self, now: float) -> None:
        self.now, self._lead = now, WALL_CLOCK_LEAD

    def iso(self, at: float | None) -> str | None:
        return None if at is None else iso_time(at + self._lead)

    def seconds_ago(self, at: float | None) -> float | None:
        return None if at is None else round(self.now - at, 1)


def speculation_json(speculation: Speculation | None, clock: Clock) -> dict[str, Any] | None:
    """Stopped: since the last collection that counted drafted tokens; speculating: since it resumed, where it
    stopped within the window."""
    if speculation is None:
        return None
    return {"state": speculation.state, "window": speculation.window, "share": _round(speculation.share),
            "reason": speculation.reason, "since": clock.iso(speculation.since),
            "seconds": clock.seconds_ago(speculation.since), "configured": speculation.configured}


def verdict_json(series: SeriesView, clock: Clock) -> dict[str, Any]:
    """The verdict in force, since when, and the different one waiting out the hysteresis."""
    judgement, held = series.judgement, series.held
    return {
        "verdict": judgement.verdict.value,
        "verdict_basis": judgement.basis,
        "verdict_reason": judgement.reason,
        "verdict_window": series.verdict_window,
        "verdict_since": clock.iso(held.since) if held else None,
        "verdict_seconds": clock.seconds_ago(held.since) if held else None,
        "verdict_pending": None if held is None or held.pending is None else {
            "verdict": held.pending.value, "since": clock.iso(held.pending_since),
            "seconds": clock.seconds_ago(held.pending_since)},
    }


def schedule_json(schedule: BatchSchedule | None, window: str | None, method: str | None) -> dict[str, Any] | None:
    """The batch-size advice, its evidence per range, and the two ready-to-paste forms."""
    if schedule is None:
        return None
    return {
        "window": window, "num_speculative_tokens": schedule.num_speculative_tokens,
        "cost_basis": schedule.cost_basis, "expected_gain": _round(schedule.expected_gain),
        "summary": schedule_summary(schedule),
        "ranges": [{"batch_size": r.label, "recommended_num_speculative_tokens": r.recommended,
                    "expected_speedup_fixed": _round(r.speedup_fixed),
                    "expected_speedup_recommended": _round(r.speedup_recommended),
                    "batch": _round(r.batch, 1), "cost_per_draft_token": _round(r.cost_per_draft_token),
                    "observed_seconds": round(r.observed_seconds, 1), "own_acceptance": r.own_acceptance}
                   for r in schedule.ranges],
        "vllm": vllm_speculative_config(schedule, method), "trtllm": trtllm_draft_len_schedule(schedule),
    }


def history_json(points: tuple[HistoryPoint, ...], now: float) -> list[dict[str, Any]]:
    return [{"seconds_ago": round(now - p.at, 1), "acceptance_ratio": _round(p.acceptance_ratio),
             "tpot_mean_seconds": _round(p.tpot_mean, 6), "observed_speedup": _round(p.observed_speedup),
             "expected_speedup": _round(p.expected_speedup)}
            for p in points]


def series_json(view: TargetView, series: SeriesView, now: float) -> dict[str, Any]:
    totals, clock = series.totals, Clock(now)
    return {
        "model_name": series.key.model_name,
        "engine": series.key.engine,
        "num_speculative_tokens": series.num_speculative_tokens,
        "spec_decode": series.spec_decode,
        "break_even_acceptance_ratio": _round(series.break_even),
        "cost_basis": series.cost_basis,
        "cost_basis_words": series.cost_basis_words,
        **verdict_json(series, clock),
        "totals": {
            "drafts": totals.drafts,
            "draft_tokens": totals.draft_tokens,
            "accepted_tokens": totals.accepted_tokens,
            "emitted_tokens": totals.emitted_tokens,
            "accepted_tokens_by_position": list(totals.accepted_by_position),
            "generated_tokens": totals.generated_tokens,
            "preemptions": totals.preemptions,
            "scheduled_steps_by_k": list(totals.scheduled_steps),
        },
        "kv_cache_usage": _round(series.kv_cache_usage),
        "speculation": speculation_json(series.speculation, clock),
        "schedule": schedule_json(series.schedule, series.schedule_window, series.method or view.method),
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


def withheld(view: TargetView) -> str | None:
    """Why α and what builds on it are withheld: a vLLM target declared with adaptive verification none of whose
    series counts verified draft tokens (their drafted-token count is withheld, pipeline/engines/base.py)."""
    if not (view.config.adaptive_verification and view.api == "vllm-v1"):
        return None
    counted = any(series.totals.draft_tokens is not None for series in view.series if series.spec_decode)
    return None if counted else ADAPTIVE_VERIFICATION_WHY


def status_json(views: list[TargetView], ready: tuple[bool, str], version: str, uptime: float,
                config: Config, now: float, requests: RequestsView | None = None,
                routes: RoutesView | None = None, fallback_available: bool | None = None,
                variances: Sequence[WindowVariance] = ()) -> dict[str, Any]:
    bands = config.verdict
    tapped = config.tap.target if config.tap is not None else None
    return {
        "version": version,
        "uptime_seconds": round(uptime, 1),
        "ready": ready[0],
        "ready_reason": ready[1],
        "page_threshold": bands.page_acceptance_ratio,
        "windows": [window.name for window in config.windows],
        "verdict_bands": {"hurting_below": bands.hurting_below, "paying_off_from": bands.paying_off_from,
                          "page_acceptance_ratio": bands.page_acceptance_ratio, "window": config.verdict_window,
                          "cost_vs_control": dataclasses.asdict(bands.capacity),
                          "hold_seconds": bands.hold_seconds, "margin": bands.margin},
        "speculation_stopped": dataclasses.asdict(config.speculation_stopped),
        "targets": [
            {
                "name": view.config.name,
                "url": view.config.url,
                "up": view.up,
                "api": view.api,
                "not_applicable": NOT_APPLICABLE.get(view.api or ""),
                "withheld": withheld(view),
                "verification": VERIFICATION_NOTES.get(view.config.rejection_sample_method or "")
                if view.api == "vllm-v1" else None,
                "method": view.method,
                "interval_seconds": view.interval,
                "collect_duration_seconds": _round(view.collect_duration, 6),
                "last_success": None if view.last_success_wall is None else iso_time(view.last_success_wall),
                "last_error": view.last_error,
                "failed_in_a_row": view.failed_in_a_row,
                "windows_stale": view.windows_stale,
                "no_data_since": iso_time(view.last_success_wall) if view.windows_stale and view.last_success_wall
                else None,
                "windows_grace_failed_collections": WINDOW_GRACE_FAILURES,
                "errors": dict(view.errors),
                "dropped_series": view.dropped_series,
                "spec_decode": view.config.spec_decode,
                "baseline": baseline_json(view),
                "cost_model": {"c_draft": view.config.cost.c_draft, "c_verify": view.config.cost.c_verify,
                               "c_verify_max": view.config.cost.c_verify_max,
                               "saturating_batch": view.config.cost.saturating_batch},
                "series": [series_json(view, s, now) for s in view.series],
                "requests": requests_json(requests, bands.page_acceptance_ratio, uptime, variances)
                if requests is not None and view.config.name == tapped else None,
                "routing": routes_json(routes, fallback_available)
                if routes is not None and view.config.name == tapped else None,
            }
            for view in views
        ],
    }


NOT_ENABLED_HINT = ("vLLM returns no per-request spec-decode metrics: start it with --per-request-spec-decode-metrics "
                    "summary (and --enable-per-request-metrics for timings); streams need the tap's usage request, "
                    "which it adds itself")
SPEC_DETAILS_HINT = ("SGLang returns its per-request spec-decode details only to a request that sets "
                     "\"return_spec_tokens_details\": true (SGLang #33518; the tap does not add it for the client)")
REASON_HINTS = (("not_enabled", NOT_ENABLED_HINT), (SPEC_DETAILS_NOT_REQUESTED, SPEC_DETAILS_HINT))


def _distribution_json(histogram: latency.Histogram | None, page: float) -> dict[str, Any] | None:
    if histogram is None or not histogram.observations:
        return None
    below = [i for i, bound in enumerate(histogram.bounds) if bound <= page]
    return {"requests": int(histogram.observations), "p10": _round(latency.quantile(0.1, histogram)),
            "p50": _round(latency.quantile(0.5, histogram)),
            "share_below_page_threshold": _round(histogram.counts[below[-1]] / histogram.observations) if below
            else 0.0,
            "buckets": list(histogram.bounds[:-1]), "cumulative_counts": list(histogram.counts[:-1])}


VARIANCE_METHOD = ("variance of α per drafted token the page's test divides by: measured, the upper 95 % bound of "
                   "(ΣA² − 2α̂ΣAD + α̂²ΣD²)/ΣD over the window's tapped requests, never below α̂(1 − α̂), once the "
                   "window holds statistics.min_requests requests; else assumed, the monitoring config's "
                   "k̄(¼ − s²) + m·s²")


def variance_json(variances: Sequence[WindowVariance]) -> list[dict[str, Any]]:
    """The page's v per model and window: its value, measured or assumed, on how many requests."""
    return [{"model_name": row.model, "window": row.window, "variance_per_draft_token": _round(row.variance.value),
             "source": row.variance.source, "requests": int(row.variance.requests),
             "estimate": _round(row.variance.estimate) if row.variance.estimate is not None else None}
            for row in variances]


def requests_json(view: RequestsView, page_threshold: float, uptime: float,
                  variances: Sequence[WindowVariance] = ()) -> dict[str, Any]:
    """The request tap: α per model, workload and temperature band, the per-request distribution per model; all
    counted since the sidecar started, ``uptime`` seconds ago; the page's variance per model and window."""
    bands = [{"model_name": key.model_name, "workload": key.workload, "temperature": key.temperature,
              "requests": totals.requests,
              "acceptance_ratio": _round(totals.accepted_tokens / totals.draft_tokens) if totals.draft_tokens
              else None,
              "distribution": _distribution_json(totals.acceptance, page_threshold)}
             for key, totals in sorted(view.bands.items())]
    models = sorted({key.model_name for key in view.bands})
    reasons: dict[str, int] = {}
    for (_, reason), count in view.without_metrics.items():
        reasons[reason] = reasons.get(reason, 0) + count
    return {
        "counted_since_start_seconds": round(uptime, 1),
        "bands": bands,
        "models": {model: _distribution_json(latency.pooled([t.acceptance for k, t in view.bands.items()
                                                       if k.model_name == model]), page_threshold)
                   for model in models},
        "without_spec_metrics": reasons,
        "hint": " ".join(hint for reason, hint in REASON_HINTS if reasons.get(reason)) or None,
        "withheld": view.withheld,
        "variance": variance_json(variances),
        "variance_method": VARIANCE_METHOD,
    }


ROUTING_METHOD = ("per class, blocks of min_requests requests served with speculative decoding; α = Σ accepted / Σ "
                  "drafted with a request-level (overdispersion-robust) standard error; routed when the one-sided "
                  "upper bound is below the break-even, back when the canary's lower bound is above it")


def _speedup_json(measured: MeasuredSpeedup | None) -> dict[str, Any] | None:
    if measured is None:
        return None
    return {"speedup": _round(measured.speedup), "lower": _round(measured.lower), "upper": _round(measured.upper)}


def experiment_json(experiment: Experiment | None) -> dict[str, Any] | None:
    """A routed class's randomized split: fallback latency / canary latency, with 95 % intervals."""
    if experiment is None:
        return None
    return {"speculative_requests": experiment.speculative_requests,
            "fallback_requests": experiment.fallback_requests,
            "time_per_output_token": _speedup_json(experiment.time_per_output_token),
            "time_per_output_token_basis": experiment.tpot_basis,
            "end_to_end": _speedup_json(experiment.end_to_end)}


# What a decision did, by the state it judged and the state it left: (was routed, routed) → words.
OUTCOMES = {(False, True): "routed", (False, False): "stays on speculation", (True, True): "stays routed",
            (True, False): "back on speculation"}


def decision_json(decision: Decision | None) -> dict[str, Any] | None:
    """One decision with its own numbers: its α, the bound its test compared (upper for an unrouted class's block,
    lower for a canary block) and the break-even in force when it was made."""
    if decision is None:
        return None
    return {"outcome": OUTCOMES[decision.was_routed, decision.routed],
            "acceptance_ratio": _round(decision.estimate.ratio),
            "bound": _round(decision.bound), "bound_kind": "lower" if decision.was_routed else "upper",
            "break_even_acceptance_ratio": _round(decision.break_even), "requests": decision.estimate.n,
            "routed": decision.routed}


def class_json(route: ClassView) -> dict[str, Any]:
    """A class: its state and how long it has been in it, the decision that put it there (``state_decision``: the
    class has been in that state since it), the latest one (``last_decision``: the same, or a later block that left
    the class as it was), each with its own numbers, and the randomized split's measured speedup."""
    block = route.block
    return {
        **route.key.labels(),
        "routed": route.routed,
        "seconds_in_state": round(route.seconds_in_state, 1),
        "times_routed": route.episodes,
        "requests": [{"upstream": upstream, "reason": reason, "requests": count}
                     for (upstream, reason), count in route.counts],
        "evidence": {"requests": route.block_requests,
                     "acceptance_ratio": _round(block.ratio) if block else None,
                     "standard_error": _round(block.standard_error) if block else None},
        "last_decision": decision_json(route.last),
        "state_decision": decision_json(route.changed_by),
        "measured_speedup": experiment_json(route.experiment),
        "last_episode_measured_speedup": experiment_json(route.last_experiment),
    }


def routes_json(view: RoutesView, fallback_available: bool | None) -> dict[str, Any]:
    """Routing: its settings, its statistics, and each class's state, evidence and measured speedup."""
    settings = view.settings
    return {
        "mode": settings.mode,
        "fallback_upstream": settings.fallback_upstream,
        "fallback_available": fallback_available,
        "min_requests": settings.min_requests,
        "canary_share": settings.canary_share,
        "prompt_length_bands": list(settings.prompt_length_bands),
        "statistics": {"method": ROUTING_METHOD, "route_level": ratio_test.ROUTE_LEVEL,
                       "return_level": ratio_test.RETURN_LEVEL},
        "routed_classes": sum(route.routed for route in view.classes),
        "classes": [class_json(route) for route in view.classes],
    }
