"""The page over a simulated month: detection delay and false pages of SpecDecodeAcceptanceRateLow, per traffic rate.

    .venv/bin/python bench/paging.py            # quick: a month of α 0.55 per rate, 10 days of drops (~19 min)
    .venv/bin/python bench/paging.py --long     # three months of α 0.55 per rate, a month of drops per rate
    .venv/bin/python bench/paging.py --update-docs   # and write the table into docs/paging.md and alerts/runbook.md

Traffic (per model, two pods, fleet rate R drafted tokens/s split between them): requests arrive as a Poisson process,
each drafts 30 tokens in 10 drafts of 3; a request's acceptance probability p is drawn from a Beta distribution with
mean the true α and sd 0.2, and each draft accepts a prefix (position i accepted with probability q given i − 1 was,
q chosen so that the mean accepted share is p). Counters are scraped every 15 s (the shipped ServiceMonitor) at a
fixed offset per pod.

Scenarios per rate R ∈ {0.2, 1, 10, 100, 1000}:
* **month**: α 0.55 throughout (healthy, but near the threshold), with pod restarts (counters back to 0), scrape gaps,
  a vLLM upgrade (both pods reset, one after the other) and a sidecar restart after a vLLM restart (the counter falls
  to vLLM's own count, a day of tokens): every firing is a false page;
* **drops**: cycles of α 0.75 for a little over 2 h (the longest window) then α 0.35; the delay of each drop is from
  the drop to the first firing evaluation;
* **pause** (10/s only): the same drops, traffic stopping for 2 minutes 30 s after each.

Evaluation (why this way): the samples are written as OpenMetrics and backfilled into a real TSDB with ``promtool tsdb
create-blocks-from openmetrics``; a real Prometheus then evaluates the page's generated expression (``rule_groups`` of
the shipped monitoring config; the stage's records, the tap's per-request sums from them, the variance's steps and
then the measured variance from those, are first recorded into the TSDB at their groups' intervals with ``promtool
tsdb create-blocks-from rules``, as a ruler writes them; the other recording rules are substituted by their own
expressions, i.e. the recordings evaluated at the same instant, as ``promtool test rules`` orders the groups; a ruler
that evaluates its groups at independent phases sees each layer up to one evaluation later) with ``query_range`` at
the groups' evaluation interval, and ``for:`` is applied to the result as Prometheus' rule manager does (pending at
the first true evaluation, firing once it has held ``for:``, reset by any evaluation without it). A month of
``promtool test rules`` per rate would take hours; the cross-check below replays one drop through ``promtool test
rules`` with the real rule file and compares the firing state at every evaluation. Baseline, same data and same run:
the page as it was before (α over 5m < 0.5 with ≥ 5 drafted tokens/s, ``for: 10m``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from devtools.procs import Process, prometheus_binary, promtool_binary, start_process  # noqa: E402
from specdecode_exporter.core.config.validation import duration_seconds  # noqa: E402
from specdecode_exporter.core.contract import metrics as m  # noqa: E402
from specdecode_exporter.core.contract import monitoring_config  # noqa: E402
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig  # noqa: E402
from specdecode_exporter.monitoring import rules, stage, tunables  # noqa: E402
from specdecode_exporter.monitoring.promql import Scope, acceptance_ratio, rate_sum  # noqa: E402
from specdecode_exporter.monitoring.rules import rule_groups  # noqa: E402

Floats = npt.NDArray[np.float64]
PAGE = rules.PAGE
RATES = (0.2, 1.0, 10.0, 100.0, 1000.0)
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z: every series starts here, on the evaluation grid
DAY = 86_400.0
BIN_S = 5.0  # requests are counted in 5 s bins
SCRAPE_S = 15.0
POD_OFFSETS = (2.0, 9.0)  # each pod's scrape offset into the 15 s grid
NAMESPACE = "bench"
HEALTHY, NEAR, LOW = 0.75, 0.55, 0.35
PAUSE_S, PAUSE_AFTER_S = 120.0, 30.0
MAX_POINTS = 11_000  # Prometheus' limit of points per series in one range query


# ------------------------------------------------------------------------------------------------- traffic


@dataclass(frozen=True, slots=True)
class Traffic:
    """The overdispersed request stream the issue describes."""

    tokens_per_request: int = 30
    tokens_per_draft: int = 3
    request_sd: float = 0.2  # sd of a request's acceptance probability around the true α
    pods: int = 2
    tap: bool = False  # the request tap's counters too (requests, Σ D, Σ A, Σ D², Σ A², Σ A·D): the measured v


@functools.cache
def request_pmf(alpha: float, traffic: Traffic, grid: int = 2000) -> Floats:
    """P(a request accepts j of its drafted tokens), j = 0 … tokens_per_request (see the module's docstring)."""
    k, steps = traffic.tokens_per_draft, traffic.tokens_per_request // traffic.tokens_per_draft
    scale = alpha * (1 - alpha) / traffic.request_sd**2 - 1
    p = (np.arange(grid) + 0.5) / grid
    log_w = (alpha * scale - 1) * np.log(p) + ((1 - alpha) * scale - 1) * np.log(1 - p)
    weights = np.exp(log_w - log_w.max())
    weights /= weights.sum()
    qs = np.linspace(0.0, 1.0, 20001)
    share = sum(qs**j for j in range(1, k + 1)) / k  # mean accepted share of a draft for per-position q
    q = np.interp(p, share, qs)
    pmf = np.zeros(steps * k + 1)
    for qi, wi in zip(q, weights, strict=True):
        draft = np.array([qi**j * (1 - qi) for j in range(k)] + [qi**k])
        dist = np.ones(1)
        for _ in range(steps):
            dist = np.convolve(dist, draft)
        pmf += wi * dist
    out: Floats = pmf / pmf.sum()
    return out


def accepted_in_bins(requests: npt.NDArray[np.int64], alpha: float, traffic: Traffic,
                     rng: np.random.Generator) -> Floats:
    """Accepted tokens of ``requests[i]`` requests in each bin: exact sums of per-request draws (a multinomial over
    the per-request counts), or their normal limit where a bin holds many requests."""
    pmf = request_pmf(alpha, traffic)
    values = np.arange(pmf.size, dtype=np.float64)
    mean, var = float(pmf @ values), float(pmf @ values**2) - float(pmf @ values) ** 2
    out = np.zeros(requests.size)
    small = (requests > 0) & (requests < 50)
    out[small] = rng.multinomial(requests[small], pmf) @ values
    big = requests >= 50
    out[big] = np.maximum(0.0, np.round(rng.normal(requests[big] * mean, np.sqrt(requests[big] * var))))
    return out


def accepted_sums_in_bins(requests: npt.NDArray[np.int64], alpha: float, traffic: Traffic,
                          rng: np.random.Generator) -> tuple[Floats, Floats]:
    """(Σ A, Σ A²) of ``requests[i]`` requests in each bin, as ``accepted_in_bins`` draws them; the normal limit is
    bivariate there (A and A² of the same requests)."""
    pmf = request_pmf(alpha, traffic)
    values = np.arange(pmf.size, dtype=np.float64)
    squares = values**2
    first, second = float(pmf @ values), float(pmf @ squares)
    cov = np.array([[second - first**2, float(pmf @ values**3) - first * second],
                    [float(pmf @ values**3) - first * second, float(pmf @ squares**2) - second**2]])
    total, total_sq = np.zeros(requests.size), np.zeros(requests.size)
    small = (requests > 0) & (requests < 50)
    counts = rng.multinomial(requests[small], pmf)
    total[small], total_sq[small] = counts @ values, counts @ squares
    big = np.flatnonzero(requests >= 50)
    if big.size:
        n = requests[big].astype(np.float64)
        draws = rng.multivariate_normal(np.zeros(2), cov, size=big.size) * np.sqrt(n)[:, None]
        total[big] = np.maximum(0.0, np.round(n * first + draws[:, 0]))
        total_sq[big] = np.maximum(total[big], np.round(n * second + draws[:, 1]))
    return total, total_sq


# ----------------------------------------------------------------------------------------------- scenarios


@dataclass(frozen=True, slots=True)
class Reset:
    """From ``at`` the pod's exported counters count again from what they saw since ``since`` (``at`` itself: a
    restart from 0; earlier: a sidecar restart after vLLM restarted at ``since``); no scrapes for ``down_s``."""

    pod: int
    at: float
    down_s: float = 60.0
    since: float | None = None


@dataclass(frozen=True, slots=True)
class Gap:
    pod: int
    at: float
    length_s: float


@dataclass(frozen=True, slots=True)
class Scenario:
    kind: str  # month, drops, pause
    rate: float  # drafted tokens per second, the fleet's
    days: float
    drops: tuple[float, ...] = ()  # seconds from T0 at which α falls from HEALTHY to LOW
    recover_after_s: float = 0.0  # how long α stays LOW after each drop
    events: tuple[Reset | Gap, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.rate:g}"

    @property
    def bins(self) -> int:
        return int(self.days * DAY / BIN_S)

    def alpha(self) -> Floats:
        if self.kind == "month":
            return np.full(self.bins, NEAR)
        alpha = np.full(self.bins, HEALTHY)
        for drop in self.drops:
            alpha[int(drop / BIN_S):int((drop + self.recover_after_s) / BIN_S)] = LOW
        return alpha

    def traffic_scale(self) -> Floats:
        scale = np.ones(self.bins)
        if self.kind == "pause":
            for drop in self.drops:
                scale[int((drop + PAUSE_AFTER_S) / BIN_S):int((drop + PAUSE_AFTER_S + PAUSE_S) / BIN_S)] = 0.0
        return scale


def month_events(days: float) -> tuple[Reset | Gap, ...]:
    """Every 30 days: restarts, scrape gaps, a rolling vLLM upgrade, a sidecar restart after a vLLM restart."""
    out: list[Reset | Gap] = []
    for start in np.arange(0.0, days, 30.0):
        d = float(start) * DAY
        out += [Reset(1, d + 3.3 * DAY), Gap(0, d + 5.5 * DAY, 300), Reset(0, d + 9.1 * DAY),
                Gap(1, d + 12.7 * DAY, 600), Reset(0, d + 15.2 * DAY, 120), Reset(1, d + 15.2 * DAY + 300, 120),
                Gap(0, d + 18.4 * DAY, 180), Gap(1, d + 18.4 * DAY, 180),
                Reset(0, d + 21.0 * DAY, 30, since=d + 20.0 * DAY), Reset(1, d + 24.6 * DAY)]
    return tuple(e for e in out if e.at < days * DAY)


# How long α stays low after a drop: past the slowest detection, and past the old page's 5m window + for: 10m.
BAD_PHASE_S = {0.2: 4 * 3600.0, 1.0: 75 * 60.0, 10.0: 20 * 60.0, 100.0: 20 * 60.0, 1000.0: 20 * 60.0}
HEALTHY_PHASE_S = 2 * 3600.0 + 600.0  # the longest page window and then some: every drop starts from clean windows


def drop_times(days: float, bad_s: float, rng: np.random.Generator) -> tuple[float, ...]:
    """Drop times: a healthy phase, then bad_s of α LOW, over and over; each drop 0-55 s late so that drops fall
    anywhere on the scrape and evaluation grids."""
    out, t = [], HEALTHY_PHASE_S
    while t + bad_s < days * DAY:
        drop = t + BIN_S * float(rng.integers(0, 12))
        out.append(drop)
        t = drop + bad_s + HEALTHY_PHASE_S
    return tuple(out)


def scenarios(month_days: float, drop_days: float, rng: np.random.Generator) -> list[Scenario]:
    out = [Scenario("month", rate, month_days, events=month_events(month_days)) for rate in RATES]
    for rate in RATES:
        bad = BAD_PHASE_S[rate]
        out.append(Scenario("drops", rate, drop_days, drop_times(drop_days, bad, rng), bad))
    bad = BAD_PHASE_S[10.0] + PAUSE_S
    out.append(Scenario("pause", 10.0, drop_days / 2, drop_times(drop_days / 2, bad, rng), bad))
    return out


# ------------------------------------------------------------------------------------------ counters, TSDB

COUNTERS = (m.DRAFTS, m.DRAFT_TOKENS, m.ACCEPTED_TOKENS)


@dataclass(frozen=True, slots=True)
class PodSeries:
    """What Prometheus scraped from one pod: scrape times (s from T0) and each counter's value then."""

    pod: int
    times: Floats
    values: dict[str, Floats]  # by exposed name (specdecode_drafts_total, …)


def _down(events: Sequence[Reset | Gap], pod: int, times: Floats) -> npt.NDArray[np.bool_]:
    """Where the pod is not scraped: down after a restart, or in a scrape gap."""
    out = np.zeros(times.size, dtype=bool)
    for e in events:
        if e.pod == pod:
            length = e.down_s if isinstance(e, Reset) else e.length_s
            out |= (times >= e.at) & (times < e.at + length)
    return out


def simulate_pod(scenario: Scenario, pod: int, traffic: Traffic, rng: np.random.Generator) -> PodSeries:
    per_bin = scenario.rate / traffic.tokens_per_request / traffic.pods * BIN_S
    requests = rng.poisson(per_bin * scenario.traffic_scale()).astype(np.int64)
    resets = sorted((e for e in scenario.events if isinstance(e, Reset) and e.pod == pod), key=lambda e: e.at)
    for r in resets:  # a pod that is down serves nothing
        requests[int(r.at / BIN_S):int((r.at + r.down_s) / BIN_S)] = 0
    alpha = scenario.alpha()
    accepted, accepted_sq = np.zeros(scenario.bins), np.zeros(scenario.bins)
    for level in np.unique(alpha):
        where = alpha == level
        if traffic.tap:
            accepted[where], accepted_sq[where] = accepted_sums_in_bins(requests[where], float(level), traffic, rng)
        else:
            accepted[where] = accepted_in_bins(requests[where], float(level), traffic, rng)
    drafts_per_request = traffic.tokens_per_request // traffic.tokens_per_draft
    tokens = traffic.tokens_per_request
    totals = {m.DRAFTS.exposed_name: np.cumsum(requests * drafts_per_request, dtype=np.float64),
              m.DRAFT_TOKENS.exposed_name: np.cumsum(requests * tokens, dtype=np.float64),
              m.ACCEPTED_TOKENS.exposed_name: np.cumsum(accepted)}
    if traffic.tap:  # every request drafts the same D = tokens_per_request: Σ D² = N·D², Σ A·D = D·Σ A
        totals |= {m.REQUESTS.exposed_name: np.cumsum(requests, dtype=np.float64),
                   m.REQUEST_DRAFT_TOKENS.exposed_name: totals[m.DRAFT_TOKENS.exposed_name],
                   m.REQUEST_ACCEPTED_TOKENS.exposed_name: totals[m.ACCEPTED_TOKENS.exposed_name],
                   m.REQUEST_DRAFT_TOKENS_SQUARED.exposed_name: np.cumsum(requests * tokens**2, dtype=np.float64),
                   m.REQUEST_ACCEPTED_TOKENS_SQUARED.exposed_name: np.cumsum(accepted_sq),
                   m.REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT.exposed_name: np.cumsum(accepted * tokens)}
    times = np.arange(POD_OFFSETS[pod], scenario.days * DAY, SCRAPE_S)
    times = times[~_down(scenario.events, pod, times)]

    def at(t: Floats, total: Floats) -> Floats:  # a counter counts the bins that ended by t
        index = np.floor(t / BIN_S).astype(np.int64) - 1
        out: Floats = np.where(index >= 0, total[np.clip(index, 0, None)], 0.0)
        return out

    values = {}
    for name, total in totals.items():
        base = np.zeros(times.size)
        for r in resets:  # counting again from the reset (or from vLLM's own restart, for a sidecar restart)
            base[times >= r.at] = at(np.array([r.since if r.since is not None else r.at]), total)[0]
        values[name] = at(times, total) - base
    return PodSeries(pod, times, values)


def write_openmetrics(path: Path, series: Sequence[tuple[str, PodSeries]]) -> int:
    """Every series as OpenMetrics with timestamps (what the backfill reads); returns the number of samples."""
    samples = 0
    names = list(dict.fromkeys(name for _, pod in series for name in pod.values))  # the tap's too, where simulated
    with path.open("w", encoding="utf-8") as out:
        for name in names:
            out.write(f"# TYPE {name.removesuffix('_total')} counter\n")
            for model, pod in series:
                if name not in pod.values:
                    continue
                labels = f'{{namespace="{NAMESPACE}",model_name="{model}",pod="pod-{pod.pod}"}}'
                times = (T0 + pod.times).astype(np.int64).tolist()
                out.writelines(f"{name}{labels} {v:.0f} {t}\n" for v, t in zip(pod.values[name].tolist(), times,
                                                                                strict=True))
                samples += len(times)
        out.write("# EOF\n")
    return samples


def backfill(promtool: str, openmetrics: Path, data: Path) -> None:
    proc = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=744h",
                           str(openmetrics), str(data)], capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {proc.stderr[-2000:]}")


