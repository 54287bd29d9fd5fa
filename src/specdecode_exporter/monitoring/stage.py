"""The short stage: the only rules that read the pods' raw counters and histograms.

A fleet's ruler pays for every raw sample a rule reads, at every evaluation. Rules that range over each pod's raw
series for an hour re-read that hour for every pod every time (Prometheus spent 8x on them what scraping vLLM's own
page cost, at 100 pods). So, as Sloth and Pyrra build their long SLO windows from a short recorded stage: each
counter and histogram the rules need is summed, at every step of its stage group, to the level the alerts and panels
read (model; model and band; model, spec_decode and le), as its increase since the previous evaluation:
``(x - x offset <step>) >= 0`` per series (a counter that fell was reset and counts nothing for that step; a
series without a sample a step ago counts nothing yet), then summed. Each series' two instant samples are all the
stage reads, whatever the scrape interval. Not ``increase(x[<step>])``, though one range read per series would cost
less than two instant reads and their match: at a 1m scrape interval a 1m range holds one sample and counts
nothing, where the offset form finds the last sample within Prometheus' lookback.

Two steps. The page's evidence (drafted and accepted tokens, drafts) is staged at
``statistics.evaluation_interval`` (15 s): the page's budgets and delays count its evaluations. Everything else
(histograms, per-request and band counters, latency, positions, routing, the collection errors the health tickets
count) feeds windows of 5 minutes and more and is
staged every ``windows.stage_interval`` (1m): a quarter of the raw reads, and most of the stage's series.

Every longer window is built from those per-model records: the count a window holds is the sum of its records
(exactly what the samples saw, each scrape's increment once: the page's evidence), its rate their mean over the
step. So a 2 h window reads 480 samples of one series per model, not 480 of every pod's.

A ruler that evaluates a stage group at another spacing than its step (promtool evaluates every group at the test's
interval; missed iterations) samples increases, or overlaps them; each group's clock (the time of each of its
evaluations) scales the sum by the spacing it actually ran at over its step, so such a window's count is an
estimate, never a multiple, of the true one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from specdecode_exporter.core.config.validation import duration_seconds
from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring import tunables
from specdecode_exporter.monitoring.promql import METRIC_SELECTOR, by, fmt_num, record_name, selector

How = Literal["increase", "avg", "count"]
DURATION = re.compile(r"(\d+(ms|[smhdwy]))+")
BAND_LABELS = ("workload", "temperature")
ROUTE_CLASS_LABELS = ("workload", "temperature", "prompt_length")  # prompt_length only where its bands are set


@dataclass(frozen=True, slots=True)
class Staged:
    """One raw family summed to one level at each step: ``increase`` for counters, ``avg``/``count`` of a gauge's
    series."""

    group: str  # the stage group it is recorded in (specdecode.rules.stage.<group>; STAGE_GROUPS)
    level: str  # the record's level (its name's first part)
    name: str  # the metric part of the record's name
    exposed: str  # the raw series it reads
    by: tuple[str, ...]  # empty: not aggregated (each series keeps its labels)
    matchers: tuple[str, ...] = ()
    how: How = "increase"


def _record(cfg: MonitoringConfig, s: Staged) -> str:
    return record_name(s.level, s.name, f"stage_{s.how}")


def step_increase(raw: str, step: str) -> str:
    """Each series' increase over the last ``step`` (its samples then and now, the latest at or before each). A
    counter that fell was reset and counts nothing for that step: at most one step's increments lost per restart,
    and no spike where a restarted sidecar resumes from vLLM's own lifetime count (rate() would count it all at
    once). One vector match per family: the stage is most of the rules' cost at a fleet's size.

    The fallen series is dropped by a comparison filter, not clamped to 0: the sums are the same, and
    ``clamp_min`` builds every series' labels anew (Prometheus drops the name per sample), 17 % of a stage rule's
    evaluation at 400 pods (189 ms against 156 ms, an instant query of one band counter). Where every series of a
    record's group fell in the same step (a one-pod model's reset), that step has no sample instead of a 0: the
    windows' sums (sum_over_time, scaled by the stage's clock) are the same."""
    return f"{raw}\n- {raw} offset {step}\n>= 0"


STAGE_GROUPS = ("page", "acceptance", "latency", "requests", "series")
EVIDENCE_GROUP = STAGE_GROUPS[0]  # the page's evidence: staged as often as the page's tests evaluate


def step(cfg: MonitoringConfig, group: str) -> str:
    """How often ``group`` is evaluated, and the span of each of its records' increases: the page's evidence every
    statistics.evaluation_interval, the others every windows.stage_interval (1m; a value the mixin's _config does
    not change, since the records' arithmetic divides by it)."""
    return cfg.statistics.evaluation_interval if group == EVIDENCE_GROUP else cfg.windows.stage_interval


def _expr(cfg: MonitoringConfig, s: Staged) -> str:
    raw = selector(s.exposed, ", ".join((METRIC_SELECTOR, *s.matchers)))
    if s.how == "increase":
        increase = step_increase(raw, step(cfg, s.group))
        if not s.by:  # no labels: each series as it is
            return increase + "\n"
        return f"sum by ({by(s.by)}) (\n{_indent(increase)}\n)\n"
    return f"{s.how} by ({by(s.by)}) ({raw})"


def _indent(text: str, by_: str = "  ") -> str:
    return "\n".join(by_ + line for line in text.split("\n"))


def _histogram(group: str, level: str, name: str, labels: tuple[str, ...]) -> list[Staged]:
    return [Staged(group, level, f"{name}_bucket", f"{name}_bucket", (*labels, "le")),
            Staged(group, level, f"{name}_count", f"{name}_count", labels)]


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
        "collect_errors": Staged("series", "target", m.COLLECT_ERRORS.name, m.COLLECT_ERRORS.exposed_name, ()),
        "route_requests": Staged("acceptance", level, m.ROUTE_REQUESTS.name, m.ROUTE_REQUESTS.exposed_name,
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
    for key, spec in (("request_draft_squared", m.REQUEST_DRAFT_TOKENS_SQUARED),
                      ("request_accepted_squared", m.REQUEST_ACCEPTED_TOKENS_SQUARED),
                      ("request_product", m.REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT)):  # the page's variance, measured
        out[key] = Staged("requests", level, spec.name, spec.exposed_name, model)
    # The dashboard's: per model, by what each panel splits on (its queries read no raw range).
    out["requests_without_spec"] = Staged("requests", level, m.REQUESTS_WITHOUT_SPEC.name,
                                          m.REQUESTS_WITHOUT_SPEC.exposed_name, (*model, "reason"))
    out["route_requests_by_pool"] = Staged("acceptance", f"{level}_pool", m.ROUTE_REQUESTS.name,
                                           m.ROUTE_REQUESTS.exposed_name, (*model, "upstream", "reason"))
    out["scheduled_steps"] = Staged("acceptance", level, m.SCHEDULED_STEPS.name, m.SCHEDULED_STEPS.exposed_name,
                                    (*model, "num_speculative_tokens"))
    position = m.ACCEPTED_BY_POSITION
    out["accepted_by_position"] = Staged("acceptance", level, position.name, position.exposed_name,
                                         (*model, "position"))
    for key, s in (("emitted", m.EMITTED_TOKENS), ("generated", m.GENERATED_TOKENS), ("drafted", m.DRAFT_TOKENS)):
        out[f"series_{key}"] = Staged("series", "engine", s.name, s.exposed_name, series)
    histograms = {"interval": ("acceptance", m.INTERVAL_ACCEPTANCE.name, model),
                  "tpot": ("latency", tpot, sides),
                  "request": ("requests", m.REQUEST_ACCEPTANCE.name, model),
                  "engine_request": ("requests", m.ENGINE_REQUEST_ACCEPTANCE.name, model)}
    for key, (group, name, labels) in histograms.items():
        bucket, count = _histogram(group, level, name, labels)
        out[f"{key}_bucket"], out[f"{key}_count"] = bucket, count
    # The speed panel's mean per α band: a sum and a count per band, where its 15 buckets per band were a quarter of
    # the whole stage's reads at a fleet's size.
    speed = m.REQUEST_SPEED.name
    for part in ("sum", "count"):
        out[f"request_speed_{part}"] = Staged("requests", level, f"{speed}_{part}", f"{speed}_{part}",
                                              (*model, "acceptance"))
    return out


def family(cfg: MonitoringConfig, key: str) -> Staged:
    return families(cfg)[key]


def record(cfg: MonitoringConfig, key: str, *matchers: str) -> str:
    """The stage's record of ``key``, selected by ``matchers``."""
    return selector(_record(cfg, family(cfg, key)), ", ".join(matchers))


def _step_s(cfg: MonitoringConfig, key: str) -> str:
    return fmt_num(duration_seconds(step(cfg, family(cfg, key).group)))


def within(window: str, trim_s: float) -> str:
    """``window`` less ``trim_s`` and a millisecond: a Prometheus 2 range is closed at both ends, and on a ruler that
    evaluates on the stage's grid (promtool does) the record at the window's start covers the step before it."""
    if not DURATION.fullmatch(window):
        raise ValueError(f"{window}: a count's window must be a duration")
    ms = max(round((duration_seconds(window) - trim_s) * 1000) - 1, 1)
    parts = [(ms // 3_600_000, "h"), (ms // 60_000 % 60, "m"), (ms // 1000 % 60, "s"), (ms % 1000, "ms")]
    return "".join(f"{n}{unit}" for n, unit in parts if n)


def span(cfg: MonitoringConfig, key: str, window: str) -> str:
    """The range of ``key``'s records that covers ``window``. The page's evidence: one step short of it, as rate() and
    increase() over the raw samples covered the n − 1 intervals between a window's n scrapes (the page's budgets and
    the paging bench's delays were measured on those). Every other family: the whole window, its records' steps
    tiling it exactly."""
    trim = duration_seconds(step(cfg, EVIDENCE_GROUP)) if family(cfg, key).group == EVIDENCE_GROUP else 0.0
    return within(window, trim)


def rate(cfg: MonitoringConfig, key: str, window: str, *matchers: str, exact: bool = False) -> str:
    """The per-second rate of ``key`` over ``window`` (per level series): its step increases averaged, over the
    step. A gauge's ``avg``/``count`` record is averaged as it is. ``exact``: as count's."""
    covered = span(cfg, key, window) if exact else window
    averaged = f"avg_over_time({record(cfg, key, *matchers)}[{covered}])"
    return f"{averaged} / {_step_s(cfg, key)}" if family(cfg, key).how == "increase" else averaged


CLOCK = "specdecode:stage_clock_seconds"  # each stage group's evaluation times (label stage): its records' spacing


def clock(group: str) -> str:
    return f'{CLOCK}{{stage="{group}"}}'


def coverage(cfg: MonitoringConfig, key: str, window: str) -> str:
    """How many steps each of ``key``'s records over ``window`` stands for: the mean spacing of its group's clock over
    the step. 1 where the group ran every step, more where it ran less often, less where it ran more often (its
    increases overlap). No sample until it has run twice."""
    ticks = f"{clock(family(cfg, key).group)}[{window}]"
    spacing = (f"(\n    max_over_time({ticks})\n    - min_over_time({ticks})\n  )\n"
               f"  / (count_over_time({ticks}) - 1 > 0)")
    return f"(\n  {spacing}\n  / {_step_s(cfg, key)}\n)"


def count(cfg: MonitoringConfig, key: str, window: str, *, exact: bool = True,
          by_labels: tuple[str, ...] | None = None) -> str:
    """What ``key`` counted over ``window``: the sum of its step increases (each scrape's increment once, where the
    stage ran every step). A series that began inside the window counts from its second sample. ``exact``: the
    window is a duration (not a value the mixin's _config may change) and no record at its start counts."""
    window = span(cfg, key, window) if exact else window
    total = f"sum_over_time({record(cfg, key)}[{window}])"
    if by_labels is not None:  # pooled further (a band's records per model)
        total = f"sum by ({by(by_labels)}) ({total})"
    return f"{total}\n* on () group_left () {coverage(cfg, key, window)}"


def stage_templates(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    """The stage's groups as templates (monitoring.tunables), each evaluated every step of its own, with its
    clock."""
    staged = families(cfg).values()
    return [{"name": f"specdecode.rules.stage.{group}", "interval": step(cfg, group),
             "rules": [{"record": CLOCK, "expr": "time()", "labels": {"stage": group}},
                       *({"record": _record(cfg, s), "expr": _expr(cfg, s)} for s in staged if s.group == group)]}
            for group in STAGE_GROUPS]


def stage_groups(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    """The stage's groups as a ruler reads them."""
    rendered: list[dict[str, Any]] = tunables.fill(stage_templates(cfg), tunables.mapping(cfg))
    return rendered

