"""The short stage: the only rules that range over the pods' raw series.

A fleet's ruler pays for every raw sample a rule reads, at every evaluation. Rules that range over each pod's raw
series for an hour re-read that hour for every pod every time (the way Prometheus cost 8x vLLM's own page at 100
pods). So, as Sloth and Pyrra build their long SLO windows: each counter and histogram the rules need is summed to
the level the alerts and panels read (model; model and band; model, spec_decode and le) over one short range
(``windows.stage``, 1m), recorded at every ``statistics.evaluation_interval`` (15 s). Every longer window is then
an ``avg_over_time`` (a rate) or a ``sum_over_time`` (a count) of those per-model records: one series per model,
not one per pod, whatever the window.

Why a rate over the stage range, not an increase since the last evaluation: a rate needs no knowledge of when the
ruler evaluates, so a window's rate is the same under promtool, a remote ruler or a missed iteration. The count a
window covers (the evidence of a test) is the sum of the records times the evaluation interval: a record that is
missing (a scrape gap longer than the stage, a missed evaluation) counts for nothing, so the evidence never
overstates what the samples saw (less evidence makes a test slower, never noisier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from specdecode_exporter.core import metrics as m
from specdecode_exporter.core.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring.promql import by, fmt_num, record_name, selector

How = Literal["rate", "avg", "count"]
BAND_LABELS = ("workload", "temperature")
ROUTE_CLASS_LABELS = ("workload", "temperature", "prompt_length")  # prompt_length only where its bands are set


@dataclass(frozen=True, slots=True)
class Staged:
    """One raw family summed to one level over the stage range: ``rate`` for counters, ``avg``/``count`` of a
    gauge's series (an instant read)."""

    group: str  # the stage group it is recorded in (specdecode.rules.stage.<group>)
    level: str  # the record's level (its name's first part)
    name: str  # the metric part of the record's name
    exposed: str  # the raw series it reads
    by: tuple[str, ...]  # empty: not aggregated (each series keeps its labels)
    matchers: tuple[str, ...] = ()
    how: How = "rate"


def _record(cfg: MonitoringConfig, s: Staged) -> str:
    op = f"stage_rate{cfg.windows.stage}" if s.how == "rate" else f"stage_{s.how}"
    return record_name(s.level, s.name, op)


def _expr(cfg: MonitoringConfig, s: Staged) -> str:
    raw = selector(s.exposed, ", ".join(p for p in (cfg.metric_selector, *s.matchers) if p))
    if s.how == "rate":
        rate = f"rate({raw}[{cfg.windows.stage}])"
        return f"sum by ({by(s.by)}) ({rate})" if s.by else rate  # no labels: each series as it is
    return f"{s.how} by ({by(s.by)}) ({raw})"


def _histogram(group: str, level: str, name: str, labels: tuple[str, ...],
               matchers: tuple[str, ...] = ()) -> list[Staged]:
    return [Staged(group, level, f"{name}_bucket", f"{name}_bucket", (*labels, "le"), matchers),
            Staged(group, level, f"{name}_count", f"{name}_count", labels, matchers)]


def families(cfg: MonitoringConfig) -> dict[str, Staged]:
    """Every raw family the rules read over a range, by a key the readers use."""
    model, level = cfg.level_labels(), cfg.alert_level
    sides = (*model, "spec_decode")
    band = (*model, *BAND_LABELS)
    series = tuple(dict.fromkeys((*model, *cfg.target_labels, "model_name", "engine")))
    tpot = m.REQUEST_TPOT.name
    out: dict[str, Staged] = {
        "drafts": Staged("page", level, m.DRAFTS.name, m.DRAFTS.exposed_name, model),
        "draft_tokens": Staged("page", level, m.DRAFT_TOKENS.name, m.DRAFT_TOKENS.exposed_name, model),
        "accepted_tokens": Staged("page", level, m.ACCEPTED_TOKENS.name, m.ACCEPTED_TOKENS.exposed_name, model),
        # Per series: the health alerts name the pod and the target.
        "collect_errors": Staged("page", "target", m.COLLECT_ERRORS.name, m.COLLECT_ERRORS.exposed_name, ()),
        "route_requests": Staged("page", level, m.ROUTE_REQUESTS.name, m.ROUTE_REQUESTS.exposed_name,
                                 (*model, *ROUTE_CLASS_LABELS)),
        "tpot_sum": Staged("latency", level, f"{tpot}_sum", f"{tpot}_sum", sides),
        "pod_tpot_count": Staged("latency", "instance", f"{tpot}_count", f"{tpot}_count",
                                 cfg.level_labels("instance"), ('spec_decode="true"',)),
        "preemptions": Staged("latency", level, m.PREEMPTIONS.name, m.PREEMPTIONS.exposed_name, sides),
        "generated": Staged("latency", level, m.GENERATED_TOKENS.name, m.GENERATED_TOKENS.exposed_name, sides),
        "engines": Staged("latency", level, "specdecode_generating_engines", m.GENERATED_TOKENS.exposed_name,
                          sides, how="count"),
        "kv_cache": Staged("latency", level, m.KV_CACHE_USAGE.name, m.KV_CACHE_USAGE.name, sides, how="avg"),
        "requests": Staged("requests", f"{level}_band", m.REQUESTS.name, m.REQUESTS.exposed_name, band),
        "request_accepted": Staged("requests", f"{level}_band", m.REQUEST_ACCEPTED_TOKENS.name,
                                   m.REQUEST_ACCEPTED_TOKENS.exposed_name, band),
        "request_drafted": Staged("requests", f"{level}_band", m.REQUEST_DRAFT_TOKENS.name,
                                  m.REQUEST_DRAFT_TOKENS.exposed_name, band),
    }
    position = m.ACCEPTED_BY_POSITION
    out["accepted_by_position"] = Staged("page", level, position.name, position.exposed_name, (*model, "position"))
    for key, s in (("emitted", m.EMITTED_TOKENS), ("generated", m.GENERATED_TOKENS), ("drafted", m.DRAFT_TOKENS)):
        out[f"series_{key}"] = Staged("series", "engine", s.name, s.exposed_name, series)
    histograms = {"interval": ("page", m.INTERVAL_ACCEPTANCE.name, model),
                  "tpot": ("latency", tpot, sides),
                  "request": ("requests", m.REQUEST_ACCEPTANCE.name, model),
                  "engine_request": ("requests", m.ENGINE_REQUEST_ACCEPTANCE.name, model)}
    for key, (group, name, labels) in histograms.items():
        bucket, count = _histogram(group, level, name, labels)
        out[f"{key}_bucket"], out[f"{key}_count"] = bucket, count
    return out