def start_prometheus(binary: str, workdir: Path, data: Path) -> Process:
    """A Prometheus on the backfilled TSDB, scraping nothing (retention long enough for any simulated span)."""
    config = workdir / "prometheus.yml"
    config.write_text("global: {}\n")
    return start_process("prometheus", lambda port: [
        binary, f"--config.file={config}", f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=100y",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--query.max-samples=500000000",
        "--query.timeout=20m"], workdir, "/-/ready", timeout=120)


# ------------------------------------------------------------------------------------ the rule under test


@dataclass(frozen=True, slots=True)
class Rule:
    """One alert as a ruler evaluates it: what starts it and what keeps it firing (expressions on raw series, the
    part of its expression that reads ALERTS split off), ``for:`` and the evaluation interval."""

    name: str
    expr: str
    hold_s: float
    step_s: float
    longest_window_s: float  # how long bad minutes stay in what it reads
    holds: str | None = None  # while firing, this keeps it firing (``expr or (holds and ALERTS{firing})``)

    @property
    def expressions(self) -> tuple[str, ...]:
        return (self.expr,) if self.holds is None else (self.expr, self.holds)


def inline_records(expr: str, records: dict[str, str]) -> str:
    """``expr`` with every recording rule it reads replaced by that rule's own expression (recursively)."""
    for _ in range(5):
        before = expr
        for name in sorted(records, key=len, reverse=True):
            pattern = rf"(?<![\w:]){re.escape(name)}(?![\w:])"
            if re.search(pattern + r"\s*\{", expr):
                raise ValueError(f"{name} is read with label matchers; inline it by hand")
            expr = re.sub(pattern, lambda _, n=name: f"({records[n]})", expr)  # type: ignore[misc]
        if expr == before:
            return expr
    raise ValueError("recording rules nested too deep")


