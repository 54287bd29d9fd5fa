"""The page with the measured variance against the page with the fixed bound, on traffic that scatters less or more
than the default assumes (issue 38; bench 7's rows by dispersion).

    .venv/bin/python bench/paging_variance.py                  # sd 0.1, 0.2, 0.3 at 10 drafted tokens/s
    .venv/bin/python bench/paging_variance.py --sds 0.1 0.3 --month-days 30 --drop-days 10

The traffic, scenarios and evaluation are bench/paging.py's (two pods, 30-token requests in drafts of 3 accepted as a
prefix, the requests' acceptance probability scattering with sd s around α; a month of α 0.55 with restarts and gaps,
then cycles of drops from 0.75 to 0.35; the samples backfilled into a real Prometheus that evaluates the rules), with
the request tap's counters simulated too: per pod the requests, Σ D, Σ A, Σ D², Σ A², Σ A·D of its requests.

Two pages are evaluated on the same samples:

* **fixed bound**: the generated page as it reads where no per-request data arrives (its measured variance's record
  taken out), whose variance per drafted token is the monitoring config's bound
  k̄(¼ − s²) + m·s² with s = 0.2, m = 30 (≈ 1.83 at k̄ = 3), whatever the traffic;
* **measured v**: the same page (windows, bars, vetoes, hysteresis unchanged), its variance replaced by the upper
  bound of v measured over the last ``--variance-window`` of the tap's sums of all pods (never below α̂(1 − α̂)),
  the configured bound where that window holds fewer than statistics.min_requests requests: what
  ``monitoring.variance.page_variance`` computes, and what the rules' record of it gives the page.

Evaluating the builder's expression inline (six increase() over an hour, each read many times, in each of the five
page windows) at every 15 s of a month takes Prometheus hours, so the bench computes the measured variance at each
evaluation instant with ``core.stats.dispersion.page_variance`` from the same sums (each pod's counters between the last
samples at or before the window's ends, resets counted from 0) and backfills it as a series beside the counters; the
measured page reads that series, `or` the configured variance. The cross-check evaluates the builder's PromQL on the
samples over a day and compares (tests/rules/test_variance_promtool.py checks the builder against
core.stats.dispersion too).

Delay to the notification: the page route of the example Alertmanager config has no group_wait (0 s), so a page's
notification leaves with the evaluation that fires it; the delay to the notification is the delay to firing plus
delivery (milliseconds on a webhook).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from bench import paging  # noqa: E402
from bench.paging import (  # noqa: E402
    DAY,
    PodSeries,
    Rule,
    Scenario,
    Traffic,
    drop_times,
    fmt_delay,
    fmt_missed,
    generated_page,
    inline_records,
    month_events,
    outcome,
)
from devtools.procs import prometheus_binary, promtool_binary  # noqa: E402
from specdecode_exporter.core.config.validation import duration_seconds  # noqa: E402
from specdecode_exporter.core.contract import metrics as m  # noqa: E402
from specdecode_exporter.core.contract import monitoring_config  # noqa: E402
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig  # noqa: E402
from specdecode_exporter.core.stats import dispersion  # noqa: E402
from specdecode_exporter.core.stats.dispersion import Moments  # noqa: E402
from specdecode_exporter.monitoring import rules, tunables, variance  # noqa: E402
from specdecode_exporter.monitoring.promql import by  # noqa: E402
from specdecode_exporter.monitoring.rules import VARIANCE_OFFSET, VARIANCE_WINDOW  # noqa: E402

RATE = 10.0
Floats = npt.NDArray[np.float64]
SUMS = (m.REQUESTS, m.REQUEST_DRAFT_TOKENS, m.REQUEST_ACCEPTED_TOKENS, m.REQUEST_DRAFT_TOKENS_SQUARED,
        m.REQUEST_ACCEPTED_TOKENS_SQUARED, m.REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT)


def measured_bound(cfg: MonitoringConfig, variance_window: str, offset: str | None = None) -> str:
    """The builder's measured upper bound over ``variance_window`` of the tap's sums (absent with too few requests):
    what the page's rule will read, evaluated here only for the cross-check."""
    labels = by(cfg.level_labels())
    shift = f" offset {offset}" if offset else ""
    sums = variance.WindowSums(*(f"sum by ({labels}) (increase({spec.exposed_name}[{variance_window}]{shift}))"
                                 for spec in SUMS))
    return variance.upper_bound(sums, cfg.statistics.min_requests)


