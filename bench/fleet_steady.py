"""Rule evaluation at steady state: the fleet's rules evaluated on full windows, the sidecar's page against vLLM's.

    .venv/bin/python -m bench.fleet --size steady          # 100 pods scraped every 15 s, the rules as shipped
    .venv/bin/python -m bench.fleet --size steady-15s      # the same with the window groups every 15 s too
    .venv/bin/python -m bench.fleet --size steady-smoke    # 2 pods every 5 s (tests/bench): figures mean nothing
    .venv/bin/python -m bench.fleet --size steady-fleet    # 100 and 1,000 pods, the rules as shipped

bench.fleet holds each Prometheus 30 s (2 minutes with --size long), so the rules' 1h and 2h windows hold a few
samples and the rule evaluation it measures is a fresh Prometheus' cost, not the one a user pays from the second
hour on. Here every window the rules read over a page's series is full from the first evaluation: before
Prometheus starts, the pods' history over the rules' longest range (offset included) is written at the scrape
interval as OpenMetrics, from the same moving page and clock as the pod server (fleet_common.PodServer), and turned
into TSDB blocks by `promtool tsdb create-blocks-from openmetrics`. Prometheus then starts on those blocks with the
generated rules and scrapes the live pods, whose series go on from the history's last sample (a gap of at most about
one interval). Only the series the rules read are written: Prometheus selects by metric name first, so the others
cannot change rule evaluation, and vLLM's page has none (the rules read the sidecar's series), so its run is the
rules' fixed cost on a fleet of the same size.

Figures, once every group has evaluated with every target up: each group's prometheus_rule_group_last_duration_seconds
(the median of one sample per interval over the hold), summed over the groups (one evaluation round: wall times of
groups that run concurrently, so on a busy machine they include waiting for CPU), Prometheus' CPU over the hold
(process_cpu_seconds_total; the scrapes are the same for both pages, so the difference is the rules), the samples
the longest window holds per series (query count_over_time, proof the history landed), compactions during the hold,
missed iterations (prometheus_rule_group_iterations_missed_total) and rule failures. The figures at 1000 pods are
extrapolated, and said so. Ranges over the rules' own records (the 1-day baseline reads a per-model record over
[1d] offset 1h) are not backfilled: they hold this run's evaluations only; they are per model, not per pod.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from bench import fleet_common
from bench.common import markdown_table
from bench.fleet_common import duration_s
from devtools.procs import Process, child_env, promtool_binary
from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.monitoring import stage

STEADY = fleet_common.Size("steady", (100,), 15.0, 120.0, shipped_intervals=True)  # two evaluations of the 1m groups
# The same with every window group at the 15 s interval too (what the rules cost before they carried their own).
STEADY_15S = fleet_common.Size("steady-15s", (100,), 15.0, 120.0)
STEADY_SMOKE = fleet_common.Size("steady-smoke", (2,), 5.0, 10.0)
# 100 and 1,000 pods on full windows: since the rules read no raw range, only the records' history is long.
STEADY_FLEET = fleet_common.Size("steady-fleet", (100, 1000), 15.0, 120.0, shipped_intervals=True)
SIZES = {s.name: s for s in (STEADY, STEADY_15S, STEADY_SMOKE, STEADY_FLEET)}
RANGE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\[((?:\d+(?:ms|[smhdwy]))+)\]"
                   r"(?:\s+offset\s+((?:\d+(?:ms|[smhdwy]))+))?")
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
POD_SLOT = "\x00"  # where a history line's pod labels go, filled per pod
PROMTOOL_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class RuleReads:
    """What the rules read of one page: the sample names, and the longest range over them (offset included)."""

    names: frozenset[str]
    longest_s: float  # the longest raw range (0: the rules read the pods' series only a step back)
    longest_selector: str  # as the rules write it, e.g. specdecode_draft_tokens_total[2h]
    proof_selector: str  # the longest range whose samples prove the windows full: longest_selector, else a record's
    proof_s: float
    proof_step_s: float | None  # the interval of the proof's record's group (None: the scrape interval)
    record_ranges: tuple[str, ...]  # ranges over the rules' own records, e.g. model:x:rate1h[1d] offset 1h


def rule_reads(rules_yaml: str, page_names: frozenset[str]) -> RuleReads:
    rules = [rule for group in yaml.safe_load(rules_yaml)["groups"] for rule in group["rules"]]
    exprs = [rule["expr"] for rule in rules]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    names = frozenset(name for expr in exprs for name in IDENTIFIER.findall(expr)) & page_names
    longest, selector, records = 0.0, "", set()
    for expr in exprs:
        for match in RANGE.finditer(expr):
            name, window, offset = match.groups()
            if name in recorded:
                records.add(f"{name}[{window}]" + (f" offset {offset}" if offset else ""))
            elif name in page_names and duration_s(window) + duration_s(offset or "") > longest:
                longest = duration_s(window) + duration_s(offset or "")
                selector = f"{name}[{window}]" + (f" offset {offset}" if offset else "")
    proof, proof_s, proof_step = selector, longest, None
    steps = record_intervals(rules_yaml)
    for record in records:
        if (" offset " not in record and not record.startswith(stage.CLOCK)  # a clock per stage group: not one series
                and (span := duration_s(record.split("[", 1)[1])) > proof_s):
            proof, proof_s, proof_step = record, span, steps[record.split("[", 1)[0]]
    return RuleReads(names, longest, selector, proof, proof_s, proof_step, tuple(sorted(records)))


def record_intervals(rules_yaml: str) -> dict[str, float]:
    """Each record's group interval in seconds (a group without one: the ruler's default, 1m)."""
    return {rule["record"]: duration_s(group.get("interval") or "1m")
            for group in yaml.safe_load(rules_yaml)["groups"] for rule in group["rules"] if "record" in rule}


def sample_names(page: fleet_common.MovingPage) -> frozenset[str]:
    return frozenset(prefix.split("{", 1)[0] for prefix, value, _ in page.lines if value is not None)


# ----------------------------------------------------------------------------------------------- the history


@dataclass(frozen=True, slots=True)
class History:
    """The pods' past as the pod server would have served it: every ``step_s`` from ``origin`` (the page's second 0)."""

    page: fleet_common.MovingPage
    names: frozenset[str]
    job: str
    pods: int
    origin: int
    step_s: int

    def block(self, timestamp: int, model: int) -> str:
        """One scrape of one model's page at ``timestamp``: the read series, OpenMetrics lines with a pod slot."""
        factor = 1.0 + (timestamp - self.origin) / fleet_common.RAMP_S
        renamed = self.page.model_label[:-1] + f'-{model}"'
        lines = []
        for prefix, value, grows in self.page.lines:
            if value is None or prefix.split("{", 1)[0] not in self.names:
                continue
            labelled = (prefix[:-1].replace(self.page.model_label, renamed) + ("," if not prefix.endswith("{}") else "")
                        if prefix.endswith("}") else prefix + "{")
            lines.append(f"{labelled}{POD_SLOT}}} {value * factor if grows else value!r} {timestamp}\n")
        return "".join(lines)

    def pod_labels(self) -> list[str]:
        return [",".join(f'{key}="{value}"' for key, value in {"job": self.job, **fleet_common.pod_labels(n)}.items())
                for n in range(self.pods)]

    def write(self, path: Path, steps: range) -> int:
        """Write the scrapes at ``origin + k * step_s`` for k in ``steps``; return the samples written."""
        labels = self.pod_labels()
        written = 0
        with path.open("w", encoding="utf-8") as out:
            for k in steps:
                for model in range(fleet_common.MODELS):
                    block = self.block(self.origin + k * self.step_s, model)
                    for pod in range(model, self.pods, fleet_common.MODELS):
                        out.write(block.replace(POD_SLOT, labels[pod]))
                        written += block.count("\n")
            out.write("# EOF\n")
        return written


LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class RecordHistory:
    """The past of the records the rules read over a range (the stage's, the 1-day baseline's), as the ruler would
    have written them over the fleet: each record's label sets from the pods' pages, one sample per evaluation. The
    values do not change what a range over them costs; the series and samples do."""

    series: tuple[tuple[str, int, float], ...]  # (record{labels}, evaluation interval s, range s) per series
    origin: int

    @classmethod
    def of(cls, page: fleet_common.MovingPage, job: str, pods: int, rules_yaml: str, now: int) -> RecordHistory:
        cfg = monitoring_config.shipped()
        reads: dict[str, float] = {}
        for match in RANGE.finditer(rules_yaml):  # each record over the longest range a rule reads it
            span = duration_s(match.group(2)) + duration_s(match.group(3) or "")
            reads[match.group(1)] = max(span, reads.get(match.group(1), 0.0))
        intervals = record_intervals(rules_yaml)
        pages = [[(prefix.split("{", 1)[0], dict(LABEL.findall(prefix.replace(page.model_label, page.model_label[:-1]
                                                                          + f'-{pod % fleet_common.MODELS}"'))))
                  for prefix, value, _ in page.lines if value is not None] for pod in range(pods)]
        series: dict[str, tuple[int, float]] = {}
        for key, family in stage.families(cfg).items():
            name = stage.record(cfg, key)
            if name not in reads:
                continue
            for pod, lines in enumerate(pages):
                pod_labels = {"job": job, **fleet_common.pod_labels(pod)}
                for sample, labels in lines:
                    if sample == family.exposed and all(_matches(m, labels) for m in family.matchers):
                        kept = {k: v for k, v in {**labels, **pod_labels}.items() if k in family.by or not family.by}
                        series[name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(kept.items())) + "}"] = (
                            int(intervals[name]), reads[name])
        staged_any = bool(series)  # vLLM's own page gives the stage nothing to record but its clock
        if stage.CLOCK in reads:  # one series per stage group, whatever the fleet
            for group in stage.STAGE_GROUPS:
                series[stage.clock(group)] = (int(duration_s(stage.step(cfg, group))), reads[stage.CLOCK])
        for name, rng in reads.items():  # the baseline's: per model, from the window groups
            if staged_any and ":" in name and name not in {s.split("{", 1)[0] for s in series} and name in intervals:
                for model in range(min(pods, fleet_common.MODELS)):
                    model_labels = f'namespace="fleet",model_name="{page.model_label.split(chr(34))[1]}-{model}"'
                    series[f"{name}{{{model_labels}}}"] = (int(intervals[name]), rng)
        return cls(tuple((k, step, rng) for k, (step, rng) in series.items()), now)

    @property
    def longest_s(self) -> float:
        return max((rng for _, _, rng in self.series), default=0.0)

    def write(self, path: Path) -> int:
        written = 0
        with path.open("w", encoding="utf-8") as out:
            for name, step, rng in sorted(self.series):
                first = self.origin - int(rng) - 2 * step
                for t in range(first, self.origin, step):
                    value = t if name.startswith(stage.CLOCK) else 1.0  # the clock's value is its time
                    out.write(f"{name.removesuffix('{}')} {value} {t}\n")
                    written += 1
            out.write("# EOF\n")
        return written


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    key, _, value = matcher.partition("=")
    return labels.get(key) == value.strip('"')