def generated_page(cfg: MonitoringConfig) -> Rule:
    """The page exactly as generated (monitoring.rules.rule_groups), its recordings inlined. Its expression is
    ``proof or (holds and ALERTS{firing})``; the two parts are evaluated apart and ALERTS is the bench's own state,
    after checking that they make up the generated expression."""
    doc = rule_groups(cfg)
    records = inlined_records(cfg)
    group = next(g for g in doc["groups"] if any(r.get("alert") == PAGE for r in g["rules"]))
    rule = next(r for r in group["rules"] if r.get("alert") == PAGE)
    values = tunables.mapping(cfg)
    proof, holds = tunables.fill(rules.page_proof(cfg), values), tunables.fill(rules.page_holds(cfg), values)
    if rule["expr"] != rules.page_expr(proof, holds, cfg.level_labels()):
        raise RuntimeError(f"{PAGE}'s generated expression is not proof or (holds and ALERTS): update the bench")
    return Rule(PAGE, inline_records(proof, records), duration_seconds(rule["for"], allow_zero=True),
                duration_seconds(group.get("interval") or "1m"),
                max(duration_seconds(w) for w in cfg.statistics.page_windows), inline_records(holds, records))


def recorded_passes(cfg: MonitoringConfig) -> list[tuple[str, list[dict[str, Any]]]]:
    """The groups whose records the bench writes into its TSDB before evaluating the page, in the order a ruler's
    groups read each other's: the stage (from the raw samples), the tap's per-request sums over the hour (from the
    stage), the variance's estimate, α and divisor (from the sums), then the page's measured variance (from those,
    as recorded 10 minutes earlier: an offset on an inlined expression is not PromQL). Inlined, the variance's hour
    of stage records, read at every 15 s of a month in each page window, took Prometheus hours; recorded at its
    group's interval it is one series read back, as the ruler's page reads it."""
    groups = rule_groups(cfg)["groups"]

    def holding(record: str) -> list[dict[str, Any]]:
        return [g for g in groups if any(r.get("record") == record for r in g["rules"])]

    return [("stage", stage.stage_groups(cfg)), ("sums", holding(rules.tapped_requests_record(cfg))),
            ("variance", holding(rules.variance_record(cfg, "estimate", rules.VARIANCE_WINDOW))),
            ("bound", holding(rules.variance_record(cfg, "bound")))]


