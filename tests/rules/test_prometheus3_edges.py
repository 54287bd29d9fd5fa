"""The shipped promtool tests mean the same on Prometheus 2.42+ and 3.x.

Prometheus 3 made ranges and the lookback left-open: a range ``[r]`` evaluated at t holds the samples in (t − r, t],
not [t − r, t], and an instant selector finds the latest sample in (t − 5m, t], not [t − 5m, t]. A test input that
puts a sample exactly on such a left edge reads one sample more on 2.42 than on 3.x: the two stages' gap case did
(its last sample before a 5-minute scrape gap sat exactly one lookback before the stage's ``offset 15s`` read, so
2.42 counted the gap's tokens and 3.x dropped them). promtool 3 does not run here, so this scans every shipped test
file for such edges instead: each input series' samples (from ``interval`` and the expanding notation of
``values``) against every evaluation (promtool evaluates every group at every ``evaluation_interval`` up to the
last ``eval_time``, and each ``promql_expr_test`` at its ``eval_time``), for every raw series the rules (expressions
and annotations' queries) or the test's own expressions read: an instant selector, with its offset, one lookback
back; a range, with its offset, the range back."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode_exporter.core.config.validation import duration_seconds
from specdecode_exporter.monitoring import rules

ROOT = Path(__file__).resolve().parents[2]
TESTS = sorted((ROOT / "alerts" / "tests").glob("*.test.yaml"))
LOOKBACK_MS = 300_000  # Prometheus' default lookback delta (5m), the same in 2.x and 3.x
_SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_][a-zA-Z0-9_:]*)(\{[^}]*\})?(?:\[([^\]]+)\])?(?: offset (\w+))?")
_SERIES_NAME = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")


def ms(duration: str) -> int:
    return round(duration_seconds(duration, allow_zero=True) * 1000)


@dataclass(frozen=True, slots=True)
class Read:
    """How an expression reads a series: ``range_ms`` 0 for an instant selector (then its lookback counts)."""

    range_ms: int
    offset_ms: int

    @property
    def reach_ms(self) -> int:
        """How far before the evaluation the read's left edge lies."""
        return self.offset_ms + (self.range_ms or LOOKBACK_MS)


def reads(expr: str) -> dict[str, set[Read]]:
    """The series names an expression reads, and how (function and label names come along: harmless, no input
    series bears them)."""
    out: dict[str, set[Read]] = {}
    for name, _, rng, offset in _SELECTOR.findall(re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        out.setdefault(name, set()).add(Read(ms(rng) if rng else 0, ms(offset) if offset else 0))
    return out


def rule_reads() -> dict[str, set[Read]]:
    """What the shipped rules read of series no rule records: the raw series (expressions and annotations)."""
    groups = [g for name in rules.RULE_FILES for g in yaml.safe_load((ROOT / "alerts" / name).read_text())["groups"]]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r} | {"ALERTS"}
    out: dict[str, set[Read]] = {}
    for group in groups:
        for rule in group["rules"]:
            texts = [rule["expr"], *rule.get("annotations", {}).values()]
            for text in texts:
                for name, how in reads(text).items():
                    if name not in recorded:
                        out.setdefault(name, set()).update(how)
    return out


def sample_times(values: str, interval_ms: int) -> tuple[list[int], set[int]]:
    """The times (ms) of a series' samples in promtool's expanding notation, and which of them are stale markers."""
    times, stale, step = [], set(), 0
    for token in values.split():
        if token == "_":
            step += 1
        elif re.fullmatch(r"_x\d+", token):
            step += int(token[2:])
        elif token == "stale":
            times.append(step * interval_ms)
            stale.add(step * interval_ms)
            step += 1
        else:
            repeat = re.fullmatch(r"[-+.\deE]+(?:[-+][.\deE]+)?x(\d+)", token)
            count = int(repeat.group(1)) + 1 if repeat else 1
            times.extend((step + i) * interval_ms for i in range(count))
            step += count
    return times, stale


@dataclass(frozen=True, slots=True)
class Edge:
    """A sample that 2.42 reads and 3.x does not."""

    test: str
    series: str
    sample_ms: int
    evaluation_ms: int
    read: Read

    def __str__(self) -> str:
        kind = f"[{self.read.range_ms // 1000}s]" if self.read.range_ms else "lookback"
        return (f"{self.test}: {self.series} at {self.sample_ms / 1000:g}s is on the left edge of a {kind} read "
                f"(offset {self.read.offset_ms / 1000:g}s) evaluated at {self.evaluation_ms / 1000:g}s")


