"""A fleet through one real Prometheus: series, memory and rule-evaluation time per 100 pods, the sidecar's page
against vLLM's own.

    .venv/bin/python -m bench.fleet                 # quick: 100, 500, 1000 pods, scraped every 15 s, held 30 s
    .venv/bin/python -m bench.fleet --size long     # the same pods, held 2 minutes each
    .venv/bin/python -m bench.fleet --size smoke    # 5 and 10 pods (tests/bench): proves it runs, figures mean nothing
    .venv/bin/python -m bench.fleet --size steady   # rules on full 2h windows, 100 pods (bench.fleet_steady)

`make bench` runs it through bench/run.py (section 8 of bench/results.md).

One pod's page is real: the sidecar process (`specdecode-exporter run`, the request tap on) against the project's
simulator (`specdecode-exporter simulate`), with streamed and plain completions through the tap over 12 workloads
(the default keeps 10 and counts the rest as "other") × 3 temperature bands, then one GET of its /metrics: whatever
the code exports at that moment, nothing counted by hand. The baseline is vLLM 0.32's own exposition, captured
from a real vLLM (tests/fixtures/captured_vllm_cpu_0.32.0_ngram.prom).

Pods are not processes: one loopback HTTP server serves the page at /pod/0 … /pod/N-1, and Prometheus scrapes each
path as its own target with the labels a Kubernetes pod would get (namespace, pod, instance). Pods serve one of
ten models (the page's model_name rewritten), and every counter, histogram and summary sample moves with time
(scaled by 1 + t / 60 s, so ratios such as α stay what the sidecar measured and every rate() has a value).

Each (page, pod count) gets a fresh Prometheus (Debian's, 2.42 here) with the generated rules
(alerts/specdecode-*.rules.yaml), scrape and evaluation interval as the size says. After every target is up and the
hold has passed, the figures come from Prometheus itself: prometheus_tsdb_head_series, process_resident_memory_bytes,
go_memstats_heap_inuse_bytes, prometheus_rule_group_last_duration_seconds summed over the groups (the median of
one sample per interval), prometheus_rule_evaluation_failures_total, and scrape_duration_seconds of the targets.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from bench import fleet_steady  # noqa: E402
from bench.common import markdown_table  # noqa: E402
from bench.fleet_common import (  # noqa: E402
    JOBS,
    RULE_WAIT_S,
    SIDECAR,
    UP_WAIT_S,
    VLLM,
    VLLM_PAGE,
    Measurement,
    MovingPage,
    PodServer,
    Size,
    own_metric,
    prometheus_config,
    rule_groups_in_file,
    scalar,
    sidecar_page,
    start_prometheus,
    wait_until,
)
from devtools.procs import (  # noqa: E402
    Process,
    prometheus_binary,
)

MEMORY_SHARE = 0.6  # a fleet is skipped if its Prometheus would need more than this share of the available memory


SMOKE = Size("smoke", (5, 10), 1.0, 4.0)
QUICK = Size("quick", (100, 500, 1000), 15.0, 30.0)
LONG = Size("long", (100, 500, 1000), 15.0, 120.0)
SIZES = {s.name: s for s in (SMOKE, QUICK, LONG)}


# ------------------------------------------------------------------------------------------ one Prometheus


def measure(page_name: str, page: MovingPage, pods: int, size: Size, workdir: Path) -> Measurement:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{page_name}-{pods}-", dir=workdir))
    with PodServer(page) as server:
        prom = start_prometheus(run_dir, prometheus_config(f"127.0.0.1:{server.port}", JOBS[page_name], pods,
                                                           size.interval_s, size.rules(run_dir / "rules.yaml")))
        try:
            return _observe(prom, page_name, pods, size, rule_groups_in_file())
        finally:
            prom.stop()


def _observe(prom: Process, page_name: str, pods: int, size: Size, groups: int) -> Measurement:
    with httpx.Client(base_url=prom.url, timeout=120, trust_env=False) as client:
        # A fleet this machine cannot scrape in time is measured as it is: the table says how many targets were up.
        wait_until(lambda: scalar(client, "count(up)") >= pods, 3 * size.interval_s + UP_WAIT_S)
        rule_sums = _rule_durations(client, size, groups)
        own = {name: own_metric(client, name) for name in (
            "prometheus_tsdb_head_series", "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes",
            "prometheus_rule_evaluation_failures_total", "prometheus_rule_group_last_evaluation_timestamp_seconds",
            "prometheus_rule_group_last_evaluation_samples")}
        span = f"{size.hold_s:g}s"
        return Measurement(
            page=page_name, pods=pods, targets_up=int(scalar(client, "count(up == 1)")),
            series_per_pod=scalar(client, "max(scrape_samples_scraped)"),
            head_series=int(sum(own["prometheus_tsdb_head_series"])),
            rss_mb=sum(own["process_resident_memory_bytes"]) / 2**20,
            heap_inuse_mb=sum(own["go_memstats_heap_inuse_bytes"]) / 2**20,
            rule_seconds=statistics.median(rule_sums) if rule_sums else float("nan"),
            rule_groups=sum(1 for t in own["prometheus_rule_group_last_evaluation_timestamp_seconds"] if t > 0),
            rule_samples=int(sum(own["prometheus_rule_group_last_evaluation_samples"])),
            rule_failures=int(sum(own["prometheus_rule_evaluation_failures_total"])),
            scrape_p50_s=scalar(client, f"quantile(0.5, avg_over_time(scrape_duration_seconds[{span}]))"),
            scrape_max_s=scalar(client, f"max(max_over_time(scrape_duration_seconds[{span}]))"))


def _rule_durations(client: httpx.Client, size: Size, groups: int) -> list[float]:
    """All groups' last evaluation time, summed, once per interval over the hold; only the samples taken once every
    group has finished an evaluation count (a large fleet's first evaluations can outlast the hold: then it waits,
    up to RULE_WAIT_S more)."""
    complete: list[float] = []
    started = time.monotonic()
    while True:
        time.sleep(size.interval_s)
        stamps = own_metric(client, "prometheus_rule_group_last_evaluation_timestamp_seconds")
        if sum(1 for t in stamps if t > 0) >= groups:
            complete.append(sum(own_metric(client, "prometheus_rule_group_last_duration_seconds")))
        elapsed = time.monotonic() - started
        if (elapsed >= size.hold_s and len(complete) >= 2) or elapsed >= size.hold_s + RULE_WAIT_S:
            return complete


# -------------------------------------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True)
class Result:
    measurements: tuple[Measurement, ...]
    page_kib: dict[str, float]
    groups_in_file: int
    skipped: tuple[Skipped, ...] = ()

    def of(self, page: str) -> list[Measurement]:
        return [m for m in self.measurements if m.page == page]

    def at(self, page: str, pods: int) -> Measurement:
        return next(m for m in self.measurements if m.page == page and m.pods == pods)


def run(size: Size, log: Callable[[str], None] = print) -> Result:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        workdir = Path(tmp)
        pages = {SIDECAR: MovingPage.parse(sidecar_page(workdir).decode()),
                 VLLM: MovingPage.parse(VLLM_PAGE.read_text(encoding="utf-8"))}
        measurements: list[Measurement] = []
        skipped: list[Skipped] = []
        for pods in size.pods:
            for name in (VLLM, SIDECAR):  # the baseline first at each size, the same machine minutes apart
                need_mb = _predicted_rss_mb([m for m in measurements if m.page == name], pods)
                available_mb = available_memory_mb()
                if need_mb > MEMORY_SHARE * available_mb:
                    skipped.append(Skipped(name, pods, need_mb, available_mb))
                    log(f"fleet: {name} × {pods} pods skipped: ~{need_mb:.0f} MB needed, {available_mb:.0f} MB free")
                    continue
                started = time.perf_counter()
                measurements.append(measure(name, pages[name], pods, size, workdir))
                log(f"fleet: {name} × {pods} pods measured in {time.perf_counter() - started:.0f} s")
    return Result(tuple(measurements), {k: len(p.render(0, 0)) / 1024 for k, p in pages.items()},
                  rule_groups_in_file(), tuple(skipped))


@dataclass(frozen=True, slots=True)
class Skipped:
    """A fleet not run because its Prometheus would not fit in the machine's available memory."""

    page: str
    pods: int
    need_mb: float
    available_mb: float