def backfill_records(records: RecordHistory, tsdb: Path, workdir: Path) -> int:
    promtool = promtool_binary()
    if promtool is None or not records.series:
        return 0
    openmetrics = workdir / "records.om"
    written = records.write(openmetrics)
    result = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics),
                             str(tsdb)], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S, check=False)
    openmetrics.unlink()
    if result.returncode != 0:
        raise RuntimeError(f"promtool tsdb create-blocks-from openmetrics failed: {result.stderr[-2000:]}")
    return written


def backfill(history: History, tsdb: Path, workdir: Path) -> int:
    """Blocks for the history from ``origin`` up to now, in rounds until the last one is less than one step old
    (the first round takes minutes at 100 pods: the next ones close the gap it leaves); return the samples."""
    promtool = promtool_binary()
    if promtool is None:
        raise RuntimeError("promtool not found: run scripts/install-tools.sh (Debian package prometheus)")
    written, done = 0, 0
    while (now := int((time.time() - history.origin) // history.step_s) + 1) > done and history.names:
        openmetrics = workdir / f"history-{done}.om"
        written += history.write(openmetrics, range(done, now))
        result = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(openmetrics),
                                 str(tsdb)], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S, check=False)
        openmetrics.unlink()
        if result.returncode != 0:
            raise RuntimeError(f"promtool tsdb create-blocks-from openmetrics failed: {result.stderr[-2000:]}")
        done = now
    return written


# ------------------------------------------------------------------------------------------- one Prometheus