def recorded_names(cfg: MonitoringConfig) -> set[str]:
    """Every record of recorded_passes: read from the TSDB, never inlined."""
    return {r["record"] for _, groups in recorded_passes(cfg) for g in groups for r in g["rules"] if "record" in r}


def inlined_records(cfg: MonitoringConfig) -> dict[str, str]:
    """The other records, by name: their expressions replace them where an evaluated expression reads them."""
    recorded = recorded_names(cfg)
    return {r["record"]: r["expr"] for g in rule_groups(cfg)["groups"] for r in g["rules"]
            if "record" in r and r["record"] not in recorded}


def _reads(expr: str, name: str) -> bool:
    return re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) is not None


def passes_read(cfg: MonitoringConfig, read: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """recorded_passes cut to the records that ``read`` (the evaluated expressions) reads, directly or through a
    later pass's records; the records of no pass inlined (a pass reads only the TSDB and the passes before it)."""
    inlined = inlined_records(cfg)
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for name, groups in reversed(recorded_passes(cfg)):
        kept = [{**g, "rules": [{**r, "expr": inline_records(r["expr"], inlined)} for r in g["rules"]
                                if "record" in r and _reads(read, r["record"])]} for g in groups]
        kept = [g for g in kept if g["rules"]]
        read += "\n" + "\n".join(r["expr"] for g in kept for r in g["rules"])
        out.insert(0, (name, kept))
    return out


def record_passes(promtool: str, prometheus: str, cfg: MonitoringConfig, workdir: Path, data: Path, days: float,
                  read: str, seconds: dict[str, float]) -> None:
    """The records ``read`` needs (passes_read) over the whole span, as the ruler would have written them: each pass's
    groups at their interval through `promtool tsdb create-blocks-from rules` against a Prometheus on ``data`` as the
    passes before left it, the blocks moved into ``data``; Prometheus must be restarted to read the last pass."""
    from specdecode_exporter.monitoring.build import dump_yaml

    for name, groups in passes_read(cfg, read):
        if not groups:
            continue
        t = time.perf_counter()
        pass_rules, out = workdir / f"{name}.rules.yaml", workdir / f"{name}-blocks"
        pass_rules.write_text(dump_yaml({"groups": groups}))
        proc = start_prometheus(prometheus, workdir, data)
        try:
            rule_blocks(promtool, proc.url, pass_rules, T0, T0 + int(days * DAY), out)
        finally:
            proc.stop()
        for block in out.iterdir():
            if block.is_dir():
                shutil.move(str(block), str(data / block.name))
        seconds[name] = time.perf_counter() - t


def rule_blocks(promtool: str, url: str, rules_file: Path, start: int, end: int, out: Path) -> None:
    """The records of ``rules_file`` from ``start`` to ``end`` (s) as blocks in ``out``, evaluated by the Prometheus
    at ``url``. The file is named relatively, from its own directory: promtool aligns each group's evaluations to
    an offset hashed from the group's name and the file's path, so an absolute path in a fresh temporary directory
    moved the records' phase against the scrapes from run to run (and the page one evaluation now and then)."""
    done = subprocess.run([promtool, "tsdb", "create-blocks-from", "rules", "--quiet", f"--url={url}",
                           f"--start={start}", f"--end={end}", f"--output-dir={out.resolve()}", rules_file.name],
                          capture_output=True, text=True, timeout=3600, check=False, cwd=rules_file.parent)
    if done.returncode != 0:
        raise RuntimeError(f"promtool create-blocks-from rules ({rules_file.name}) failed: {done.stderr[-2000:]}")


def baseline_page(step_s: float) -> Rule:
    """The page before this design (issue #20's "today"): α over 5m < 0.5, ≥ 5 drafted tokens/s, for: 10m."""
    scope = Scope("", ("namespace", "model_name"))
    expr = (f"{acceptance_ratio(scope, '5m')} < 0.5\nand on (namespace, model_name)\n"
            f"{rate_sum(m.DRAFT_TOKENS.exposed_name, scope, '5m')} >= 5")
    return Rule("baseline", expr, 600.0, step_s, 300.0)


def active_times(client: httpx.Client, url: str, expr: str, step: float, days: float) -> dict[str, Floats]:
    """Per model, the evaluation times (s from T0) at which ``expr`` returned a sample."""
    found: dict[str, list[float]] = {}
    end = T0 + days * DAY
    start = float(T0)
    while start < end:
        stop = min(start + (MAX_POINTS - 1) * step, end)
        resp = client.post(url + "/api/v1/query_range",
                           data={"query": expr, "start": f"{start:.0f}", "end": f"{stop:.0f}", "step": f"{step:g}"})
        if resp.status_code != 200:
            raise RuntimeError(f"query_range {resp.status_code}: {resp.text[:500]}")
        for result in resp.json()["data"]["result"]:
            found.setdefault(result["metric"]["model_name"], []).extend(float(t) - T0 for t, _ in result["values"])
        start = stop + step
    return {model: np.unique(np.array(times)) for model, times in found.items()}


def firing_runs(proof: Floats, holds: Floats, step_s: float, hold_s: float) -> list[tuple[float, float]]:
    """(first, last) evaluation of each stretch the alert fires, from the evaluations at which its expression's
    parts had a sample, as Prometheus' rule manager goes: the alert is active where ``proof`` has a sample, or where
    ``holds`` has one and it was firing at the evaluation before (what ALERTS says then); pending from its first
    active evaluation, firing once active for ``for:``; forgotten at the first evaluation where it is not active."""
    if proof.size == 0:
        return []
    start = float(proof.min())  # every time is on one evaluation grid: index them from the first proof
    n = round((max(float(proof.max()), float(holds.max()) if holds.size else 0.0) - start) / step_s) + 2
    is_proof, is_holds = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    is_proof[np.round((proof - start) / step_s).astype(np.int64)] = True
    is_holds[np.round((holds[holds >= start] - start) / step_s).astype(np.int64)] = True
    need = math.ceil(hold_s / step_s - 1e-9)
    runs: list[tuple[float, float]] = []
    since, first, firing = -1, -1, False
    for i, (p, h) in enumerate(zip(is_proof.tolist(), is_holds.tolist(), strict=True)):
        if not (p or (firing and h)):
            if firing:
                runs.append((start + first * step_s, start + (i - 1) * step_s))
            since, firing = -1, False
            continue
        since = i if since < 0 else since
        if not firing and i - since >= need:
            firing, first = True, i
    return runs


def pages(runs: Sequence[tuple[float, float]], group_interval_s: float) -> Floats:
    """When a person is paged: Alertmanager notifies a group at most once per group_interval, so an alert that
    resolves and fires again within it is the same page."""
    out: list[float] = []
    last_end = -math.inf
    for first, last in runs:
        if first - last_end > group_interval_s:
            out.append(first)
        last_end = last
    return np.array(out)


def firing_times(runs: Sequence[tuple[float, float]], step_s: float) -> Floats:
    """Every evaluation at which the alert is firing."""
    times = [np.arange(first, last + step_s / 2, step_s) for first, last in runs]
    out: Floats = np.concatenate(times) if times else np.zeros(0)
    return out


# ----------------------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: Scenario
    delays: Floats  # per drop, seconds from the drop to the first page while α was low; inf: none
    pages_per_drop: Floats  # pages from the drop until its low minutes have left the longest window
    false_pages: int  # pages with α healthy and no drop in any window (the month: every page)

    @property
    def false_per_30d(self) -> float:
        return self.false_pages * 30.0 / self.scenario.days

    def delay(self, q: float) -> float:
        return float(np.percentile(self.delays, q, method="inverted_cdf")) if self.delays.size else math.nan


def outcome(scenario: Scenario, paged: Floats, longest_window_s: float) -> Outcome:
    if scenario.kind == "month":
        return Outcome(scenario, np.zeros(0), np.zeros(0), int(paged.size))
    delays, per_drop, claimed = [], [], np.zeros(paged.size, dtype=bool)
    for drop in scenario.drops:
        during = (paged >= drop) & (paged < drop + scenario.recover_after_s)
        incident = (paged >= drop) & (paged < drop + scenario.recover_after_s + longest_window_s)
        claimed |= incident
        per_drop.append(float(incident.sum()))
        delays.append(float(paged[during][0] - drop) if during.any() else math.inf)
    return Outcome(scenario, np.array(delays), np.array(per_drop), int((~claimed).sum()))


# ------------------------------------------------------------------------------------------- cross-check

PROMTOOL_CASE = re.compile(r"alertname: (\S+), time: (\S+),")


def promtool_fired(output: str, alert: str) -> set[float]:
    """The evaluation times (s) at which `promtool test rules` got ``alert`` firing where the test expected nothing:
    each failed case prints its alertname and time, then what it expected (exp:[]) and what it got."""
    out = set()
    cases = PROMTOOL_CASE.split(output)[1:]
    for name, at, rest in zip(cases[0::3], cases[1::3], cases[2::3], strict=True):
        if name == alert and "got:[]" not in rest.replace(" ", "").split("alertname:")[0]:
            out.add(duration_seconds(at, allow_zero=True))
    return out


def promtool_series(pods: Sequence[PodSeries], model: str, start: float, end: float) -> list[dict[str, str]]:
    """The pods' samples in [start, end) as promtool input series (1 s grid, '_' where there is no sample)."""
    out = []
    for pod in pods:
        inside = (pod.times >= start) & (pod.times < end)
        seconds = np.round(pod.times[inside] - start).astype(np.int64)
        for spec in COUNTERS:
            tokens, previous = [], -1
            for s, v in zip(seconds.tolist(), pod.values[spec.exposed_name][inside].tolist(), strict=True):
                gap = s - previous - 1
                tokens += ([f"_x{gap}"] if gap > 1 else ["_"] if gap == 1 else []) + [f"{v:.0f}"]
                previous = s
            labels = f'namespace="{NAMESPACE}", model_name="{model}", pod="pod-{pod.pod}"'
            out.append({"series": f"{spec.exposed_name}{{{labels}}}", "values": " ".join(tokens)})
    return out


@dataclass(frozen=True, slots=True)
class CrossCheck:
    evaluations: int
    firing: int  # evaluations at which both say firing
    # where they differ: (seconds after the drop, which of the two fired), for the reader of a failed check
    disagree: tuple[tuple[float, str], ...] = ()

    @property
    def agree(self) -> int:
        return self.evaluations - len(self.disagree)


def cross_check(promtool: str, rules_file: Path, workdir: Path, scenario: Scenario, pods: Sequence[PodSeries],
                firing: Floats, rule: Rule) -> CrossCheck:
    """One drop of ``scenario`` through `promtool test rules` with the generated rule file: at every evaluation from
    the windows' filling to 20 minutes after the drop, does promtool fire the page exactly when the bench does?"""
    drop = scenario.drops[0]
    start = math.floor((drop - HEALTHY_PHASE_S) / rule.step_s) * rule.step_s  # on the evaluation grid
    end = drop + 1200.0
    first = start + 2 * 3600.0 + 300.0  # every window filled from samples inside the slice
    times = np.arange(first, end, rule.step_s)
    groups = [g["name"] for g in yaml.safe_load(rules_file.read_text())["groups"]]
    test = {"rule_files": [str(rules_file)], "evaluation_interval": f"{rule.step_s:g}s",
            "group_eval_order": groups,
            "tests": [{"interval": "1s", "input_series": promtool_series(pods, scenario.name, start, end),
                       "alert_rule_test": [{"eval_time": f"{t - start:.0f}s", "alertname": rule.name,
                                            "exp_alerts": []} for t in times]}]}
    path = workdir / "crosscheck.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=600,
                          check=False)
    fired = {start + t for t in promtool_fired(proc.stdout + proc.stderr, rule.name)}
    if proc.returncode != 0 and not fired:
        raise RuntimeError(f"promtool test rules failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    bench = set(firing[(firing >= first) & (firing < end)].tolist())
    disagree = tuple((t - drop, "promtool" if t in fired else "bench") for t in times.tolist()
                     if (t in fired) != (t in bench))
    return CrossCheck(times.size, len(fired & bench), disagree)


# ------------------------------------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True)
class Size:
    month_days: float  # α 0.55 with restarts, gaps and resets, per rate
    drop_days: float  # drop cycles per rate (the pause scenario gets half)
    seed: int = 20

    def describe(self) -> str:
        return f"{self.month_days:g} days of α {NEAR} and {self.drop_days:g} days of drops per rate"


QUICK, LONG = Size(30.0, 10.0), Size(90.0, 30.0)


@dataclass(frozen=True, slots=True)
class Result:
    rule: Rule
    outcomes: dict[str, Outcome]  # by scenario name: the generated page
    before: dict[str, Outcome]  # the same scenarios: the page as it was
    cross: CrossCheck
    samples: int
    group_interval_s: float
    seconds: dict[str, float] = field(default_factory=dict)  # wall time of each phase


Runs = dict[str, list[tuple[float, float]]]  # by model: when the alert fired


def _evaluate(checked: Sequence[Rule], scens: Sequence[Scenario], series: dict[str, list[PodSeries]],
              workdir: Path, seconds: dict[str, float], cfg: MonitoringConfig) -> tuple[list[Runs], int]:
    """Backfill the samples, start Prometheus on them, evaluate each rule's expressions over every scenario's
    span; returns each rule's firing stretches per model and the number of samples."""
    promtool, prometheus = promtool_binary(), prometheus_binary()
    if promtool is None or prometheus is None:
        raise RuntimeError("promtool/prometheus not found: run scripts/install-tools.sh")
    t = time.perf_counter()
    samples = write_openmetrics(workdir / "samples.om", [(s.name, p) for s in scens for p in series[s.name]])
    backfill(promtool, workdir / "samples.om", workdir / "tsdb")
    (workdir / "samples.om").unlink()
    seconds["backfill"] = time.perf_counter() - t
    days, empty, out = max(s.days for s in scens), np.zeros(0), []
    record_passes(promtool, prometheus, cfg, workdir, workdir / "tsdb", days,
                  "\n".join(e for rule in checked for e in rule.expressions), seconds)
    t = time.perf_counter()
    proc = start_prometheus(prometheus, workdir, workdir / "tsdb")
    try:
        with httpx.Client(trust_env=False, timeout=1200) as client:
            for rule in checked:
                parts = [active_times(client, proc.url, expr, rule.step_s, days) for expr in rule.expressions]
                out.append({s.name: firing_runs(parts[0].get(s.name, empty), parts[-1].get(s.name, empty)
                                                if rule.holds else empty, rule.step_s, rule.hold_s) for s in scens})
    finally:
        proc.stop()
    seconds["evaluate"] = time.perf_counter() - t
    return out, samples


def run(size: Size, cfg: MonitoringConfig | None = None, log: Any = print) -> Result:
    from specdecode_exporter.monitoring.build import dump_yaml

    cfg = cfg or monitoring_config.shipped()
    rng = np.random.default_rng(size.seed)
    scens = scenarios(size.month_days, size.drop_days, rng)
    traffic, seconds = Traffic(), {}
    t = time.perf_counter()
    series = {s.name: [simulate_pod(s, pod, traffic, rng) for pod in range(traffic.pods)] for s in scens}
    seconds["simulate"] = time.perf_counter() - t
    log(f"simulated {len(scens)} scenarios in {seconds['simulate']:.0f} s; backfilling and evaluating …")
    page = generated_page(cfg)
    before = baseline_page(page.step_s)
    with tempfile.TemporaryDirectory(prefix="specdecode-paging-") as tmp:
        workdir = Path(tmp)
        (runs, before_runs), samples = _evaluate([page, before], scens, series, workdir, seconds, cfg)
        t = time.perf_counter()
        rules_file = workdir / "specdecode.rules.yaml"
        rules_file.write_text(dump_yaml(rule_groups(cfg)))
        drops10 = next(s for s in scens if s.kind == "drops" and s.rate == 10.0)
        cross = cross_check(shutil.which("promtool") or "promtool", rules_file, workdir, drops10,
                            series[drops10.name], firing_times(runs[drops10.name], page.step_s), page)
        seconds["cross-check"] = time.perf_counter() - t
    group_interval = alertmanager_group_interval()
    outcomes = {s.name: outcome(s, pages(runs[s.name], group_interval), page.longest_window_s) for s in scens}
    olds = {s.name: outcome(s, pages(before_runs[s.name], group_interval), before.longest_window_s)
            for s in scens}
    return Result(page, outcomes, olds, cross, samples, group_interval, seconds)


def alertmanager_group_interval() -> float:
    """The example routing's group_interval (alerts/alertmanager.example.yml): flaps shorter are one page."""
    route = yaml.safe_load((ROOT / "alerts" / "alertmanager.example.yml").read_text())["route"]
    return duration_seconds(route.get("group_interval", "5m"))


def fmt_delay(seconds: float) -> str:
    if math.isnan(seconds):
        return "—"
    if math.isinf(seconds):
        return "never"
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.0f} min"