def _predicted_rss_mb(smaller: Sequence[Measurement], pods: int) -> float:
    """Prometheus' RSS for ``pods``, extrapolated linearly (with a margin) from the largest fleet of the same page."""
    if not smaller:
        return 0.0
    return 1.3 * smaller[-1].rss_mb * pods / smaller[-1].pods


def available_memory_mb() -> float:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


def prometheus_version() -> str:
    """`prometheus --version`'s version, e.g. 2.42.0 (the one the run used)."""
    binary = prometheus_binary()
    if binary is None:
        return "(not found)"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r"version (\S+)", out.stdout + out.stderr)
    return found.group(1) if found else "(unknown version)"


TABLE_HEADER = ["page", "pods", "targets up", "series per pod (scraped)", "head series", "per 100 pods", "RSS",
                "per 100 pods", "heap in use", "per 100 pods", "rule evaluation (all groups)", "per 100 pods",
                "groups evaluated", "rule samples", "rule failures", "scrape p50", "scrape max"]


def table_rows(result: Result) -> Iterator[list[str]]:
    for m in result.measurements:
        yield [m.page, str(m.pods), str(m.targets_up), f"{m.series_per_pod:.0f}", str(m.head_series),
               f"{m.per_100(m.head_series):.0f}", f"{m.rss_mb:.0f} MB", f"{m.per_100(m.rss_mb):.1f} MB",
               f"{m.heap_inuse_mb:.0f} MB", f"{m.per_100(m.heap_inuse_mb):.1f} MB",
               f"{1000 * m.rule_seconds:.0f} ms", f"{m.per_100(1000 * m.rule_seconds):.1f} ms",
               f"{m.rule_groups}/{result.groups_in_file}", str(m.rule_samples), str(m.rule_failures),
               f"{1000 * m.scrape_p50_s:.0f} ms", f"{1000 * m.scrape_max_s:.0f} ms"]
    for skip in result.skipped:
        yield [skip.page, str(skip.pods), f"skipped: ~{skip.need_mb / 1024:.1f} GB needed, "
               f"{skip.available_mb / 1024:.1f} GB available", *("—" for _ in TABLE_HEADER[3:])]