@dataclass(frozen=True, slots=True)
class SteadyMeasurement:
    """One Prometheus on ``pods`` pods' history and live pages, evaluating the rules on full windows."""

    page: str
    pods: int
    interval_s: float
    targets_up: int
    history_samples: int  # backfilled before Prometheus started
    window_samples: float  # the fewest samples a read series holds in the longest window (nan: the rules read none)
    window_expected: int  # what a full window holds at this interval
    round_s: float  # all groups' evaluation, summed; median over the hold
    groups: tuple[tuple[str, float], ...]  # each group's median evaluation, the slowest first
    cpu_cores: float  # Prometheus' CPU seconds per second over the hold: the rules, the scrapes and the rest
    compactions: int  # TSDB compactions during the hold (their CPU is in cpu_cores)
    groups_evaluated: int
    missed_iterations: int
    rule_failures: int
    rss_mb: float = float("nan")  # Prometheus' resident memory at the end of the hold
    heap_mb: float = float("nan")  # its Go heap in use, then
    live_heap_mb: float = float("nan")  # its heap goal halved (GOGC 100): what the last GC found live
    retained_mb: float = float("nan")  # the heap right after a forced GC, the least of RETAINED_GCS: what is kept
    rules: bool = True  # False: the page scraped alone, no rule file (what scraping it costs)

    def per_100(self, value: float) -> float:
        return value * 100 / self.pods

    def group_s(self, group: str) -> float:
        return dict(self.groups).get(group, float("nan"))


def measure(page_name: str, page: fleet_common.MovingPage, pods: int, size: fleet_common.Size, reads: RuleReads,
            workdir: Path, *, rules: bool = True) -> SteadyMeasurement:
    """One Prometheus on ``pods`` pods of ``page``: with the rules on backfilled full windows, or (``rules`` False)
    the page scraped alone, nothing backfilled, which is what scraping it costs."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"steady-{page_name}-{pods}-", dir=workdir))
    step = int(size.interval_s)
    origin = int(time.time() - reads.longest_s) - 2 * step  # the window is full at the first evaluation
    samples = 0
    if rules:
        history = History(page, reads.names, fleet_common.JOBS[page_name], pods, origin, step)
        records = RecordHistory.of(page, fleet_common.JOBS[page_name], pods,
                                   fleet_common.shipped_rules_yaml(), int(time.time()))
        samples = (backfill_records(records, run_dir / "tsdb", run_dir)
                   + backfill(history, run_dir / "tsdb", run_dir))
    with fleet_common.PodServer(page, origin) as server:
        config = fleet_common.prometheus_config(f"127.0.0.1:{server.port}", fleet_common.JOBS[page_name], pods,
                                                size.interval_s, size.rules(run_dir / "rules.yaml") if rules else None)
        prom = fleet_common.start_prometheus(run_dir, config, env=child_env({"GOGC": str(GOGC)}))
        try:
            return _observe(prom, page_name, pods, size, reads if rules else None, samples)
        finally:
            prom.stop()


def _observe(prom: Process, page_name: str, pods: int, size: fleet_common.Size, reads: RuleReads | None,
             history_samples: int) -> SteadyMeasurement:
    """``reads`` None: no rules were loaded."""
    with httpx.Client(base_url=prom.url, timeout=120, trust_env=False) as client:
        fleet_common.wait_until(lambda: fleet_common.scalar(client, "count(up)") >= pods,
                                3 * size.interval_s + fleet_common.UP_WAIT_S)
        if history_samples and size.hold_s >= SETTLE_QUIET_S:  # a shorter hold (the smoke) measures nothing
            _settle(client)
        before, started = _cpu_and_compactions(client), time.monotonic()
        rounds = _group_rounds(client, size, since=time.time())
        cpu, compactions = (after - first for after, first in zip(_cpu_and_compactions(client), before, strict=True))
        cpu_cores = cpu / (time.monotonic() - started)
        per_group = {group.rsplit(";", 1)[-1]: statistics.median(r[group] for r in rounds)
                     for group in rounds[-1]} if rounds else {}
        window = (fleet_common.scalar(client, f"min(count_over_time({reads.proof_selector}))")
                  if reads is not None and reads.proof_selector else float("nan"))
        return SteadyMeasurement(
            page=page_name, pods=pods, interval_s=size.interval_s,
            targets_up=int(fleet_common.scalar(client, "count(up == 1)")), history_samples=history_samples,
            window_samples=window,
            window_expected=int(reads.proof_s // (reads.proof_step_s or size.interval_s)) if reads is not None else 0,
            round_s=statistics.median(sum(r.values()) for r in rounds) if rounds else float("nan"),
            groups=tuple(sorted(per_group.items(), key=lambda item: -item[1])), cpu_cores=cpu_cores,
            compactions=int(compactions),
            groups_evaluated=sum(1 for t in _by_group(client, LAST_EVALUATION).values() if t > 0),
            missed_iterations=int(sum(fleet_common.own_metric(client,
                                                              "prometheus_rule_group_iterations_missed_total"))),
            rule_failures=int(sum(fleet_common.own_metric(client, "prometheus_rule_evaluation_failures_total"))),
            rss_mb=sum(fleet_common.own_metric(client, "process_resident_memory_bytes")) / 2**20,
            heap_mb=sum(fleet_common.own_metric(client, "go_memstats_heap_inuse_bytes")) / 2**20,
            live_heap_mb=sum(fleet_common.own_metric(client, "go_memstats_next_gc_bytes")) / (1 + GOGC / 100) / 2**20,
            retained_mb=_retained_mb(client, RETAINED_GCS if size.hold_s >= SETTLE_QUIET_S else 1),
            rules=reads is not None)


RETAINED_GCS, RETAINED_SPACING_S = 3, 5.0  # one GC in a short hold (the smoke), which measures nothing


def _retained_mb(client: httpx.Client, gcs: int) -> float:
    """The heap right after a GC forced through Go's pprof handler (``gc=1``), the least of ``gcs`` a few
    seconds apart: the series, chunks, records and rule state Prometheus keeps. A GC that runs while a group is
    evaluating finds that evaluation's vectors live too; the least of a few is the one that caught the fewest."""
    found = []
    for attempt in range(gcs):
        if attempt:
            time.sleep(RETAINED_SPACING_S)
        client.get("/debug/pprof/heap", params={"gc": 1}).raise_for_status()
        found.append(sum(fleet_common.own_metric(client, "go_memstats_heap_alloc_bytes")) / 2**20)
    return min(found)