def fmt_missed(o: Outcome) -> str:
    missed = int(np.isinf(o.delays).sum())
    return f"{missed}/{o.delays.size}"


TABLE_HEADER = ["drafted tokens/s (2 pods)", "drops", "delay P50", "delay P95", "not paged", "pages per drop",
                "false pages / 30 d", "before: P50", "before: P95", "before: not paged", "before: false pages / 30 d"]


def _row(label: str, new: Outcome, new_false: float, old: Outcome, old_false: float) -> list[str]:
    return [label, str(new.delays.size), fmt_delay(new.delay(50)), fmt_delay(new.delay(95)), fmt_missed(new),
            f"{new.pages_per_drop.mean():.2f}", f"{new_false:g}", fmt_delay(old.delay(50)), fmt_delay(old.delay(95)),
            fmt_missed(old), f"{old_false:g}"]


def table_rows(result: Result) -> Iterator[list[str]]:
    """One row per rate (its drops, and false pages from its month at α 0.55 and its drops' healthy hours), then
    the pause row."""
    for rate in RATES:
        new, month = result.outcomes[f"drops-{rate:g}"], result.outcomes[f"month-{rate:g}"]
        old, old_month = result.before[f"drops-{rate:g}"], result.before[f"month-{rate:g}"]
        yield _row(f"{rate:g}", new, month.false_per_30d + new.false_per_30d,
                   old, old_month.false_per_30d + old.false_per_30d)
    new, old = result.outcomes["pause-10"], result.before["pause-10"]
    yield _row("10, then a 2 min pause", new, new.false_per_30d, old, old.false_per_30d)