VARIANCE_SERIES = "bench_page_variance_per_draft_token"  # the measured bound, computed by the bench (docstring)


def _page_variance(cfg: MonitoringConfig, name: str, bound: str) -> Rule:
    """The generated page with the rules' measured bound (rules.variance_record, a recorded series) replaced by
    ``bound``; everything else unchanged (where ``bound`` has no sample, each window's assumed variance)."""
    fixed = generated_page(cfg)
    records = {**paging.inlined_records(cfg), rules.variance_record(cfg, "bound"): bound}
    values = tunables.mapping(cfg)
    proof, holds = tunables.fill(rules.page_proof(cfg), values), tunables.fill(rules.page_holds(cfg), values)
    # The stage's records are recorded into the bench's TSDB first (paging.record_passes); the rest inlined.
    return Rule(name, inline_records(proof, records), fixed.hold_s, fixed.step_s, fixed.longest_window_s,
                inline_records(holds, records))


def measured_page(cfg: MonitoringConfig) -> Rule:
    """The generated page with the measured bound the bench's series of it, else each window's assumed variance."""
    return _page_variance(cfg, "measured", f"max by ({by(cfg.level_labels())}) ({VARIANCE_SERIES})")


def fixed_page(cfg: MonitoringConfig) -> Rule:
    """The generated page with the assumed variance only: the page where no per-request data arrives."""
    return _page_variance(cfg, "fixed", "vector(0) < 0")


