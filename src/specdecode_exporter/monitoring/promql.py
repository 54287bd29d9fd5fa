"""Shared PromQL: the recording rules, the alerts and the dashboard panels build their queries from these.

Ratios are pooled the one right way: numerator and denominator summed separately, then divided, guarded with
``/ (… > 0)`` so an idle model has no sample (the dashboard shows "No traffic", never NaN). Metric names come
from the exporter's metric contract (src/specdecode_exporter/core/contract/metrics.py), never retyped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdecode_exporter.core.contract import metrics as m


@dataclass(frozen=True, slots=True)
class Scope:
    """Which series a query reads (label matchers, possibly empty) and what it pools them by."""

    matchers: str
    by: tuple[str, ...]

    def also(self, *matchers: str) -> str:
        """The matchers plus more, as the inside of a selector's braces."""
        return ", ".join(part for part in (self.matchers, *matchers) if part)

    @property
    def by_clause(self) -> str:
        return ", ".join(self.by)


def by(labels: Sequence[str]) -> str:
    return ", ".join(labels)


# The rules' templates (monitoring.tunables) select with the metric selector of _config, which may be empty: its
# placeholder as a selector's matchers (alone, or first of several) is written in the form that renders either way.
METRIC_SELECTOR = "%(metricSelector)s"
_FIRST = METRIC_SELECTOR + ", "


def selector(metric: str, matchers: str = "") -> str:
    if matchers == METRIC_SELECTOR:
        return f"{metric}%(metricMatchers)s"
    if matchers.startswith(_FIRST):
        return f"{metric}{{%(metricMatchersFirst)s{matchers.removeprefix(_FIRST)}}}"
    return f"{metric}{{{matchers}}}" if matchers else metric


LINE = 120  # the rules' expressions break a call onto lines of its own beyond this (the mixin's lines stay short)


def indent(text: str, by_: str = "  ") -> str:
    return "\n".join(by_ + line if line else line for line in text.split("\n"))


def call(head: str, inner: str) -> str:
    """``head (inner)`` (a function or an aggregation) on one line where it fits, else its argument indented on lines
    of its own."""
    one = f"{head} ({inner})"
    if "\n" not in one and len(one) <= LINE:
        return one
    return f"{head} (\n{indent(inner)}\n)"


def fmt_num(x: float) -> str:
    return f"{x:g}"


def rate_sum(metric: str, scope: Scope, window: str, *matchers: str) -> str:
    return f"sum by ({scope.by_clause}) (rate({selector(metric, scope.also(*matchers))}[{window}]))"


def guarded_ratio(numerator: str, denominator: str) -> str:
    """numerator / denominator, with no sample (rather than NaN or Inf) where the denominator is 0."""
    return f"{numerator}\n/\n({denominator} > 0)"


def z_score(estimate: str, null: str, evidence: str, variance: str) -> str:
    """The statistic of a one-sided z-test (core.stats.evidence): how far ``estimate`` is below ``null``, in standard
    errors, measured over ``evidence`` units of ``variance`` each; past the test's bar, the data rule out a ratio at
    ``null`` or above. Every operand carries the same labels."""
    return f"({null} - {estimate})\n* sqrt({evidence} / ({variance}))"


def acceptance_ratio(scope: Scope, window: str) -> str:
    """α pooled over the scope: Σ accepted / Σ drafted."""
    return guarded_ratio(rate_sum(m.ACCEPTED_TOKENS.exposed_name, scope, window),
                         rate_sum(m.DRAFT_TOKENS.exposed_name, scope, window))


def mean_acceptance_length(scope: Scope, window: str) -> str:
    """1 + Σ accepted / Σ drafts (vLLM's definition, the bonus token included)."""
    return "1 + " + guarded_ratio(rate_sum(m.ACCEPTED_TOKENS.exposed_name, scope, window),
                                  rate_sum(m.DRAFTS.exposed_name, scope, window))


def break_even(scope: Scope, basis: str = "configured") -> str:
    """The sidecars' break-even α (= their cost per drafted token) on one cost basis, the highest in the scope."""
    basis_matcher = f'cost_basis="{basis}"'
    return f"max by ({scope.by_clause}) ({selector(m.BREAK_EVEN.name, scope.also(basis_matcher))})"


def break_even_in_force(scope: Scope) -> str:
    """The break-even α in force: calibrated to the observed speedup where a baseline gives one, else configured."""
    return f"{break_even(scope, 'calibrated')}\nor\n{break_even(scope)}"


def expected_speedup(scope: Scope, window: str) -> str:
    """The modelled speedup from counters and the configured cost: S = (1 + A/D) / (1 + T/D · break-even),
    pooled over the scope (the sidecar's specdecode_expected_speedup, for many pods)."""
    drafts = f"({rate_sum(m.DRAFTS.exposed_name, scope, window)} > 0)"
    accepted = rate_sum(m.ACCEPTED_TOKENS.exposed_name, scope, window)
    drafted = rate_sum(m.DRAFT_TOKENS.exposed_name, scope, window)
    return f"(1 + {accepted} / {drafts})\n/\n(1 + {drafted} / {drafts}\n   * {break_even(scope)})"


def bucket_at_or_below(bounds: Sequence[float], x: float) -> float:
    """The largest of the (ascending) bucket ``bounds`` at or below ``x``: the bucket a threshold falls on."""
    return max(b for b in bounds if b <= x + 1e-9)


def spec_pods_waiting(scope: Scope, window_label: str) -> str:
    """Mean requests waiting per spec-decode engine, from the sidecars' windowed gauge (control targets, whose
    specdecode_info says method="off", left out)."""
    waiting = selector(m.REQUESTS_WAITING.name, scope.also(f'window="{window_label}"'))
    info = selector(m.INFO.name, scope.also('method!="off"'))
    return (f"avg by ({scope.by_clause}) ({waiting}\nand ignoring (window, api, method, num_speculative_tokens)\n"
            f"{info})")


def baseline_over_current(record: str, matchers: str = "") -> str:
    """A per-spec_decode record as the observed speedup: the control pods' value over the spec-decode pods'."""
    control = selector(record, ", ".join(p for p in (matchers, 'spec_decode="false"') if p))
    spec = selector(record, ", ".join(p for p in (matchers, 'spec_decode="true"') if p))
    return f"{control}\n/ ignoring (spec_decode)\n({spec} > 0)"


def record_name(level: str, metric: str, op: str) -> str:
    return f"{level}:{metric}:{op}"
