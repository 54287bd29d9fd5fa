"""`specdecode-exporter check URL`: collect a few times over a short interval and print a verdict table."""

from __future__ import annotations

import asyncio
import time
from typing import TextIO
from urllib.parse import urlsplit, urlunsplit

from specdecode_exporter.check import per_request as check_per_request
from specdecode_exporter.core.config.validation import validate
from specdecode_exporter.core.contract.failure import FailureReason
from specdecode_exporter.core.contract.monitoring_config import Statistics
from specdecode_exporter.pipeline.derive import acceptance_ratio
from specdecode_exporter.pipeline.engines import NOT_APPLICABLE, vllm_plain
from specdecode_exporter.pipeline.schedule import (
    BatchSchedule,
    schedule_summary,
    trtllm_draft_len_schedule,
    vllm_speculative_config,
)
from specdecode_exporter.sidecar.collection import Exporter, TargetView, new_client
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, Url, Window
from specdecode_exporter.sidecar.series import SeriesView
from specdecode_exporter.sidecar.status import verdict_stats, withheld

PROG = "specdecode-exporter check"
CHECK_STEP_SECONDS = 2.0  # below V0's 5 s report period, so V0 counters can be decoded too
# The URL is checked as a target's is (sidecar/config.py), but check has no bearer_token_file to point to.
URL_CONTEXT = {"url_credentials": "check sends none, and prints the URL"}


