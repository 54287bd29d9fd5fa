"""The stage's floor: what reading the pods' raw series costs a ruler, against what the shipped stage pays.

    .venv/bin/python -m bench.stage_floor              # 400 pods of the sidecar's page, ~6 minutes
    .venv/bin/python -m bench.stage_floor --pods 100

Every rule that reads the pods' raw series is a stage rule (monitoring/stage.py): each step it sums each series'
increase since the step before, ``(x - x offset <step>) >= 0``, to the level the alerts read. No design that pages
on those counters can read them less than once per step, and an exact increase needs two samples of each series
(now and a step ago). So each stage rule of the shipped rules is timed beside what its raw reads alone cost:

* **shipped**: the rule's expression as shipped (two reads per series, matched per series, the fallen ones dropped);
* **read now**: ``sum by (…) (x)``, each series' latest sample, summed as the rule sums (no match, no filter);
* **read a step ago**: the same ``offset <step>``; **read twice** = the two, as separate queries: what an exact
  increase reads, without matching them;
* a gauge's stage rule (``avg``/``count`` of the series) reads each series once already: its three figures are one.

A fresh Prometheus scrapes N pods of the real sidecar's page (bench.fleet's: the tap on, 12 workloads × 3 bands),
every 15 s, with no rules; after ``warm`` seconds (a step's history) each expression runs as an instant query
``repeats`` times, interleaved, and its engine time (``stats=all``: execTotalTime) is the median. The sums over the
stage's rules are what one round of the stage costs as shipped and at each floor; their ratios are the figures (the
machine is shared: absolute times are context).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from bench import fleet_common
from bench.common import markdown_table
from specdecode_exporter.monitoring import stage

SCRAPE_S = 15.0


@dataclass(frozen=True, slots=True)
class Size:
    pods: int
    warm_s: float  # scraped before the queries: a step's history (1m) and then some
    repeats: int  # rounds of queries, interleaved; each figure is the median


QUICK = Size(400, 200.0, 9)
SMOKE = Size(2, 20.0, 1)  # tests/bench: the table's shape, figures meaningless (no sample a step ago yet)
STAGE_GROUP = re.compile(r"^specdecode\.rules\.stage\.(\w+)$")
# A stage rule's expression, its whitespace collapsed: summed or not, (x - x offset s) >= 0 or x - x offset s >= 0.
INCREASE = re.compile(
    r"^(?:sum by \((?P<by>[^)]*)\) \( ?)?\(?(?P<raw>.+?) - (?P=raw) offset (?P<step>[^\s)]+)\)? >= 0(?: ?\))?$")
GAUGE = re.compile(r"^(?:avg|count) by \([^)]*\) \((?P<raw>.+)\)$")


@dataclass(frozen=True, slots=True)
class StageRule:
    """One stage rule and the reads it is built on."""

    group: str  # the stage group's short name (page, acceptance, latency, requests, series)
    record: str
    selector: str  # the raw series it reads
    shipped: str  # the expression as shipped
    now: str  # its raw series read once, summed as the rule sums
    before: str | None  # the same a step ago; None for a gauge's rule (it reads once)


def stage_rules(rules_yaml: str) -> list[StageRule]:
    """The shipped stage's rules that read raw series (its clocks, ``time()``, read nothing)."""
    out: list[StageRule] = []
    for group in yaml.safe_load(rules_yaml)["groups"]:
        short = STAGE_GROUP.match(group["name"])
        if short is None:
            continue
        for rule in group["rules"]:
            if rule["record"] == stage.CLOCK:
                continue
            out.append(_stage_rule(short.group(1), rule["record"], " ".join(rule["expr"].split())))
    return out


def _stage_rule(group: str, record: str, expr: str) -> StageRule:
    found = INCREASE.match(expr)
    if found is None:
        gauge = GAUGE.match(expr)
        if gauge is None:
            raise ValueError(f"{record}: not a stage rule this bench knows: {expr}")
        return StageRule(group, record, gauge.group("raw"), expr, expr, None)  # one read of each series
    raw, labels = found.group("raw"), found.group("by")

    def summed(read: str) -> str:
        return f"sum by ({labels}) ({read})" if labels is not None else read
    return StageRule(group, record, raw, expr, summed(raw), summed(f"{raw} offset {found.group('step')}"))


@dataclass(frozen=True, slots=True)
class RuleCost:
    rule: StageRule
    series: int  # raw series the rule reads over the fleet
    shipped_ms: float
    now_ms: float
    before_ms: float  # 0 for a gauge's rule

    @property
    def read_twice_ms(self) -> float:
        return self.now_ms + self.before_ms if self.rule.before is not None else self.shipped_ms

    @property
    def read_once_ms(self) -> float:
        return self.now_ms if self.rule.before is not None else self.shipped_ms


@dataclass(frozen=True, slots=True)
class FloorResult:
    size: Size
    costs: tuple[RuleCost, ...]

    def of(self, group: str | None = None) -> list[RuleCost]:
        """The costs of one stage group's rules (None: every rule's)."""
        return [c for c in self.costs if group is None or c.rule.group == group]

    def total(self, figure: Callable[[RuleCost], float], group: str | None = None) -> float:
        return sum(map(figure, self.of(group)))