def _edges_of(test: str, series: str, times: list[int], stale: set[int], evaluations: list[int],
              how: set[Read]) -> Iterator[Edge]:
    present = set(times)
    for read in how:
        for t in evaluations:
            left = t - read.reach_ms
            if read.range_ms:  # a range holds its left edge's sample on 2.42 only
                if left in present:
                    yield Edge(test, series, left, t, read)
                continue
            latest = bisect.bisect_right(times, t - read.offset_ms) - 1  # an instant read: the latest sample
            if latest >= 0 and times[latest] == left and left not in stale:
                yield Edge(test, series, left, t, read)


def edges(doc: dict[str, Any], name: str, raw: dict[str, set[Read]]) -> list[Edge]:
    """Every left-edge sample of the test file ``doc`` under the rules' raw reads ``raw``."""
    every = ms(str(doc.get("evaluation_interval", "1m")))
    found: list[Edge] = []
    for group in doc["tests"]:
        interval = ms(str(group.get("interval", "1m")))
        cases = [*group.get("alert_rule_test", []), *group.get("promql_expr_test", [])]
        last = max(ms(str(case["eval_time"])) for case in cases)
        rule_times = list(range(0, last + 1, every))
        test = f"{name} ({group.get('name', 'unnamed')})"
        for series in group["input_series"]:
            found_name = _SERIES_NAME.match(series["series"])
            assert found_name, series["series"]
            metric = found_name.group(1)
            times, stale = sample_times(str(series["values"]), interval)
            found += _edges_of(test, series["series"], times, stale, rule_times, raw.get(metric, set()))
            for case in group.get("promql_expr_test", []):
                own = reads(case["expr"]).get(metric, set())
                found += _edges_of(test, series["series"], times, stale, [ms(str(case["eval_time"]))], own)
    return found


def load_test_file(path: Path) -> dict[str, Any]:
    """A promtool test file as promtool reads it: every scalar a string (YAML 1.1 would read ``values: 0x96``, 96
    repeats of 0, as the hexadecimal 150)."""
    doc: dict[str, Any] = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    return doc


@pytest.mark.parametrize("path", TESTS, ids=lambda path: path.name)
def test_no_input_sample_sits_on_a_left_edge(path: Path) -> None:
    found = edges(load_test_file(path), path.name, rule_reads())
    assert not found, "\n".join(str(e) for e in found[:10]) + f"\n… {len(found)} in all"


def test_the_scan_reads_the_notation_and_the_rules() -> None:
    assert sample_times("1 _ 2+1x2 _x3 stale 0x1", 15_000) == (
        [0, 30_000, 45_000, 60_000, 120_000, 135_000, 150_000], {120_000})
    raw = rule_reads()
    assert Read(0, 15_000) in raw["specdecode_draft_tokens_total"]  # the page's stage: one step back
    assert Read(0, 60_000) in raw["specdecode_request_time_per_output_token_seconds_bucket"]  # the minute stage
    assert not any(name.startswith("model:") for name in raw)


GAP = {"evaluation_interval": "15s", "tests": [{"interval": "15s", "input_series": [
    {"series": "specdecode_draft_tokens_total", "values": "0+10x119 _x20 1400+10x20"}],
    "promql_expr_test": [{"expr": "x", "eval_time": "40m"}]}]}


def test_a_gap_of_one_lookback_after_a_step_is_found() -> None:
    """The two stages' old gap case: the last sample before the gap (29m45s) one lookback before the stage's read a
    step back (offset 15s) at 35m: 2.42 finds it and counts the gap's tokens, 3.x does not."""
    found = edges(GAP, "gap", {"specdecode_draft_tokens_total": {Read(0, 15_000)}})
    assert [(e.sample_ms, e.evaluation_ms) for e in found] == [(1_785_000, 2_100_000)]
    shorter = {**GAP, "tests": [{**GAP["tests"][0], "input_series": [
        {"series": "specdecode_draft_tokens_total", "values": "0+10x119 _x19 1400+10x20"}]}]}
    assert edges(shorter, "gap", {"specdecode_draft_tokens_total": {Read(0, 15_000)}}) == []