def slope_table(result: Result) -> list[str]:
    """What 100 more pods cost, from the smallest to the largest fleet that every target of both pages answered
    (Prometheus' fixed cost taken out); with one such fleet, its figures per 100 pods."""
    sizes = comparable_sizes(result)
    if not sizes:
        return ["No fleet size had every target up for both pages: no per-100-pod comparison."]
    first, last = sizes[0], sizes[-1]
    label = (f"per 100 more pods ({first} → {last})" if last > first
             else f"per 100 pods (at {first}, the only size with every target up)")
    figures: list[tuple[str, Callable[[Measurement], float], str]] = [
        ("head series", lambda m: m.head_series, "{:.0f}"), ("RSS", lambda m: m.rss_mb, "{:.1f} MB"),
        ("heap in use", lambda m: m.heap_inuse_mb, "{:.1f} MB"),
        ("rule evaluation", lambda m: 1000 * m.rule_seconds, "{:.0f} ms")]
    rows = []
    for name, value, spec in figures:
        vllm, sidecar = (_slope(result.at(page, first), result.at(page, last), value) for page in (VLLM, SIDECAR))
        rows.append([name, spec.format(vllm), spec.format(sidecar), f"**{sidecar / vllm:.2f}×**" if vllm > 0 else "—"])
    return markdown_table([label, "vLLM's own page", "sidecar's page", "sidecar / vLLM"], rows)


def comparable_sizes(result: Result) -> list[int]:
    """The fleet sizes at which every target of both pages was up."""
    return sorted(set.intersection(*({m.pods for m in result.of(page) if m.targets_up == m.pods}
                                     for page in (VLLM, SIDECAR))))


def _slope(first: Measurement, last: Measurement, value: Callable[[Measurement], float]) -> float:
    if last.pods == first.pods:
        return last.per_100(value(last))
    return (value(last) - value(first)) * 100 / (last.pods - first.pods)


def summary(result: Result) -> list[str]:
    sidecar, vllm = result.of(SIDECAR), result.of(VLLM)
    if not sidecar or not vllm:
        return ["No fleet size was measured for both pages."]
    evaluated = all(m.rule_failures == 0 and m.rule_groups == result.groups_in_file for m in result.measurements)
    rules = (f"all {result.groups_in_file} evaluated in every run, without failures" if evaluated
             else "**not all evaluated, or some failed** (see the table)")
    behind = [f"{m.page} × {m.pods} ({m.targets_up} up)" for m in result.measurements if m.targets_up < m.pods]
    scrapes = ("every target up in every run" if not behind else
               f"**this machine's Prometheus could not scrape every target in time**: {', '.join(behind)}; those "
               "rows hold only the targets it reached and are left out of the comparison")
    return [f"The sidecar's page: {sidecar[-1].series_per_pod:.0f} series per pod "
            f"({result.page_kib[SIDECAR]:.0f} KiB), {sidecar[-1].series_per_pod / vllm[-1].series_per_pod:.2f}× vLLM's "
            f"own {vllm[-1].series_per_pod:.0f} ({result.page_kib[VLLM]:.0f} KiB). Rule groups: {rules}; {scrapes}."]


def report(result: Result) -> list[str]:
    return [*markdown_table(TABLE_HEADER, list(table_rows(result))), "",
            *slope_table(result), "", *summary(result)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="quick", choices=sorted([*SIZES, *fleet_steady.SIZES]))
    args = parser.parse_args()
    if args.size in fleet_steady.SIZES:
        return fleet_steady.main(fleet_steady.SIZES[args.size])
    size = SIZES[args.size]
    print(size.describe(), flush=True)
    started = time.perf_counter()
    for line in report(run(size)):
        print(line)
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