GOGC = 100  # Go's default, set so that the heap goal halved is the live heap whatever the caller's environment
SETTLE_QUIET_S = 70.0  # Prometheus plans compactions once a minute: one whole tick without one
SETTLE_MAX_S = 360.0


def _settle(client: httpx.Client) -> None:
    """Wait until the TSDB stops compacting the backfilled blocks (overlapping blocks from several promtool runs are
    merged in the first minutes): their CPU and memory are the backfill's, not the rules', and would be counted in
    the hold otherwise. At most SETTLE_MAX_S; the hold still counts any compaction after it."""
    started = time.monotonic()
    last, quiet_since = _cpu_and_compactions(client)[1], time.monotonic()
    while time.monotonic() - started < SETTLE_MAX_S and time.monotonic() - quiet_since < SETTLE_QUIET_S:
        time.sleep(5)
        if (now := _cpu_and_compactions(client)[1]) != last:
            last, quiet_since = now, time.monotonic()


def _cpu_and_compactions(client: httpx.Client) -> tuple[float, float]:
    return (sum(fleet_common.own_metric(client, "process_cpu_seconds_total")),
            sum(fleet_common.own_metric(client, "prometheus_tsdb_compactions_total")))


LAST_EVALUATION = "prometheus_rule_group_last_evaluation_timestamp_seconds"
LAST_DURATION = "prometheus_rule_group_last_duration_seconds"


def _group_rounds(client: httpx.Client, size: fleet_common.Size, since: float) -> list[dict[str, float]]:
    """Each group's last evaluation time, once per interval over the hold, counted only once every group has
    evaluated after ``since`` (every target up); waits up to fleet_common.RULE_WAIT_S past the hold for that."""
    rounds: list[dict[str, float]] = []
    started = time.monotonic()
    while True:
        time.sleep(size.interval_s)
        text = client.get("/metrics").text
        if all(stamp > since for stamp in _by_group_in(text, LAST_EVALUATION).values()):
            rounds.append(_by_group_in(text, LAST_DURATION))
        elapsed = time.monotonic() - started
        if (elapsed >= size.hold_s and len(rounds) >= 2) or elapsed >= size.hold_s + fleet_common.RULE_WAIT_S:
            return rounds


def _by_group(client: httpx.Client, name: str) -> dict[str, float]:
    return _by_group_in(client.get("/metrics").text, name)


def _by_group_in(metrics_text: str, name: str) -> dict[str, float]:
    """One of Prometheus' own per-group metrics, by its rule_group label (``file;group``)."""
    found = re.finditer(rf'^{name}\{{rule_group="([^"]*)"\}} (\S+)$', metrics_text, re.MULTILINE)
    return {match.group(1): float(match.group(2)) for match in found}


# -------------------------------------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True)
class SteadyResult:
    size: fleet_common.Size
    measurements: tuple[SteadyMeasurement, ...]
    reads: RuleReads  # of the sidecar's page
    groups_in_file: int

    def at(self, page: str, pods: int, rules: bool = True) -> SteadyMeasurement:
        return next(m for m in self.measurements if m.page == page and m.pods == pods and m.rules == rules)

    def alone(self, page: str, pods: int) -> SteadyMeasurement | None:
        """The page scraped without the rules, where it was measured."""
        return next((m for m in self.measurements if m.page == page and m.pods == pods and not m.rules), None)