def summary(result: Result) -> list[str]:
    """What the table's reader needs besides it: the rule, the pause's cost, the cross-check, the run."""
    pause, drops = result.outcomes["pause-10"], result.outcomes["drops-10"]
    cross = result.cross
    return [
        f"Evaluated every {result.rule.step_s:g} s (the groups' interval), `for: {result.rule.hold_s:g}s`; a page is "
        f"a firing that starts more than group_interval ({result.group_interval_s:g} s, the example routing) after "
        f"the last one ended; {result.samples:,} samples backfilled.",
        f"The 2-minute pause (starting 30 s after the drop) moved P50 by {pause.delay(50) - drops.delay(50):+.0f} s "
        f"and P95 by {pause.delay(95) - drops.delay(95):+.0f} s (the bound: the pause + 120 s = "
        f"{PAUSE_S + 120:.0f} s).",
        f"Cross-check, one drop at 10/s through `promtool test rules` with the generated rule file: "
        f"{cross.agree}/{cross.evaluations} evaluations agree ({cross.firing} firing in both).",
        "Wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items()) + ".",
    ]


DOCS = (ROOT / "docs" / "paging.md", ROOT / "alerts" / "runbook.md")
TABLE_BLOCK = re.compile(r"(<!-- paging-table:start -->\n).*?(<!-- paging-table:end -->)", re.DOTALL)