def _engine_ms(client: httpx.Client, expr: str) -> float:
    response = client.get("/api/v1/query", params={"query": expr, "stats": "all"}).json()
    if response.get("status") != "success":
        raise RuntimeError(f"query failed: {expr}: {response.get('error')}")
    return float(response["data"]["stats"]["timings"]["execTotalTime"]) * 1000


def _series(client: httpx.Client, rule: StageRule) -> int:
    return int(fleet_common.scalar(client, f"count({rule.selector})"))


def time_rules(client: httpx.Client, rules: Sequence[StageRule], repeats: int) -> list[RuleCost]:
    """Each rule's forms as instant queries, ``repeats`` rounds interleaved, the median of each."""
    forms = [(r, form) for r in rules for form in (r.shipped, r.now, r.before) if form is not None]
    times: dict[tuple[str, str], list[float]] = {(r.record, form): [] for r, form in forms}
    for _ in range(repeats):
        for rule, form in forms:
            times[(rule.record, form)].append(_engine_ms(client, form))

    def median(rule: StageRule, form: str | None) -> float:
        return statistics.median(times[(rule.record, form)]) if form is not None else 0.0
    return [RuleCost(r, _series(client, r), median(r, r.shipped), median(r, r.now), median(r, r.before))
            for r in rules]


def run(size: Size = QUICK, log: Callable[[str], None] = print) -> FloorResult:
    rules = stage_rules(fleet_common.shipped_rules_yaml())
    with tempfile.TemporaryDirectory(prefix="bench-stage-floor-") as tmp:
        workdir = Path(tmp)
        log("the sidecar's page: a real sidecar after tapped traffic")
        page = fleet_common.MovingPage.parse(fleet_common.sidecar_page(workdir).decode())
        with fleet_common.PodServer(page) as server:
            prom = fleet_common.start_prometheus(workdir, fleet_common.prometheus_config(
                f"127.0.0.1:{server.port}", fleet_common.JOBS[fleet_common.SIDECAR], size.pods, SCRAPE_S, None))
            try:
                with httpx.Client(base_url=prom.url, timeout=120, trust_env=False) as client:
                    log(f"{size.pods} pods scraped every {SCRAPE_S:g} s; {size.warm_s:g} s before the queries")
                    time.sleep(size.warm_s)
                    costs = time_rules(client, rules, size.repeats)
            finally:
                prom.stop()
    return FloorResult(size, tuple(costs))


TABLE_HEADER = ["stage group", "rules", "raw series read", "shipped (ms)", "read twice (ms)", "read once (ms)",
                "read twice / shipped", "read once / shipped"]


def table_rows(result: FloorResult) -> Iterator[list[str]]:
    groups = list(dict.fromkeys(c.rule.group for c in result.costs))
    for group in [*groups, None]:
        shipped = result.total(lambda c: c.shipped_ms, group)
        twice, once = result.total(lambda c: c.read_twice_ms, group), result.total(lambda c: c.read_once_ms, group)
        yield [f"**all {len(groups)}**" if group is None else group, str(len(result.of(group))),
               str(sum(c.series for c in result.of(group))), f"{shipped:.0f}", f"{twice:.0f}", f"{once:.0f}",
               f"{twice / shipped:.2f}" if shipped else "—", f"{once / shipped:.2f}" if shipped else "—"]


def summary(result: FloorResult) -> list[str]:
    shipped = result.total(lambda c: c.shipped_ms)
    twice, once = result.total(lambda c: c.read_twice_ms), result.total(lambda c: c.read_once_ms)
    series = sum(c.series for c in result.costs)
    if shipped <= 0 or series <= 0:
        return ["No stage rule read a series."]
    return [f"At {result.size.pods} pods the stage's rules read {series} raw series a round; as shipped they cost "
            f"{shipped:.0f} ms of engine time ({1000 * shipped / series:.1f} µs a series). Reading each series twice "
            f"(now and a step ago, what an exact increase needs) costs **{twice / shipped:.0%}** of that, reading "
            f"each once **{once / shipped:.0%}**: the match and the reset filter are the rest. No stage that reads "
            "every raw series once a step can cost less than the second figure, nor an exact one less than the "
            "first."]


def report(result: FloorResult) -> list[str]:
    return [*markdown_table(TABLE_HEADER, list(table_rows(result))), "", *summary(result)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stage_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=QUICK.pods, help=f"pods of the sidecar's page ({QUICK.pods})")
    parser.add_argument("--warm", type=float, default=QUICK.warm_s,
                        help=f"seconds scraped before the queries ({QUICK.warm_s:g})")
    parser.add_argument("--repeats", type=int, default=QUICK.repeats, help=f"rounds of queries ({QUICK.repeats})")
    args = parser.parse_args(argv)
    if args.pods < 1 or args.repeats < 1 or args.warm < 0:
        parser.error("--pods and --repeats must be at least 1, --warm not negative")
    for line in report(run(Size(args.pods, args.warm, args.repeats))):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