NO_RULES = ", no rules"  # a row's page column where the page was scraped alone
# Each page alone (what scraping it costs), then with the rules: the rules' own cost is the difference.
RUNS = ((fleet_common.VLLM, False), (fleet_common.VLLM, True), (fleet_common.SIDECAR, False),
        (fleet_common.SIDECAR, True))


def run(size: fleet_common.Size, log: Callable[[str], None] = print) -> SteadyResult:
    rules = fleet_common.shipped_rules_yaml()
    with tempfile.TemporaryDirectory(prefix="fleet-steady-") as tmp:
        workdir = Path(tmp)
        pages = {fleet_common.SIDECAR: fleet_common.MovingPage.parse(fleet_common.sidecar_page(workdir).decode()),
                 fleet_common.VLLM: fleet_common.MovingPage.parse(fleet_common.VLLM_PAGE.read_text(encoding="utf-8"))}
        reads = {name: rule_reads(rules, sample_names(page)) for name, page in pages.items()}
        measurements: list[SteadyMeasurement] = []
        for pods in size.pods:
            for name, with_rules in RUNS:  # the baselines first, the same machine minutes apart
                started = time.perf_counter()
                measurements.append(measure(name, pages[name], pods, size, reads[name], workdir, rules=with_rules))
                log(f"fleet steady: {name} × {pods} pods{'' if with_rules else NO_RULES} measured in "
                    f"{time.perf_counter() - started:.0f} s")
    return SteadyResult(size, tuple(measurements), reads[fleet_common.SIDECAR], fleet_common.rule_groups_in_file())


def describe(size: fleet_common.Size) -> str:
    return (f"{size.describe()}; the history over the rules' longest range backfilled at the scrape interval, the "
            "hold counted once every group has evaluated with every target up")


STEADY_HEADER = ["pods", "page", "targets up", "history backfilled (samples)",
                 "longest window: samples per series (fewest / full)", "rule evaluation per round (all groups)",
                 "per 100 pods", "share of the interval", "slowest group", "Prometheus CPU (cores)",
                 "RSS (MB)", "heap in use (MB)", "live heap after GC (MB)", "retained after a forced GC (MB)",
                 "compactions in the hold", "missed iterations", "rule failures", "groups evaluated"]


def table_rows(result: SteadyResult) -> Iterator[list[str]]:
    for m in result.measurements:
        window = ("— (none read)" if math.isnan(m.window_samples)
                  else f"{m.window_samples:.0f} / {m.window_expected}")
        yield [str(m.pods), m.page + ("" if m.rules else NO_RULES), str(m.targets_up), str(m.history_samples), window,
               f"{1000 * m.round_s:.0f} ms", f"{m.per_100(1000 * m.round_s):.0f} ms",
               f"{100 * m.round_s / m.interval_s:.1f} %",
               f"{m.groups[0][0]} ({1000 * m.groups[0][1]:.0f} ms)" if m.groups else "—", f"{m.cpu_cores:.3f}",
               f"{m.rss_mb:.0f}", f"{m.heap_mb:.0f}", f"{m.live_heap_mb:.0f}", f"{m.retained_mb:.0f}",
               str(m.compactions), str(m.missed_iterations), str(m.rule_failures),
               f"{m.groups_evaluated}/{result.groups_in_file}"]


def group_table(result: SteadyResult) -> list[str]:
    """Each group's evaluation at the largest fleet, the sidecar's page against vLLM's: where the time goes."""
    pods = max(m.pods for m in result.measurements)
    sidecar, vllm = result.at(fleet_common.SIDECAR, pods), result.at(fleet_common.VLLM, pods)
    rows = [[group, f"{1000 * vllm.group_s(group):.0f} ms", f"{1000 * seconds:.0f} ms",
             f"{100 * seconds / sidecar.round_s:.0f} %"] for group, seconds in sidecar.groups]
    return markdown_table([f"group ({pods} pods, median evaluation)", "vLLM's own page", "sidecar's page",
                           "share of the sidecar's round"], rows)