def update_docs(lines: Sequence[str]) -> list[Path]:
    """Put ``lines`` between the paging-table markers of docs/paging.md and the runbook; the files changed."""
    changed = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        new = TABLE_BLOCK.sub(lambda match: match.group(1) + "".join(f"{line}\n" for line in lines) + match.group(2),
                              text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", action="store_true", help=f"{LONG.describe()} (quick: {QUICK.describe()})")
    parser.add_argument("--seed", type=int, default=QUICK.seed)
    parser.add_argument("--update-docs", action="store_true",
                        help="write the table into docs/paging.md and alerts/runbook.md (between the paging-table "
                             "markers)")
    args = parser.parse_args(argv)
    size = LONG if args.long else QUICK
    size = Size(size.month_days, size.drop_days, args.seed)
    from bench.common import markdown_table

    started = time.perf_counter()
    result = run(size)
    table = [f"_{dt.datetime.now(dt.UTC):%Y-%m-%d}, bench/paging.py{' --long' if args.long else ''}: "
             f"{size.describe()}, seed {size.seed}._", "",
             *markdown_table(TABLE_HEADER, list(table_rows(result))), "", *summary(result)[:3]]
    print()
    for line in table:
        print(line)
    print(summary(result)[3])
    print(f"\nTotal {time.perf_counter() - started:.0f} s.")
    if args.update_docs:
        for path in update_docs(table):
            print(f"wrote the table into {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
