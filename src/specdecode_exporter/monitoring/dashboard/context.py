"""What every panel of the dashboard reads: the config, the selectors built from it (Context), and the
dashboard's constants. A panel is a function of the Context (Panel)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.models import dashboard as dm

from specdecode_exporter.core import metrics as m
from specdecode_exporter.core.monitoring_config import MonitoringConfig
from specdecode_exporter.core.verdict import Verdict
from specdecode_exporter.monitoring import promql as q
from specdecode_exporter.monitoring import rules, stage

TAGS = ["specdecode", "vllm", "llm-serving"]
DATASOURCE_VAR = "datasource"
UNIT_TOKENS_PER_S = "si:tok/s"
UNIT_SPEEDUP = "suffix:×"
UNIT_TOKENS_PER_STEP = "suffix: tok/step"
RED, YELLOW, GREEN, BLUE = "red", "yellow", "green", "blue"
VERDICT_COLOURS = {Verdict.HURTING: RED, Verdict.MARGINAL: YELLOW, Verdict.PAYING_OFF: GREEN}
DS = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
# The variables every dashboard has; labels of the config's alert level that are not among them get their own.
STANDARD_VARIABLES = ("namespace", "job", "model_name", "engine", "pod", "instance")
RATE_INTERVAL = "$__rate_interval"
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"


def label_matchers(names: Sequence[str]) -> str:
    return ", ".join(f'{name}=~"${name}"' for name in names)


@dataclass(frozen=True)
class Context:
    """What every panel reads: the config and the selectors built from it."""

    cfg: MonitoringConfig

    @property
    def extra_variables(self) -> tuple[str, ...]:
        return tuple(label for label in self.cfg.level_labels() if label not in STANDARD_VARIABLES)

    @property
    def scope(self) -> q.Scope:
        """The sidecar's series under every variable, pooled by the alert level (per model)."""
        names = (*self.extra_variables, "namespace", "job", "pod", "instance", "model_name", "engine")
        return q.Scope(label_matchers(names), self.cfg.level_labels())

    @property
    def tapped(self) -> q.Scope:
        """The request tap's series: per model (they have no engine label), by the alert level."""
        names = (*self.extra_variables, "namespace", "job", "pod", "instance", "model_name")
        return q.Scope(label_matchers(names), self.cfg.level_labels())

    @property
    def engines(self) -> str:
        """The stage's per-engine records (the speculation-stopped test's): scrape and engine identity, no pod."""
        return label_matchers((*self.extra_variables, "namespace", "job", "instance", "model_name", "engine"))

    @property
    def health(self) -> str:
        """Health series may lack model_name (a target that never answered): scrape identity only."""
        return label_matchers((*self.extra_variables, "namespace", "job", "pod", "instance"))

    @property
    def vllm(self) -> q.Scope:
        """vLLM's own series come from another scrape job and port: pod and model identity only."""
        return q.Scope(label_matchers((*self.extra_variables, "namespace", "pod", "model_name", "engine")),
                       ("model_name",))

    @property
    def rule_matchers(self) -> str:
        return label_matchers(self.cfg.level_labels())

    @property
    def legend(self) -> str:
        labels = self.cfg.level_labels()
        return " ".join(["{{model_name}}", *(f"{{{{{label}}}}}" for label in labels if label != "model_name")])

    @property
    def page(self) -> float:
        return self.cfg.thresholds.page_acceptance_ratio

    @property
    def alert_prefix(self) -> str:
        return rules.ALERT_NAME_PREFIX

    @property
    def pooled(self) -> stage.Pooled:
        """Per-model panels read the rules' short stage, never the pods' raw series over a window: cheap at any
        dashboard range."""
        return stage.Pooled(self.cfg, self.rule_matchers)

    def staged_sum(self, key: str, by_labels: tuple[str, ...], matchers: str = "", window: str = RATE_INTERVAL) -> str:
        """A counter's rate from the stage's record of it (stage.families' ``key``), summed by the labels a panel
        splits on: the pods' raw series are never read over the dashboard's range. ``matchers``: the record's own
        labels to select on (the models' by default)."""
        return f"sum by ({q.by(by_labels)}) ({stage.rate(self.cfg, key, window, matchers or self.rule_matchers)})"

    def alpha(self, window: str = "$window") -> str:
        return self.pooled.ratio("accepted_tokens", "draft_tokens", window)

    def mean_length(self) -> str:
        return "1 + " + self.pooled.ratio("accepted_tokens", "drafts", "$window")

    def speedup(self) -> str:
        """The modelled speedup from the pooled counters and the configured break-even (promql.expected_speedup)."""
        rate = functools.partial(self.pooled.rate, window="$window")
        drafts = f"({rate('drafts')} > 0)"
        return (f"(1 + {rate('accepted_tokens')} / {drafts})\n/\n(1 + {rate('draft_tokens')} / {drafts}\n   * "
                f"{q.break_even(self.scope)})")

    def tpot_mean(self, spec_decode: str) -> str:
        """The sidecars' pooled TPOT for spec-decode ("true") or control ("false") pods, exact from _sum/_count."""
        return self.pooled.ratio("tpot_sum", "tpot_count", "$window", f'spec_decode="{spec_decode}"',
                                 by_also=("spec_decode",))

    def tpot_quantile(self, quantile: float, spec_decode: str) -> str:
        return self.pooled.quantile(quantile, "tpot", "$window", f'spec_decode="{spec_decode}"',
                                    by_also=("spec_decode",))

    def observed(self, statistic: str) -> str:
        """Observed speedup per model: the fleet's (control pods' TPOT over spec-decode pods') where there are
        control pods, else the best pod's own (against its control target or measured baseline)."""
        quantile = {"mean": None, "p50": 0.5, "p99": 0.99}[statistic]
        control, spec = ((self.tpot_mean("false"), self.tpot_mean("true")) if quantile is None else
                         (self.tpot_quantile(quantile, "false"), self.tpot_quantile(quantile, "true")))
        statistic_matcher = f'statistic="{statistic}"'
        pods = f"max by ({self.scope.by_clause}) ({self.windowed(m.OBSERVED_SPEEDUP.name, statistic_matcher)})"
        return f"(({control})\n/ ignoring (spec_decode)\n({spec} > 0))\nor\n{pods}"

    def rate(self, key: str, window: str = RATE_INTERVAL) -> str:
        """A counter's rate per model, from the stage's record of it (stage.families' ``key``)."""
        return self.pooled.rate(key, window)

    def side(self, what: str, spec_decode: str) -> str:
        """A capacity figure of the spec-decode ("true") or control ("false") pods over $window."""
        marked = (f'spec_decode="{spec_decode}"',)
        def ratio(numerator: str, denominator: str) -> str:
            return self.pooled.ratio(numerator, denominator, "$window", *marked, by_also=("spec_decode",))

        return {"preemptions": ratio("preemptions", "tpot_count"), "generated": ratio("generated", "engines"),
                "kv_cache": self.pooled.rate("kv_cache", "$window", *marked, by_also=("spec_decode",))}[what]

    def capacity_costs(self) -> tuple[str, str]:
        """The verdict's capacity conditions against the control pods, over $window (core.verdict)."""
        bounds = self.cfg.verdict.capacity
        increase = (f"({self.side('preemptions', 'true')})\n- ignoring (spec_decode)\n"
                    f"({self.side('preemptions', 'false')})")
        throughput = (f"({self.side('generated', 'true')})\n/ ignoring (spec_decode)\n"
                      f"({self.side('generated', 'false')} > 0)\nand on ({self.scope.by_clause})\n"
                      f"({q.spec_pods_waiting(self.scope, '$window')} >= {q.fmt_num(bounds.min_waiting_requests)})")
        return (f"({increase}) <= bool {q.fmt_num(bounds.max_preemptions_per_request_increase)}",
                f"({throughput}) >= bool {q.fmt_num(bounds.min_throughput_ratio)}")

    def per_pod(self) -> q.Scope:
        """The sidecar's series one by one (each target and engine), under every variable."""
        labels = (*self.cfg.level_labels(), "pod", "target", "engine")
        return q.Scope(self.scope.matchers, tuple(dict.fromkeys(labels)))

    def windowed(self, metric: str, *matchers: str) -> str:
        """One of the sidecar's windowed gauges, at the dashboard's window."""
        return q.selector(metric, self.scope.also('window="$window"', *matchers))


Panel = Callable[[Context], Any]


@dataclass(frozen=True)
class Row:
    """One row of the dashboard: its title and its panels, left to right (wrapping at 24 columns)."""

    title: str
    panels: tuple[Panel, ...]
