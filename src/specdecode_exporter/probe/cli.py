"""`specdecode-exporter probe`: flags, the plan they make, and the output. Exit codes: 0 measured, 1 an expected
failure (server not there, no spec decode, wrong model, other traffic, --timeout), 2 a bad flag, 130 Ctrl-C (SIGINT)
and 143 SIGTERM (both after printing the rows measured so far)."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from typing import TextIO
from urllib.parse import urlsplit

from specdecode_exporter.core.config.flags import UsageError, convert
from specdecode_exporter.core.config.validation import ConfigError, parse_duration, validate
from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.process.signals import stop_on_signals
from specdecode_exporter.probe.client import ProbeFault
from specdecode_exporter.probe.measure import Bands
from specdecode_exporter.probe.progress import Progress
from specdecode_exporter.probe.prompts import PromptsError, builtin_prompts, by_group, load_prompts
from specdecode_exporter.probe.report import (
    PlotError,
    check_plot_path,
    render_csv,
    render_json,
    render_table,
    write_plot,
)
from specdecode_exporter.probe.run import Outcome, Plan, run_probe
from specdecode_exporter.sidecar.config import Url

PROG = "specdecode-exporter probe"
DEFAULT_TEMPERATURES = "0,0.4,0.8,1.0"
DEFAULT_MAX_TOTAL_REQUESTS = 2000
DEFAULT_TIMEOUT = "30m"
DEFAULT_REQUEST_TIMEOUT = "120s"
DEFAULT_SETTLE = "500ms"
# --url and --baseline-url are checked as a target's URL is (sidecar/config.py), with the server's base URL as example.
URL_CONTEXT = {"url_example": "http://127.0.0.1:8000", "url_credentials": "probe sends none, and prints the URL"}
DESCRIPTION = """Measure α (accepted / drafted tokens), mean acceptance length, per-position acceptance, TPOT and
tokens/s per temperature and prompt group against a running server, and with --baseline-url the observed speedup
(baseline TPOT / TPOT) against a server without spec decode; a verdict per row. Details: docs/probe.md."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    add = parser.add_argument
    add("--url", required=True, metavar="URL", help="the server with spec decode, e.g. http://127.0.0.1:8000 (its "
                                                   "/metrics URL, as check and run take, works too)")
    add("--baseline-url", metavar="URL", help="the same model without spec decode: the same requests go there too, "
                                             "for the observed speedup (baseline TPOT / TPOT)")
    add("--model", metavar="NAME", help="the served model name (default: the one model /v1/models lists)")
    add("--temperatures", default=DEFAULT_TEMPERATURES, metavar="LIST",
        help=f"comma-separated sampling temperatures, one row each (default {DEFAULT_TEMPERATURES})")
    add("--prompts", metavar="FILE", help="JSONL: one object a line with \"prompt\" (or \"messages\" for --chat) "
                                         "and an optional \"group\" (a row per group); default: a small built-in "
                                         "set (code, chat, summarization, copy-heavy). Use prompts like your traffic")
    add("--chat", action="store_true", help="send /v1/chat/completions (default /v1/completions)")
    add("--requests", default="20", metavar="N", help="requests per temperature × group, on each server (default 20)")
    add("--concurrency", default="4", metavar="N", help="requests in flight at once (default 4)")
    add("--max-tokens", default="200", metavar="N", help="max_tokens of every request (default 200)")
    add("--seed", default="0", metavar="N", help="request i of a row carries seed N+i, on both servers, so their "
                                                "outputs can match (default 0)")
    add("--warmup", default="4", metavar="N",
        help="requests to each server before measuring, not counted: a fresh server's first requests are slow "
             "(default 4)")
    add("--ignore-eos", action="store_true", help="ask vLLM to generate max_tokens every time (ignore_eos)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of a table")
    output.add_argument("--csv", action="store_true", help="print the rows as CSV instead of a table")
    add("--plot", metavar="FILE", help="also draw α and the speedup against temperature: FILE.png (needs "
                                      "pip install 'specdecode-exporter[plot]') or FILE.html (self-contained)")
    add("--allow-shared-traffic", action="store_true",
        help="without per-request metrics, accept counter deltas that other traffic moved (rows marked shared) "
             "instead of refusing")
    add("--max-total-requests", default=str(DEFAULT_MAX_TOTAL_REQUESTS), metavar="N",
        help=f"refuse a plan of more requests than this, both servers together (default {DEFAULT_MAX_TOTAL_REQUESTS})")
    add("--timeout", default=DEFAULT_TIMEOUT, metavar="DURATION",
        help=f"stop after this long and print the rows measured so far (default {DEFAULT_TIMEOUT})")
    add("--request-timeout", default=DEFAULT_REQUEST_TIMEOUT, metavar="DURATION",
        help=f"give up on one request after this long; it counts as failed (default {DEFAULT_REQUEST_TIMEOUT})")
    add("--settle", default=DEFAULT_SETTLE, metavar="DURATION",
        help="without per-request metrics: the wait before each /metrics scrape after a row, and the idle window "
             f"in which the counters must not move (default {DEFAULT_SETTLE})")
    add("--monitoring.config-file", dest="monitoring_config_file", metavar="FILE",
        help="the monitoring config whose bands the verdict reads (thresholds.page_acceptance_ratio, "
             "probe.measure_below, probe.ship_speedup), merged onto the shipped one")


def _integer(flag: str, raw: str, low: int, high: int) -> int:
    return convert(flag, raw, int, f"an integer from {low} to {high}", lambda v: low <= v <= high)