def family(cfg: MonitoringConfig, key: str) -> Staged:
    return families(cfg)[key]


def record(cfg: MonitoringConfig, key: str, *matchers: str) -> str:
    """The stage's record of ``key``, selected by ``matchers``."""
    return selector(_record(cfg, family(cfg, key)), ", ".join(matchers))


def rate(cfg: MonitoringConfig, key: str, window: str, *matchers: str) -> str:
    """The per-second rate of ``key`` over ``window`` (per level series): the stage's rates averaged. A gauge's
    ``avg``/``count`` record averaged the same way."""
    return f"avg_over_time({record(cfg, key, *matchers)}[{window}])"


CLOCK = "specdecode:stage_clock_seconds"  # the stage's evaluation times: what its records are spaced by


def spacing(window: str) -> str:
    """The time each of the stage's records over ``window`` stands for, from its clock: the span its evaluations
    cover over how many there are. That is the interval it runs at (longer where evaluations were missed, whatever
    promtool uses) less one interval's share, so that a window holding both its ends (a range is closed at both in
    Prometheus 2) never counts one record too many: a count is at most one interval short, never over."""
    clock = f"{CLOCK}[{window}]"
    return f"((max_over_time({clock}) - min_over_time({clock})) / count_over_time({clock}))"


def count(cfg: MonitoringConfig, key: str, window: str, *matchers: str) -> str:
    """What ``key`` counted over ``window`` as far as the stage's records cover it: Σ rate × the time between
    evaluations. A missing record (a gap, a series that began inside the window) counts nothing; no sample before
    the stage has evaluated twice in the window."""
    return f"sum_over_time({record(cfg, key, *matchers)}[{window}])\n* on () group_left ()\n{spacing(window)}"


def record_names(cfg: MonitoringConfig) -> set[str]:
    return {_record(cfg, s) for s in families(cfg).values()} | {CLOCK}


STAGE_GROUPS = ("page", "latency", "requests", "series")


def stage_groups(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    """The stage's groups, evaluated as often as the page's tests (whose evidence counts their evaluations)."""
    staged = families(cfg).values()
    clock = [{"record": CLOCK, "expr": "time()"}]
    return [{"name": f"specdecode.rules.stage.{group}", "interval": cfg.statistics.evaluation_interval,
             "rules": [*(clock if group == STAGE_GROUPS[0] else []),
                       *({"record": _record(cfg, s), "expr": _expr(cfg, s)} for s in staged if s.group == group)]}
            for group in STAGE_GROUPS]


@dataclass(frozen=True, slots=True)
class Pooled:
    """Queries over the stage's records, pooled by the alert level (the dashboard's per-model panels): any
    window, at the cost of one series per model instead of one per pod. ``matchers`` select models."""

    cfg: MonitoringConfig
    matchers: str

    @property
    def labels(self) -> tuple[str, ...]:
        return self.cfg.level_labels()

    def rate(self, key: str, window: str, *matchers: str, by_also: tuple[str, ...] = ()) -> str:
        selected = rate(self.cfg, key, window, *(p for p in (self.matchers, *matchers) if p))
        return f"sum by ({by((*self.labels, *by_also))}) ({selected})"

    def ratio(self, numerator: str, denominator: str, window: str, *matchers: str,
              by_also: tuple[str, ...] = ()) -> str:
        top = self.rate(numerator, window, *matchers, by_also=by_also)
        return f"{top}\n/\n({self.rate(denominator, window, *matchers, by_also=by_also)} > 0)"

    def quantile(self, q: float, histogram: str, window: str, *matchers: str, by_also: tuple[str, ...] = ()) -> str:
        buckets = self.rate(f"{histogram}_bucket", window, *matchers, by_also=(*by_also, "le"))
        return (f"histogram_quantile({fmt_num(q)}, {buckets})\nand on ({by((*self.labels, *by_also))})\n"
                f"({self.rate(f'{histogram}_count', window, *matchers, by_also=by_also)} > 0)")

    def share_below(self, histogram: str, bound: float, window: str) -> str:
        return self.ratio(f"{histogram}_bucket", f"{histogram}_count", window, f'le="{fmt_num(bound)}"')

    def increase_by_le(self, histogram: str, window: str) -> str:
        """Per bucket bound, what the histogram counted over ``window`` (a heatmap's cells)."""
        return f"sum by (le) (\n{count(self.cfg, f'{histogram}_bucket', window, self.matchers)}\n)"