def running_count(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """A counter's samples as one running count: where it went down it restarted from 0."""
    steps = np.diff(values, prepend=0.0)
    out: npt.NDArray[np.float64] = np.cumsum(np.where(steps < 0, values, steps))
    return out


def window_sums(pods: list[PodSeries], times: npt.NDArray[np.float64], seconds: float
                ) -> dict[str, npt.NDArray[np.float64]]:
    """Each sum over (t − seconds, t] at each of ``times``, all pods together: each pod's running count at its last
    sample at or before t, less that at or before t − seconds."""
    out = {}
    for spec in SUMS:
        total = np.zeros(times.size)
        for pod in pods:
            count = running_count(pod.values[spec.exposed_name])
            for sign, at in ((1.0, times), (-1.0, times - seconds)):
                index = np.searchsorted(pod.times, at, side="right") - 1
                total += sign * np.where(index >= 0, count[np.clip(index, 0, None)], 0.0)
        out[spec.exposed_name] = total
    return out


def variance_series(pods: list[PodSeries], days: float, step_s: float, seconds: float, min_requests: float,
                    offset_s: float = 0.0) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(times, values) of the measured page variance at every evaluation instant where it is measured (over the
    window ending ``offset_s`` before the instant)."""
    times = np.arange(0.0, days * DAY, step_s)
    sums = window_sums(pods, times - offset_s, seconds)
    columns = [sums[spec.exposed_name].tolist() for spec in SUMS]
    kept_t, kept_v = [], []
    for i, row in enumerate(zip(*columns, strict=True)):
        found = dispersion.page_variance(Moments(*row), min_requests, math.nan)
        if found.source == "measured":
            kept_t.append(times[i])
            kept_v.append(found.value)
    return np.array(kept_t), np.array(kept_v)


def append_gauge(path: Path, name: str, series: dict[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]
                 ) -> None:
    """Add a gauge family to bench/paging.py's OpenMetrics file (before its # EOF)."""
    eof = b"# EOF\n"
    with path.open("r+b") as out:
        out.seek(-len(eof), 2)
        if out.read() != eof:
            raise RuntimeError("the OpenMetrics file does not end with # EOF")
        out.seek(-len(eof), 2)
        out.truncate()
        out.write(f"# TYPE {name} gauge\n".encode())
        for model, (times, values) in series.items():
            labels = f'{{namespace="{paging.NAMESPACE}",model_name="{model}"}}'
            stamps = (paging.T0 + times).astype(np.int64).tolist()
            out.write("".join(f"{name}{labels} {v!r} {t}\n" for v, t in zip(values.tolist(), stamps, strict=True))
                      .encode())
        out.write(eof)


def true_variance(alpha: float, traffic: Traffic) -> float:
    """v of the simulated requests at α: Var(A) / D (every request drafts D tokens)."""
    pmf = paging.request_pmf(alpha, traffic)
    values = np.arange(pmf.size, dtype=np.float64)
    return float(pmf @ values**2 - (pmf @ values) ** 2) / traffic.tokens_per_request


@dataclass(frozen=True, slots=True)
class Case:
    sd: float
    month: Scenario
    drops: Scenario

    def model(self, scenario: Scenario) -> str:
        return f"sd{self.sd:g}-{scenario.name}"


def cases(sds: list[float], month_days: float, drop_days: float, rng: np.random.Generator) -> list[Case]:
    bad = paging.BAD_PHASE_S[RATE]
    return [Case(sd, Scenario("month", RATE, month_days, events=month_events(month_days)),
                 Scenario("drops", RATE, drop_days, drop_times(drop_days, bad, rng), bad)) for sd in sds]


@dataclass(frozen=True, slots=True)
class CrossCheck:
    """The builder's PromQL against the bench's series of the measured variance, over a stretch of one model."""

    model: str
    evaluations: int
    max_relative_difference: float


Runs = dict[str, list[tuple[float, float]]]


def evaluate(rules_: list[Rule], series: dict[str, list[PodSeries]], variances: dict[str, tuple[Floats, Floats]],
             days: float, workdir: Path, check: tuple[str, str, float]) -> tuple[list[Runs], CrossCheck]:
    """Backfill, start Prometheus, and per rule the firing stretches per model (bench/paging.py's evaluation); then
    the builder's expression (``check``: the model, its PromQL, the span in seconds) against the series."""
    promtool, prometheus = promtool_binary(), prometheus_binary()
    if promtool is None or prometheus is None:
        raise RuntimeError("promtool/prometheus not found: run scripts/install-tools.sh")
    paging.write_openmetrics(workdir / "samples.om", [(name, pod) for name, pods in series.items() for pod in pods])
    append_gauge(workdir / "samples.om", VARIANCE_SERIES, variances)
    paging.backfill(promtool, workdir / "samples.om", workdir / "tsdb")
    (workdir / "samples.om").unlink()
    paging.record_passes(promtool, prometheus, monitoring_config.shipped(), workdir, workdir / "tsdb", days,
                         "\n".join(e for rule in rules_ for e in rule.expressions), {})
    proc = paging.start_prometheus(prometheus, workdir, workdir / "tsdb")
    empty, out = np.zeros(0), []
    try:
        with httpx.Client(trust_env=False, timeout=1800) as client:
            for rule in rules_:
                parts = [paging.active_times(client, proc.url, expr, rule.step_s, days) for expr in rule.expressions]
                out.append({name: paging.firing_runs(parts[0].get(name, empty), parts[-1].get(name, empty)
                                                     if rule.holds else empty, rule.step_s, rule.hold_s)
                            for name in series})
            cross = cross_check(client, proc.url, variances, *check)
    finally:
        proc.stop()
    return out, cross


def cross_check(client: httpx.Client, url: str, variances: dict[str, tuple[Floats, Floats]], model: str,
                expr: str, span_s: float) -> CrossCheck:
    """The builder's expression evaluated by Prometheus every minute over ``span_s`` from the start of the day
    after the first, against the bench's values at the same instants."""
    start = paging.T0 + DAY
    resp = client.post(url + "/api/v1/query_range", data={
        "query": expr, "start": f"{start:.0f}", "end": f"{start + span_s:.0f}", "step": "60"})
    resp.raise_for_status()
    [result] = [r for r in resp.json()["data"]["result"] if r["metric"].get("model_name") == model]
    times, values = variances[model]
    lookup = dict(zip(np.round(times).astype(np.int64).tolist(), values.tolist(), strict=True))
    diffs = [abs(float(v) / lookup[round(float(t)) - paging.T0] - 1) for t, v in result["values"]
             if round(float(t)) - paging.T0 in lookup]
    return CrossCheck(model, len(diffs), max(diffs) if diffs else math.nan)


HEADER = ["traffic at 10 drafted tokens/s", "v (true, α 0.55)", "page's variance", "drops", "delay P50",
          "delay P95", "to the notification P95", "not paged", "false pages / 30 d"]


def run(sds: list[float], month_days: float, drop_days: float, variance_window: str, seed: int,
        log: Callable[[str], object] = print, offset: str | None = None) -> list[list[str]]:
    cfg = monitoring_config.shipped()
    rng = np.random.default_rng(seed)
    all_cases = cases(sds, month_days, drop_days, rng)
    series: dict[str, list[PodSeries]] = {}
    for case in all_cases:
        traffic = Traffic(request_sd=case.sd, tap=True)
        for scenario in (case.month, case.drops):
            series[case.model(scenario)] = [paging.simulate_pod(scenario, pod, traffic, rng)
                                            for pod in range(traffic.pods)]
    fixed, measured = fixed_page(cfg), measured_page(cfg)
    seconds = duration_seconds(variance_window)
    offset_s = duration_seconds(offset) if offset else 0.0
    variances = {name: variance_series(pods, max(month_days, drop_days), fixed.step_s, seconds,
                                       cfg.statistics.min_requests, offset_s) for name, pods in series.items()}
    group_interval = paging.alertmanager_group_interval()
    started = time.perf_counter()
    check = (all_cases[0].model(all_cases[0].month), measured_bound(cfg, variance_window, offset), 6 * 3600.0)
    with tempfile.TemporaryDirectory(prefix="specdecode-paging-variance-") as tmp:
        runs, cross = evaluate([fixed, measured], series, variances, max(month_days, drop_days), Path(tmp), check)
    log(f"evaluated in {time.perf_counter() - started:.0f} s; cross-check, {cross.model}: the builder's PromQL "
        f"and the bench's series of the measured variance differ by at most {cross.max_relative_difference:.2%} "
        f"over {cross.evaluations} evaluations (increase() extrapolates to the window's ends; the bench does not)")
    assumed = cfg.statistics.dispersion.variance_per_token(3.0)
    rows = []
    for case in all_cases:
        v = true_variance(paging.NEAR, Traffic(request_sd=case.sd))
        for label, rule, stretches in (("measured v", measured, runs[1]), ("fixed bound", fixed, runs[0])):
            month = outcome(case.month, paging.pages(stretches[case.model(case.month)], group_interval),
                            rule.longest_window_s)
            drops = outcome(case.drops, paging.pages(stretches[case.model(case.drops)], group_interval),
                            rule.longest_window_s)
            false = month.false_per_30d + drops.false_per_30d
            over = f"{variance_window} offset {offset}" if offset else variance_window
            source = (f"measured over {over}" if label == "measured v"
                      else f"fixed {assumed:.2f}")
            rows.append([f"sd {case.sd:g}, {label}", f"{v:.2f}", source, str(drops.delays.size),
                         fmt_delay(drops.delay(50)), fmt_delay(drops.delay(95)),
                         fmt_delay(drops.delay(95) + page_group_wait()), fmt_missed(drops), f"{false:g}"])
    return rows


def page_group_wait() -> float:
    """The example Alertmanager config's group_wait for the page (the route of severity critical)."""
    route = yaml.safe_load((ROOT / "alerts" / "alertmanager.example.yml").read_text())["route"]
    pager = next(r for r in route.get("routes", []) if any("critical" in s for s in r.get("matchers", [])))
    return duration_seconds(pager.get("group_wait", route.get("group_wait", "30s")), allow_zero=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sds", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    parser.add_argument("--month-days", type=float, default=30.0)
    parser.add_argument("--drop-days", type=float, default=10.0)
    parser.add_argument("--variance-window", default=VARIANCE_WINDOW, help="the shipped rules' window by default")
    parser.add_argument("--variance-offset", default=VARIANCE_OFFSET,
                        help="the variance's window ends this long before (the shipped rules' offset by default; "
                             "'0' for none)")
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args(argv)
    from bench.common import markdown_table

    started = time.perf_counter()
    offset = None if args.variance_offset in ("", "0") else args.variance_offset
    rows = run(args.sds, args.month_days, args.drop_days, args.variance_window, args.seed, offset=offset)
    print(f"_{dt.datetime.now(dt.UTC):%Y-%m-%d}, bench/paging_variance.py: {args.month_days:g} days of α "
          f"{paging.NEAR} and {args.drop_days:g} days of drops per traffic, seed {args.seed}, v measured over "
          f"{args.variance_window}{' offset ' + offset if offset else ''}._\n")
    for line in markdown_table(HEADER, rows):
        print(line)
    print(f"\nTotal {time.perf_counter() - started:.0f} s ({DAY:g} s a day simulated).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