def summary(result: SteadyResult, short_hold: Sequence[fleet_common.Measurement] = ()) -> list[str]:
    """The figures at the largest fleet whose Prometheus kept up (no missed iterations), the fleets it did not keep
    up with, what the fresh-Prometheus figure missed, and a larger fleet extrapolated (said so)."""
    sidecars = sorted((m for m in result.measurements if m.page == fleet_common.SIDECAR and m.rules),
                      key=lambda m: m.pods)
    if not sidecars:
        return ["No steady-state fleet was measured."]
    kept_up = [m for m in sidecars if m.missed_iterations == 0] or sidecars[:1]
    sidecar = kept_up[-1]
    vllm = result.at(fleet_common.VLLM, sidecar.pods)
    lines = [f"At {sidecar.pods} pods with the rules' longest window ({result.reads.proof_selector}) full, "
             f"Prometheus' CPU (rules, scrapes and the rest) was **{sidecar.cpu_cores:.2f} cores** on the sidecar's "
             f"page against {vllm.cpu_cores:.2f} on vLLM's own (**{_times(sidecar.cpu_cores, vllm.cpu_cores)}**; the "
             f"same scrapes: the difference is the rules), {sidecar.cpu_cores * sidecar.interval_s:.1f} CPU seconds "
             f"per {sidecar.interval_s:g} s, with {sidecar.missed_iterations} missed iterations. The groups' "
             f"evaluation times summed: **{sidecar.round_s:.2f} s per round** against {vllm.round_s:.3f} s "
             f"(**{_times(sidecar.round_s, vllm.round_s)}**; vLLM's page has no series the rules read, so its figure "
             "is the rules' fixed cost); groups run concurrently, so on a busy machine their wall times include "
             "waiting for CPU and vary from run to run."]
    lines += [f"At {m.pods} pods Prometheus **did not keep up** on this machine: {m.missed_iterations} missed "
              f"iterations, {m.groups[0][0]} took {m.groups[0][1]:.0f} s against a {m.interval_s:g} s interval, "
              f"{m.round_s:.0f} s summed; its {m.cpu_cores:.2f} cores are what it got, not what it needed."
              for m in sidecars if m.missed_iterations > 0 and m.groups]
    lines += _rules_alone(result, sidecar)
    lines.append(_memory(result, sidecar, vllm))
    short = next((m for m in short_hold if m.page == fleet_common.SIDECAR and m.pods == sidecar.pods), None)
    if short is not None and short.rule_seconds > 0:
        lines.append(f"A fresh Prometheus' figure for the same fleet (the table above, windows nearly empty): "
                     f"{short.rule_seconds:.2f} s; full windows cost **{sidecar.round_s / short.rule_seconds:.1f}×** "
                     "that.")
    source = (f"the slope from {kept_up[0].pods} to {sidecar.pods} pods" if len(kept_up) > 1
              else f"the {sidecar.pods}-pod figure, vLLM's as the fixed cost")
    per_100, at_1000 = _extrapolate(kept_up, vllm, lambda m: m.round_s)
    cores_per_100, cores_at_1000 = _extrapolate(kept_up, vllm, lambda m: m.cpu_cores)
    lines.append(f"Extrapolated, not measured: linear in pods from {source}: {cores_per_100:.2f} cores and "
                 f"{per_100:.2f} s of summed evaluation per 100 more pods, so about **{cores_at_1000:.1f} cores and "
                 f"{at_1000:.0f} s per round at 1000 pods** ({at_1000 / sidecar.interval_s:.1f}× the "
                 f"{sidecar.interval_s:g} s interval).")
    if result.reads.record_ranges:
        lines.append(f"The {len(result.reads.record_ranges)} ranges over the rules' own records (the short stage's "
                     "over the long windows, the 1-day baseline's) are full too: each record's series over the fleet "
                     "(its label sets from the pods' pages) is backfilled at its group's interval over its longest "
                     "range (RecordHistory), with the pods' raw history.")
    return lines


def _rules_alone(result: SteadyResult, sidecar: SteadyMeasurement) -> list[str]:
    """The rules' own cost: the sidecar's page with the rules less the same page scraped alone, against what scraping
    vLLM's page costs alone (issue 35's figure: in production both pages are scraped)."""
    vllm_alone = result.alone(fleet_common.VLLM, sidecar.pods)
    sidecar_alone = result.alone(fleet_common.SIDECAR, sidecar.pods)
    if vllm_alone is None or sidecar_alone is None:
        return []
    rules_cpu, rules_heap = sidecar.cpu_cores - sidecar_alone.cpu_cores, sidecar.heap_mb - sidecar_alone.heap_mb
    return [f"Each page scraped alone, no rules: vLLM's {vllm_alone.cpu_cores:.3f} cores, the sidecar's "
            f"{sidecar_alone.cpu_cores:.3f}. The rules' own CPU (the sidecar's page with them, less without): "
            f"**{rules_cpu:.3f} cores, {_ratio(rules_cpu, vllm_alone.cpu_cores)} what scraping vLLM's page costs**. "
            f"Their heap: {rules_heap:+.0f} MB, against {vllm_alone.heap_mb:.0f} MB for vLLM's page alone (the "
            "process' fixed heap included)."]