def parse_url(flag: str, raw: str) -> str:
    """An http(s) base URL without a trailing slash: checked as a target's URL is (sidecar/config.py's one
    validator), and without a query or fragment. The server's /metrics URL (what `check` and `run --target` take)
    and its /v1 URL name the same server, so either is taken for its base URL."""
    try:
        url: str = validate(Url, raw.strip(), flag, context=URL_CONTEXT)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise UsageError(f"{flag}: expected an http(s) URL like {URL_CONTEXT['url_example']}, got {raw!r}")
    return url.rstrip("/").removesuffix("/metrics").removesuffix("/v1")


def parse_temperatures(raw: str) -> tuple[float, ...]:
    def one(text: str) -> float:
        return convert("--temperatures", text.strip(), float, "comma-separated numbers from 0 to 2",
                        lambda v: math.isfinite(v) and 0 <= v <= 2)

    values = [one(t) for t in raw.split(",") if t.strip()]
    if not values:
        raise UsageError("--temperatures: expected comma-separated numbers from 0 to 2, got nothing")
    return tuple(dict.fromkeys(values))


def _duration(flag: str, raw: str) -> float:
    try:
        return parse_duration(raw, flag)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _bands(path: str | None) -> Bands:
    try:
        cfg = monitoring_config.load(path)
    except ConfigError as exc:
        raise UsageError(f"--monitoring.config-file: {exc}") from None
    return Bands(cfg.thresholds.page_acceptance_ratio, cfg.probe.measure_below, cfg.probe.ship_speedup)


def build_plan(args: argparse.Namespace) -> tuple[Plan, float]:
    """The plan from the flags, and the total timeout; UsageError on a bad flag (nothing contacted yet)."""
    url = parse_url("--url", args.url)
    baseline = parse_url("--baseline-url", args.baseline_url) if args.baseline_url else None
    if args.plot:
        try:
            check_plot_path(args.plot)
        except PlotError as exc:
            raise UsageError(str(exc)) from None
    try:
        prompts = load_prompts(args.prompts, args.chat) if args.prompts else builtin_prompts()
    except PromptsError as exc:
        raise UsageError(str(exc)) from None
    plan = Plan(
        url=url, baseline_url=baseline, model=args.model or None,
        temperatures=parse_temperatures(args.temperatures),
        groups=tuple((name, tuple(group)) for name, group in by_group(prompts).items()),
        requests=_integer("--requests", args.requests, 1, 100_000),
        concurrency=_integer("--concurrency", args.concurrency, 1, 256),
        max_tokens=_integer("--max-tokens", args.max_tokens, 2, 1_000_000),
        chat=args.chat, ignore_eos=args.ignore_eos, seed=_integer("--seed", args.seed, 0, 2**31 - 1),
        allow_shared_traffic=args.allow_shared_traffic,
        request_timeout=_duration("--request-timeout", args.request_timeout),
        settle_seconds=_duration("--settle", args.settle),
        warmup=_integer("--warmup", args.warmup, 0, 10_000),
        bands=_bands(args.monitoring_config_file),
    )
    cap = _integer("--max-total-requests", args.max_total_requests, 1, 10_000_000)
    if plan.total_requests > cap:
        per_server = (f"{len(plan.temperatures)} temperatures × {len(plan.groups)} groups × {plan.requests} requests"
                      f" + {plan.warmup} warm-up")
        sum_up = f"({per_server}) × 2 servers" if baseline else per_server
        raise UsageError(f"--max-total-requests: the plan is {plan.total_requests} requests ({sum_up}), more than "
                         f"{cap}; lower --requests or raise the cap")
    return plan, _duration("--timeout", args.timeout)


def emit(args: argparse.Namespace, plan: Plan, outcome: Outcome, out: TextIO) -> None:
    if args.json:
        out.write(render_json(outcome.rows))
    elif args.csv:
        out.write(render_csv(outcome.rows))
    else:
        out.write(render_table(plan, outcome))
    out.flush()


async def _bounded(plan: Plan, outcome: Outcome, progress: Progress, timeout: float) -> bool:
    """Run the probe; False when --timeout ended it first."""
    try:
        async with asyncio.timeout(timeout):
            await run_probe(plan, outcome, progress)
    except TimeoutError:
        return False
    return True


def main(args: argparse.Namespace) -> int:
    try:
        plan, timeout = build_plan(args)
    except UsageError as exc:
        sys.stderr.write(f"{PROG}: error: {exc} (see {PROG} --help)\n")
        return 2
    outcome = Outcome()
    progress = Progress(sys.stderr)
    with stop_on_signals() as stop:
        try:
            finished = asyncio.run(_bounded(plan, outcome, progress, timeout))
        except KeyboardInterrupt:
            return _partial(args, plan, outcome, progress, stop.name, stop.exit_code)
        except ProbeFault as exc:
            progress.close()
            if outcome.rows:
                emit(args, plan, outcome, sys.stdout)
            sys.stderr.write(f"{PROG}: {exc}\n")
            return 1
    if not finished:
        return _partial(args, plan, outcome, progress, f"stopped at --timeout {args.timeout}", 1)
    progress.close()
    emit(args, plan, outcome, sys.stdout)
    if args.plot:
        try:
            write_plot(args.plot, plan, outcome)
        except PlotError as exc:
            sys.stderr.write(f"{PROG}: {exc}\n")
            return 1
    return 0


def _partial(args: argparse.Namespace, plan: Plan, outcome: Outcome, progress: Progress, why: str, code: int) -> int:
    progress.close()
    emit(args, plan, outcome, sys.stdout)
    sys.stderr.write(f"{PROG}: {why}: {len(outcome.rows)} of {plan.rows} rows measured\n")
    return code
