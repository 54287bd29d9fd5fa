"""Raw samples the rules read per pod and second, counted statically from one sidecar page.

    .venv/bin/python -m bench.rule_reads                     # the shipped rules against the rules of a git revision
    .venv/bin/python -m bench.rule_reads --before 33cf36c    # (default: the last revision before the two stages)

What a ruler pays per pod grows with the raw samples its rules read: every selector of a sidecar family, at every
evaluation of its group, reads each of the pod's series of that family over its range (range / scrape interval
samples) or once (an instant selector, offset or not). Records (names with a colon) are per model, not per pod, and
are left out. Label matchers are ignored, so a selector counts every series of its family on the page: an upper
bound. The page is the real sidecar's after tapped traffic over every workload × temperature band (bench.fleet's
sidecar_page: the tap on, 12 workloads × 3 bands), scraped every 15 s (the shipped ServiceMonitor).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench import fleet_common
from bench.common import markdown_table
from bench.fleet_common import duration_s

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "33cf36c"  # the last revision whose rules ranged over raw series for their whole windows
SCRAPE_S = 15.0
SELECTOR = re.compile(r"(?<![\w:\"'])([a-zA-Z_][a-zA-Z0-9_]*)(\{[^}]*\})?(\[[^\]]+\])?")


def page_series(page: bytes) -> Counter[str]:
    """Series per sample name of one exposition."""
    names: Counter[str] = Counter()
    for line in page.decode().splitlines():
        if line and not line.startswith("#"):
            names[re.split(r"[{ ]", line, maxsplit=1)[0]] += 1
    return names


@dataclass(frozen=True, slots=True)
class GroupReads:
    name: str
    interval_s: float
    samples_per_evaluation: float  # per pod

    @property
    def per_second(self) -> float:
        return self.samples_per_evaluation / self.interval_s


def group_reads(rules_yaml: str, series: Mapping[str, int], default_interval_s: float = SCRAPE_S) -> list[GroupReads]:
    out = []
    for group in yaml.safe_load(rules_yaml)["groups"]:
        interval = duration_s(group["interval"]) if group.get("interval") else default_interval_s
        samples = 0.0
        for rule in group["rules"]:
            expr = re.sub(r'"[^"]*"', '""', rule["expr"])  # label values are not selectors
            for name, _, rng in SELECTOR.findall(expr):
                if name in series:
                    per_series = max(1.0, duration_s(rng.strip("[]").split(":")[0]) / SCRAPE_S) if rng else 1.0
                    samples += series[name] * per_series
        out.append(GroupReads(group["name"], interval, samples))
    return out


def rules_at(revision: str) -> str:
    """The rules at ``revision``: one file then (alerts/specdecode.rules.yaml), or the files by concern."""
    def show(path: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"], capture_output=True, text=True,
                              check=check)

    one = show("alerts/specdecode.rules.yaml", check=False)
    if one.returncode == 0:
        return one.stdout
    return yaml.safe_dump({"groups": [g for path in fleet_common.RULE_FILES for g in yaml.safe_load(
        show(f"alerts/{path.name}").stdout)["groups"]]})


def table(now: list[GroupReads], before: list[GroupReads]) -> Iterator[list[str]]:
    for label, reads in (("before (raw ranges over whole windows)", before), ("now (two stages)", now)):
        top = sorted(reads, key=lambda g: -g.per_second)[:4]
        yield [label, f"{sum(g.per_second for g in reads):,.0f}",
               ", ".join(f"{g.name.removeprefix('specdecode.')} {g.per_second:,.0f}" for g in top)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=BEFORE, help="git revision whose rules to compare with")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specdecode-reads-") as tmp:
        series = page_series(fleet_common.sidecar_page(Path(tmp)))
    now, before = group_reads(fleet_common.shipped_rules_yaml(), series), group_reads(rules_at(args.before), series)
    print(f"One sidecar page: {sum(series.values())} series; scraped every {SCRAPE_S:g} s.\n")
    print("\n".join(markdown_table(["rules", "raw samples read per pod per second", "largest groups"],
                                   list(table(now, before)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