def _fmt(value: float | int | None, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


async def collect_for(exporter: Exporter, duration: float) -> TargetView:
    (collector,) = exporter.collectors.values()
    async with new_client(collector.config) as client:
        deadline = time.monotonic() + duration
        (view,) = await exporter.collect_all_once(client)
        while view.up and time.monotonic() < deadline:
            await asyncio.sleep(min(CHECK_STEP_SECONDS, max(0.0, deadline - time.monotonic())))
            (view,) = await exporter.collect_all_once(client)
    return view


def metrics_hint(url: str, error: str | None) -> str:
    """A 404 from a URL whose path is not /metrics: most likely the server's base URL (what `probe --url` takes),
    so the hint names the same server's /metrics."""
    parts = urlsplit(url)
    if error is None or not error.startswith("http_status: HTTP 404") or parts.path == "/metrics":
        return ""
    return f" (did you mean {urlunsplit((parts.scheme, parts.netloc, '/metrics', '', ''))}?)"


def failure_line(url: str, error: str | None) -> str:
    """Why check has no verdict: what it found where it read a page (a vLLM without spec decode is not a failure to
    collect: it may be the control pod), else why it could not collect."""
    if error == f"{FailureReason.NO_SPEC_METRICS.value}: {vllm_plain.WHY_NOT}":
        return f"{url}: nothing to judge: {vllm_plain.WHY_NOT}"
    return f"cannot collect {url}: {error}{metrics_hint(url, error)}"


def render(view: TargetView, duration: float) -> str:
    cost = view.config.cost
    lines = [f"target   {view.config.url}", f"api      {view.api}", ""]
    not_applicable = NOT_APPLICABLE.get(view.api or "")
    if not_applicable is not None:
        return "\n".join([*lines, not_applicable]) + "\n"
    header = ("model", "engine", "α", "α since start", "mean len", "draft len", "k", "speedup", "break-even", "best k",
              "verdict")
    rows = [header]
    for series in view.series:
        stats = verdict_stats(series)
        totals = series.totals
        rows.append((
            series.key.model_name or "", series.key.engine or "",
            _fmt(stats.acceptance_ratio if stats else None),
            _fmt(acceptance_ratio(totals.accepted_tokens or 0.0, totals.draft_tokens or 0.0)),
            _fmt(stats.mean_acceptance_length if stats else None, ".2f"),
            _fmt(stats.mean_draft_length if stats else None, ".2f"),
            _fmt(series.num_speculative_tokens, "d"),
            _fmt(stats.expected_speedup if stats else None, ".2f"),
            _fmt(series.break_even, ".2f"),
            _fmt(stats.recommended_num_speculative_tokens if stats else None, "d"),
            series.judgement.verdict.value,
        ))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines += ["  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    if (why := withheld(view)) is not None:
        lines += ["", f"Withheld: {why} (--adaptive-verification)."]
    elif not any(s.windows for s in view.series):
        lines += ["", f"No drafted tokens in the last {duration:g}s: send traffic, or check for longer (--duration)."]
    lines += [""] + [f"{series.key.model_name or ''} {series.key.engine or ''}".strip()
                     + f": {series.judgement.verdict.value} ({series.judgement.reason})" for series in view.series]
    lines += [f"Per position, {series.key.model_name or ''} {series.key.engine or ''}".rstrip()
              + f": {stats.unproven}" for series in view.series
              if (stats := verdict_stats(series)) is not None and stats.unproven]
    lines += speculation_lines(view)
    lines += ["", f"Cost model: c_draft={cost.c_draft:g} c_verify={cost.c_verify:g}; speedup is modelled, not "
                  "measured."]
    lines += [f"Break-even α {_fmt(series.break_even, '.2f')}, {series.key.model_name or ''} "
              f"{series.key.engine or ''}: {series.cost_basis_words}." for series in view.series if series.spec_decode]
    return "\n".join(lines) + "\n"


def speculation_lines(view: TargetView) -> list[str]:
    """Whether each series still speculates, and the batch-size schedule with the two forms to paste."""
    lines: list[str] = []
    for series in view.series:
        name = f"{series.key.model_name or ''} {series.key.engine or ''}".strip()
        if series.speculation is not None:
            lines += ["", f"Speculation, {name}: {series.speculation.reason}"]
        schedule = series.schedule
        if schedule is None:
            continue
        lines += ["", f"Batch-size schedule, {name} (over {series.schedule_window}): {schedule_summary(schedule)}"]
        lines += best_k_line(series, schedule, view.config.cost.per_draft_token)
        pastes = (("vLLM", vllm_speculative_config(schedule, series.method or view.method)),
                  ("TensorRT-LLM", trtllm_draft_len_schedule(schedule)))
        lines += [f"  {tool + ':':<14}{text}" for tool, text in pastes if text is not None] or [
            "  no batch size pays: turn speculation off"]
    return lines


def best_k_line(series: SeriesView, schedule: BatchSchedule, cost: float) -> list[str]:
    """Why the table's best k differs from the schedule's k at the batch sizes seen, in one line (none when not)."""
    stats = verdict_stats(series)
    best = stats.recommended_num_speculative_tokens if stats is not None else None
    differs = [r for r in schedule.ranges if r.observed_seconds > 0 and r.recommended != best]
    if best is None or not differs:
        return []
    at = ", ".join(f"k = {r.recommended} at batch size {r.label} (cost {r.cost_per_draft_token:.2f})" for r in differs)
    return [f"  best k {best} in the table is at the configured cost per drafted token ({cost:.2f}) whatever the "
            f"batch; the schedule charges each batch size its own (verification costs more as the batch grows) "
            f"and, with enough drafts, takes its own acceptance: {at}"]


def variance_lines(view: TargetView, statistics: Statistics) -> list[str]:
    """The variance per drafted token the page divides by, per series: assumed here (check sees no per-request
    results), with k̄ from the target's counters; where it is measured instead. None where speculative decoding
    metrics do not apply (a diffusion model: nothing drafted, nothing to page on) or α is withheld."""
    if view.api in NOT_APPLICABLE or withheld(view) is not None:
        return []
    dispersion = statistics.dispersion
    lines: list[str] = []
    for series in view.series:
        totals = series.totals
        measured = bool(totals.drafts and totals.draft_tokens)
        k = (totals.draft_tokens or 0.0) / totals.drafts if measured and totals.drafts else None
        v = dispersion.variance_per_token(k if k is not None else dispersion.tokens_per_request)
        name = f"{series.key.model_name or ''} {series.key.engine or ''}".strip()
        basis = f"k̄ {k:.2f} from the counters" if k is not None else "no drafts counter: k̄ taken as m"
        lines += ["", f"Page variance per drafted token, {name}: {v:.2f}, assumed on 0 requests (monitoring config "
                      f"statistics: {dispersion.tokens_per_request:g} drafted tokens per request, sd "
                      f"{dispersion.request_sd:g}; {basis}). The request tap measures it on your traffic "
                      f"(once a window holds {statistics.min_requests:g} requests): "
                      "specdecode_acceptance_variance_per_draft_token, /api/v1/status."]
    return lines


def per_request_line(view: TargetView, send_completion: bool, timeout: float) -> tuple[str | None, bool]:
    """(the per-request metrics line, whether it could decide); only for vLLM targets that serve spec decode."""
    if not view.series or view.api not in ("vllm-v1", "vllm-v0"):
        return None, True
    if not send_completion or view.api == "vllm-v0":
        return check_per_request.hint(view.api), True
    finding = asyncio.run(check_per_request.send_test_completion(view.config.url, timeout))
    return finding.line, finding.decided


def run_check(url: str, duration: float, timeout: float, out: TextIO, err: TextIO,
              send_test_completion: bool = False, adaptive_verification: bool = False) -> int:
    """Collect, print the verdict; with ``send_test_completion``, also one 1-token completion to tell whether vLLM
    returns the per-request metrics the request tap reads (exit code 1 when that could not be told). Results go to
    ``out``; what went wrong goes to ``err``, one line each, so `check … > verdict.txt` keeps only results. A URL
    that is not one a target may have is a ConfigError (a usage error: exit code 2), before anything is sent."""
    url = validate(Url, url, "URL", context=URL_CONTEXT)
    window = Window(f"{duration:g}s", duration + CHECK_STEP_SECONDS)
    target = TargetConfig(name="check", url=url, timeout=timeout, adaptive_verification=adaptive_verification)
    config = Config(targets=(target,), windows=(window,),
                    collect=CollectSection(interval=CHECK_STEP_SECONDS))
    exporter = Exporter(config)
    view = asyncio.run(collect_for(exporter, duration))
    if not view.up:
        err.write(f"{PROG}: {failure_line(url, view.last_error)}\n")
        return 1
    out.write(render(view, duration))
    out.write("".join(f"{line}\n" for line in variance_lines(view, config.statistics)))
    out.flush()
    line, decided = per_request_line(view, send_test_completion, timeout)
    if line is not None and decided:
        out.write(f"\n{line}\n")
    elif line is not None:
        err.write(f"{PROG}: {line}\n")
    return 0 if decided else 1