def _memory(result: SteadyResult, sidecar: SteadyMeasurement, vllm: SteadyMeasurement) -> str:
    """Prometheus' RSS and heap on the sidecar's page against vLLM's, and per 100 more pods where two fleet sizes
    were measured (the slope: what the fleet adds, without the process' fixed memory)."""
    line = (f"Memory at {sidecar.pods} pods: RSS {sidecar.rss_mb:.0f} MB against {vllm.rss_mb:.0f} MB on vLLM's page "
            f"({sidecar.rss_mb / vllm.rss_mb:.2f}×), Go heap in use {sidecar.heap_mb:.0f} MB against "
            f"{vllm.heap_mb:.0f} MB ({sidecar.heap_mb / vllm.heap_mb:.2f}×).")
    sizes = sorted({m.pods for m in result.measurements})
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]

        def slope(page: str, value: Callable[[SteadyMeasurement], float]) -> float:
            return (value(result.at(page, large)) - value(result.at(page, small))) * 100 / (large - small)

        def both_pages(field: str) -> tuple[float, float]:
            figure = operator.attrgetter(field)
            return slope(fleet_common.SIDECAR, figure), slope(fleet_common.VLLM, figure)

        rss, heap, live, kept = map(both_pages, ("rss_mb", "heap_mb", "live_heap_mb", "retained_mb"))
        line += (f" Per 100 more pods ({small} → {large}): RSS +{rss[0]:.1f} MB against +{rss[1]:.1f} MB "
                 f"(**{rss[0] / rss[1]:.2f}×**), heap +{heap[0]:.1f} MB against +{heap[1]:.1f} MB "
                 f"(**{heap[0] / heap[1]:.2f}×**), live heap after GC +{live[0]:.1f} MB against +{live[1]:.1f} MB "
                 f"(**{live[0] / live[1]:.2f}×**). RSS and heap in use are one instant of a garbage-collected "
                 "process (what the rules allocated since the last GC is in them until the next); the live heap is "
                 "Go's heap goal halved (the bench runs Prometheus with GOGC 100, Go's default): what the last "
                 "GC found reachable, steady between two GCs, which Go sizes the heap (and so RSS) from.")
        line += (f" Retained after a forced GC: +{kept[0]:.1f} MB against +{kept[1]:.1f} MB "
                 f"(**{kept[0] / kept[1]:.2f}×**): what stays between evaluations. The live heap's excess over it is "
                 "what evaluations in flight held when the last GC ran (a stage rule pairs each raw series with its "
                 "value a step before, and Prometheus allocates the pair's result labels per series).")
    return line


def _extrapolate(kept_up: Sequence[SteadyMeasurement], vllm: SteadyMeasurement,
                 value: Callable[[SteadyMeasurement], float]) -> tuple[float, float]:
    """The sidecar's figure per 100 more pods and at 1000 pods, linear: the slope between the smallest and the
    largest fleet Prometheus kept up with, or with one such fleet from vLLM's page at its size (the rules' fixed
    cost)."""
    first, last = kept_up[0], kept_up[-1]
    if last.pods > first.pods:
        per_100 = (value(last) - value(first)) * 100 / (last.pods - first.pods)
    else:
        per_100 = (value(last) - value(vllm)) * 100 / last.pods
    return per_100, value(last) + per_100 * (1000 - last.pods) / 100


def _ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.1f}×" if baseline > 0 else "—"


def _times(value: float, baseline: float) -> str:
    return f"{value / baseline:.0f}×" if baseline > 0 else "—"


def report(result: SteadyResult, short_hold: Sequence[fleet_common.Measurement] = ()) -> list[str]:
    if not result.measurements:
        return ["No steady-state fleet was measured."]
    return [*markdown_table(STEADY_HEADER, list(table_rows(result))), "", *group_table(result), "",
            *summary(result, short_hold)]


def main(size: fleet_common.Size) -> int:
    """`python -m bench.fleet --size steady` (bench.fleet's entry point hands the steady sizes here)."""
    print(describe(size), flush=True)
    started = time.perf_counter()
    for line in report(run(size)):
        print(line)
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0
