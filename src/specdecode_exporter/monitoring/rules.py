"""Recording and alerting rules from the monitoring config, in files by concern.

Every expression, record name and annotation is built as a template (monitoring.tunables): the values a mixin user
tunes are named placeholders (``%(pageAcceptanceRatio)g``), literal ``%`` is ``%%``, and ``rule_files`` /
``rule_groups`` fill them from the config. The mixin (monitoring.mixin_rules) emits the same templates.

Alerts are a table: each entry says what is wrong (its expression and words) and nothing else. One pass over
every rule (``finish``) adds what all of them share: ``for:``, the severity and extra labels, and the runbook
link — the way kubernetes-mixin adds ``runbook_url`` to every group with one function. An alert on a ratio is a
statistical test with its own minimum evidence (core.stats.evidence; the statistics section of the monitoring config);
the arithmetic of each test sits in named records (its α, its evidence, its z-score, whether it proves), so that an
alert reads those records against thresholds the runbook names, as Sloth's and Pyrra's do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from specdecode_exporter.core.config.validation import duration_seconds
from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.contract.failure import FailureReason
from specdecode_exporter.core.contract.metrics import quantile_name
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.core.stats.evidence import critical_z
from specdecode_exporter.monitoring import stage, tunables, variance
from specdecode_exporter.monitoring.promql import (
    METRIC_SELECTOR,
    Scope,
    baseline_over_current,
    break_even_in_force,
    by,
    call,
    fmt_num,
    guarded_ratio,
    indent,
    record_name,
    selector,
    spec_pods_waiting,
    z_score,
)
from specdecode_exporter.monitoring.tunables import escape, p

Rule = dict[str, Any]
ALERT_NAME_PREFIX = "SpecDecode"  # every alert's name starts with it (the dashboard selects ALERTS by it)
WHERE = "{{ $labels.model_name }}{{ with $labels.namespace }} (namespace {{ . }}){{ end }}"
PCT = "{{ $value | humanizePercentage }}"
ACCEPTANCE = m.ACCEPTANCE_RATIO.name
INTERVAL = m.INTERVAL_ACCEPTANCE.name
VARIANCE = m.ACCEPTANCE_VARIANCE.name
SHORT = p("shortWindow")  # the short window: a value the mixin's _config may change
Q = "%%q"  # printf's quoted-string verb inside an annotation's query (a template: % doubled)


@dataclass(frozen=True, slots=True)
class Alert:
    """What one alert says; ``finish`` turns it into a rule. Its texts are templates; ``%(for)s`` in them is the
    alert's own ``for:``."""

    name: str
    expr: str
    summary: str
    description: str
    # A low-traffic guard at this window: only where the alert is not a test with its own minimum evidence (the
    # per-interval quantile, whose per-interval α is noise below some tokens per collection; the capacity alerts).
    guard_window: str | None = None
    guard: str = "drafts"  # what the guard counts: drafted tokens, or finished spec-decode requests ("requests")


@dataclass(frozen=True, slots=True)
class Group:
    """One rule group: what it is for (a comment at its head) and the group itself (name, interval, rules)."""

    purpose: str
    body: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.body["name"])


@dataclass(frozen=True, slots=True)
class RuleFile:
    """One rules file of one concern: its name under alerts/, what it holds (the file's head comment), its
    groups in the order they read each other."""

    name: str
    purpose: str
    groups: tuple[Group, ...]


def window_of(cfg: MonitoringConfig, which: str) -> str:
    """An alert's window: ``short`` (a value of _config) or ``long``."""
    return SHORT if which == "short" else cfg.long_window


def alert_window(cfg: MonitoringConfig, name: str, default: str) -> str:
    return window_of(cfg, cfg.alert(name).window or default)


def multiline(expr: str) -> str:
    """A multi-line expression ends with a newline, as a YAML ``|`` block and a jsonnet ``|||`` block do."""
    return expr if "\n" not in expr or expr.endswith("\n") else expr + "\n"


# ------------------------------------------------------------------------------------------- recording


def _records(cfg: MonitoringConfig, window: str) -> Iterator[Rule]:
    """Per model over ``window``: the page's counters' rates, α and mean acceptance length, from the stage."""
    level, op = cfg.alert_level, f"rate{window}"
    # The windows the tests read hold each step once (the short window is a value the mixin's _config may change).
    exact = window != SHORT
    rates = {spec.name: stage.rate(cfg, key, window, exact=exact) for key, spec in
             (("draft_tokens", m.DRAFT_TOKENS), ("accepted_tokens", m.ACCEPTED_TOKENS), ("drafts", m.DRAFTS))}
    for name, expr in rates.items():
        yield {"record": record_name(level, name, op), "expr": expr}
    yield {"record": record_name(level, ACCEPTANCE, op),
           "expr": guarded_ratio(rates[m.ACCEPTED_TOKENS.name], rates[m.DRAFT_TOKENS.name])}
    yield {"record": record_name(level, m.MEAN_ACCEPTANCE_LENGTH.name, op),
           "expr": "1 + " + guarded_ratio(rates[m.ACCEPTED_TOKENS.name], rates[m.DRAFTS.name])}


def staged_quantile(cfg: MonitoringConfig, q: float, histogram: str, window: str, *matchers: str) -> str:
    """histogram_quantile over the stage's records of one histogram (``interval``, ``tpot``, ``request``, …), with
    no sample (not NaN) when it saw nothing."""
    labels = by(stage.family(cfg, f"{histogram}_count").by)
    return (f"histogram_quantile({fmt_num(q)}, {stage.rate(cfg, f'{histogram}_bucket', window, *matchers)})\n"
            f"and on ({labels})\n({stage.rate(cfg, f'{histogram}_count', window, *matchers)} > 0)")


def _quantile_records(cfg: MonitoringConfig) -> Iterator[Rule]:
    for q in cfg.quantiles:
        yield {"record": record_name(cfg.alert_level, INTERVAL, f"{quantile_name(q)}_rate{cfg.long_window}"),
               "expr": staged_quantile(cfg, q, "interval", cfg.long_window)}


def baseline_record(cfg: MonitoringConfig) -> str:
    return record_name(cfg.alert_level, ACCEPTANCE, f"baseline{cfg.baseline_range}")


def drop_variance_record(cfg: MonitoringConfig) -> str:
    """The variance per drafted token of α over the drift ticket's window less its baseline."""
    return record_name(cfg.alert_level, "specdecode_acceptance_drop_variance_per_draft_token", f"rate{_drift_w(cfg)}")


def _drift_w(cfg: MonitoringConfig) -> str:
    return alert_window(cfg, "SpecDecodeAcceptanceRateDrift", "long")


def _baseline_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """α over the baseline range, and the variance of α's drop below it: the baseline is an estimate too, over
    range/w times the evidence (steady traffic), so its variance adds w/range of α's own."""
    level, labels = cfg.alert_level, by(cfg.level_labels())
    rng, off, long_w = cfg.baseline_range, p("baselineOffset"), cfg.long_window
    accepted = record_name(level, m.ACCEPTED_TOKENS.name, f"rate{long_w}")
    drafted = record_name(level, m.DRAFT_TOKENS.name, f"rate{long_w}")
    yield {"record": baseline_record(cfg),
           "expr": guarded_ratio(f"sum by ({labels}) (sum_over_time({accepted}[{rng}] offset {off}))",
                                 f"sum by ({labels}) (sum_over_time({drafted}[{rng}] offset {off}))")}
    w = _drift_w(cfg)
    inflation = f"(1 + {fmt_num(duration_seconds(w))} / {fmt_num(duration_seconds(rng))})"
    yield {"record": drop_variance_record(cfg), "expr": f"{inflation} * {assumed_variance_record(cfg, w)}"}


TPOT = m.TIME_PER_OUTPUT_TOKEN.name
OBSERVED = m.OBSERVED_SPEEDUP.name
LATENCY_STATISTICS = (("mean", None), ("p50", 0.5), ("p99", 0.99))


def latency_record(cfg: MonitoringConfig, metric: str, statistic: str, window: str) -> str:
    return record_name(cfg.alert_level, metric, f"{statistic}_rate{window}")


def _latency_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """Time per output token per model, apart for spec-decode and control pods (mean exact; p50 and p99 from the
    histograms), from the stage."""
    for window in dict.fromkeys([SHORT, cfg.long_window]):
        for statistic, q in LATENCY_STATISTICS:
            expr = (guarded_ratio(stage.rate(cfg, "tpot_sum", window), stage.rate(cfg, "tpot_count", window))
                    if q is None else staged_quantile(cfg, q, "tpot", window))
            yield {"record": latency_record(cfg, TPOT, statistic, window), "expr": expr}
    # The evidence of the latency tests: requests per side, and per bucket (the tail's two-proportion tests).
    long_w = cfg.long_window
    yield {"record": tpot_requests_record(cfg), "expr": stage.count(cfg, "tpot_count", long_w)}
    yield {"record": tpot_buckets_record(cfg), "expr": stage.count(cfg, "tpot_bucket", long_w)}
    # Per pod, for the tests against each pod's own baseline: recorded once a minute here, so that the alerts (every
    # 15 s) read one sample per pod instead of its hour of stage records.
    pod_window = cfg.sidecar_alert_window
    yield {"record": pod_tpot_requests_record(cfg), "expr": stage.count(cfg, "pod_tpot_count", pod_window)}


def _speedup_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """The fleet's observed speedup: the control pods' TPOT over the spec-decode pods', read from the latency
    group's records (so a group of its own: no group reads its own records); and the tail test's shares."""
    for window in dict.fromkeys([SHORT, cfg.long_window]):
        for statistic, _ in LATENCY_STATISTICS:
            yield {"record": latency_record(cfg, OBSERVED, statistic, window),
                   "expr": baseline_over_current(latency_record(cfg, TPOT, statistic, window))}
    yield {"record": tail_share_record(cfg), "expr": multiline(_tail_share(cfg))}


def tpot_requests_record(cfg: MonitoringConfig) -> str:
    return record_name(cfg.alert_level, m.REQUEST_TPOT.name + "_count", f"sampled_increase{cfg.long_window}")


def pod_tpot_requests_record(cfg: MonitoringConfig) -> str:
    return record_name(stage.family(cfg, "pod_tpot_count").level, m.REQUEST_TPOT.name + "_count",
                       f"sampled_increase{cfg.sidecar_alert_window}")


def tpot_buckets_record(cfg: MonitoringConfig) -> str:
    return record_name(cfg.alert_level, m.REQUEST_TPOT.name + "_bucket", f"sampled_increase{cfg.long_window}")


REQUEST_ACCEPTANCE = m.REQUEST_ACCEPTANCE.name
BAND_LABELS = stage.BAND_LABELS


def request_quantile_record(cfg: MonitoringConfig) -> str:
    q = quantile_name(cfg.thresholds.request_quantile)
    return record_name(cfg.alert_level, REQUEST_ACCEPTANCE, f"{q}_rate{cfg.long_window}")


def band_record(cfg: MonitoringConfig, metric: str) -> str:
    return record_name(f"{cfg.alert_level}_band", metric, f"rate{cfg.long_window}")


def request_share_record(cfg: MonitoringConfig) -> str:
    return record_name(cfg.alert_level, "specdecode_requests_below_request_threshold", f"ratio_rate{cfg.long_window}")


def requests_record(cfg: MonitoringConfig, level: str | None = None) -> str:
    """Requests the samples of the long window cover, per model (``level`` None) or per band: the evidence of the
    tests on per-request data."""
    level = level or cfg.alert_level
    return record_name(level, m.REQUESTS.name, f"sampled_increase{cfg.long_window}")


def band_drafted_record(cfg: MonitoringConfig) -> str:
    return record_name(f"{cfg.alert_level}_band", m.REQUEST_DRAFT_TOKENS.name, f"sampled_increase{cfg.long_window}")


def _per_request(cfg: MonitoringConfig, query: Callable[[str], str]) -> str:
    """``query`` over the per-request α histogram's stage records: the request tap's where it has data for a
    result's labels, else the engine's own (vLLM's proposed vllm:request_spec_decode_acceptance_rate)."""
    return f"{query('request')}\nor\n{query('engine_request')}"


def le(bound: str) -> str:
    """A bucket bound's matcher; ``bound`` is a template (a number placeholder)."""
    return f'le="{bound}"'


def _request_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """The request tap's distribution per model, and exact α per workload and temperature band; the requests each
    of them counts (their evidence)."""
    w = cfg.long_window
    q = cfg.thresholds.request_quantile

    def share(bound: str) -> Callable[[str], str]:
        return lambda h: guarded_ratio(call("sum without (le)", stage.rate(cfg, f"{h}_bucket", w, le(bound))),
                                       stage.rate(cfg, f"{h}_count", w))

    yield {"record": request_quantile_record(cfg),
           "expr": _per_request(cfg, lambda h: staged_quantile(cfg, q, h, w))}
    yield {"record": record_name(cfg.alert_level, "specdecode_requests_below_page_threshold", f"ratio_rate{w}"),
           "expr": _per_request(cfg, share(p("pageAcceptanceBucket")))}
    # Its own record even where the two thresholds share a bucket: which rules exist must not depend on a value
    # the mixin's _config may change.
    yield {"record": request_share_record(cfg), "expr": _per_request(cfg, share(p("requestAcceptanceBucket")))}
    yield {"record": requests_record(cfg), "expr": _per_request(cfg, lambda h: stage.count(cfg, f"{h}_count", w))}
    yield {"record": band_record(cfg, m.REQUESTS.name), "expr": stage.rate(cfg, "requests", w)}
    yield {"record": band_record(cfg, REQUEST_ACCEPTANCE),
           "expr": guarded_ratio(stage.rate(cfg, "request_accepted", w), stage.rate(cfg, "request_drafted", w))}
    yield {"record": requests_record(cfg, f"{cfg.alert_level}_band"), "expr": stage.count(cfg, "requests", w)}
    yield {"record": band_drafted_record(cfg), "expr": stage.count(cfg, "request_drafted", w)}
    yield from _tapped_sum_rules(cfg)


def capacity_record(cfg: MonitoringConfig, metric: str, op: str) -> str:
    return record_name(cfg.alert_level, metric, f"{op}{cfg.long_window}")


def spec_requests_per_hour_record(cfg: MonitoringConfig, window: str) -> str:
    """Finished spec-decode requests per hour over ``window``, per model: the capacity alerts' traffic guard."""
    return record_name(cfg.alert_level, "specdecode_spec_decode_requests_per_hour", f"rate{window}")


def _capacity_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """What spec decode costs against the control pods, per model and spec_decode: preemptions per finished
    request, generated tokens per second per engine, mean KV-cache usage; and the spec-decode pods' finished
    requests per hour (the capacity alerts need some)."""
    w = cfg.long_window
    yield {"record": capacity_record(cfg, "specdecode_preemptions_per_request", "ratio_rate"),
           "expr": guarded_ratio(stage.rate(cfg, "preemptions", w), stage.rate(cfg, "tpot_count", w))}
    yield {"record": capacity_record(cfg, "specdecode_generated_tokens_per_second", "avg_rate"),
           "expr": guarded_ratio(stage.rate(cfg, "generated", w), stage.rate(cfg, "engines", w))}
    yield {"record": capacity_record(cfg, m.KV_CACHE_USAGE.name, "avg_over_time"),
           "expr": stage.rate(cfg, "kv_cache", w)}
    for window in dict.fromkeys(alert.guard_window for alert in _alerts_of(cfg) if alert.guard == "requests"):
        assert window is not None
        requests = stage.rate(cfg, "tpot_count", window, 'spec_decode="true"')
        yield {"record": spec_requests_per_hour_record(cfg, window),
               "expr": f"{call(f'sum by ({by(cfg.level_labels())})', requests)} * 3600"}


def errors_record(cfg: MonitoringConfig) -> str:
    """Collections that failed over the health tickets' window, per target and reason."""
    w = alert_window(cfg, "SpecDecodeMetricsMissing", "short")
    return record_name(stage.family(cfg, "collect_errors").level, m.COLLECT_ERRORS.name, f"sampled_increase{w}")


def engine_record(cfg: MonitoringConfig, metric: str) -> str:
    """One engine's rate (or share) over speculation stopped's window."""
    w = alert_window(cfg, "SpecDecodeSpeculationStopped", "short")
    return record_name(stage.family(cfg, "series_generated").level, metric, f"rate{w}")


SPECULATIVE_SHARE = m.SPECULATIVE_TOKEN_SHARE.name


def class_requests_record(cfg: MonitoringConfig) -> str:
    """Requests per second per routed class (model, workload, temperature band[, prompt-length band])."""
    w = alert_window(cfg, "SpecDecodeClassRouted", "long")
    return record_name(f"{cfg.alert_level}_class", m.ROUTE_REQUESTS.name, f"rate{w}")


def _series_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """Per target, engine and routed class: what the health, speculation and routing tickets compare."""
    errors_w = alert_window(cfg, "SpecDecodeMetricsMissing", "short")
    # The short window is a value the mixin's _config may change: no millisecond off it (a collection more, at most).
    yield {"record": errors_record(cfg), "expr": multiline(stage.count(cfg, "collect_errors", errors_w, exact=False))}
    w = alert_window(cfg, "SpecDecodeSpeculationStopped", "short")
    generated = stage.rate(cfg, "series_generated", w)
    yield {"record": engine_record(cfg, m.GENERATED_TOKENS.name), "expr": generated}
    yield {"record": engine_record(cfg, m.DRAFT_TOKENS.name), "expr": stage.rate(cfg, "series_drafted", w)}
    yield {"record": engine_record(cfg, SPECULATIVE_SHARE),
           "expr": guarded_ratio(stage.rate(cfg, "series_emitted", w), generated)}
    labels = by((*cfg.level_labels(), *ROUTE_CLASS_LABELS))
    route_w = alert_window(cfg, "SpecDecodeClassRouted", "long")
    yield {"record": class_requests_record(cfg),
           "expr": call(f"sum by ({labels})", stage.rate(cfg, "route_requests", route_w))}


def evidence_record(cfg: MonitoringConfig, window: str) -> str:
    """Drafted tokens the samples of a window cover, per model: what a test on α over it has seen."""
    return record_name(cfg.alert_level, m.DRAFT_TOKENS.name, f"sampled_increase{window}")


def assumed_variance_record(cfg: MonitoringConfig, window: str) -> str:
    """The variance per drafted token the statistics section assumes, at the window's measured draft length."""
    return record_name(cfg.alert_level, VARIANCE, f"assumed_rate{window}")


def evidence_group(window: str) -> str:
    return f"specdecode.rules.evidence.{window}"


def tested_windows(cfg: MonitoringConfig) -> list[str]:
    """Every window a test on α reads: the page's, and the long one of the tickets."""
    return list(dict.fromkeys([*cfg.statistics.page_windows, cfg.long_window]))


def _assumed_variance(cfg: MonitoringConfig, window: str) -> str:
    """v = k̄·(¼ − s²) + m·s², k̄ = drafted tokens per draft over the window; an engine without a drafts counter gets
    k̄ = m (the bound for a request whose tokens all fall together): slower to prove, never noisier."""
    dispersion = cfg.statistics.dispersion
    drafted = stage.rate(cfg, "draft_tokens", window, exact=True)
    drafts = stage.rate(cfg, "drafts", window, exact=True)
    return (f"{fmt_num(dispersion.per_draft_token)} * (\n  ({drafted})\n  / ({drafts})\n"
            f"  or {drafted} * 0 + {fmt_num(dispersion.tokens_per_request)}\n) + {fmt_num(dispersion.per_request)}")


def _evidence_rules(cfg: MonitoringConfig, window: str) -> Iterator[Rule]:
    """Per model, for one tested window: the rates and α (where the level group does not record them already), the
    drafted tokens the samples cover (the evidence) and the variance per drafted token the config assumes."""
    if window not in (cfg.short_window, cfg.long_window):  # which records exist: the configured short window's
        yield from _records(cfg, window)
    yield {"record": evidence_record(cfg, window), "expr": stage.count(cfg, "draft_tokens", window)}
    yield {"record": assumed_variance_record(cfg, window), "expr": _assumed_variance(cfg, window)}


# The page's variance measured over the hour before the last ten minutes: a drop's own minutes, which mix two α
# and inflate it, stay out of it while the page's windows fill (bench/paging_variance.py: P95 120 s at sd 0.1 where
# the hour up to now gave 125 s and six hours 165 s).
VARIANCE_WINDOW, VARIANCE_OFFSET = "1h", "10m"


def variance_record(cfg: MonitoringConfig, what: str, window: str | None = None) -> str:
    """``bound``: the page's (over VARIANCE_WINDOW before VARIANCE_OFFSET); ``estimate``: the long window's, or
    ``window``'s."""
    window = window or (VARIANCE_WINDOW if what == "bound" else cfg.long_window)
    return record_name(cfg.alert_level, VARIANCE, f"{what}{window}")


def tapped_alpha_record(cfg: MonitoringConfig, window: str) -> str:
    """α of the tap's requests over ``window`` (Σ A / Σ D), per model: the variance's floor reads it."""
    return record_name(cfg.alert_level, REQUEST_ACCEPTANCE, f"tapped{window}")


def bound_divisor_record(cfg: MonitoringConfig, window: str) -> str:
    """c of the variance's upper bound for the tap's requests over ``window``, where min_requests back it."""
    return record_name(cfg.alert_level, "specdecode_acceptance_variance_bound_divisor", f"tapped{window}")


def tapped_requests_record(cfg: MonitoringConfig) -> str:
    return tapped_sum_record(cfg, "requests", cfg.long_window)


# The tap's per-request sums the page's variance is built from: N, ΣD, ΣA, ΣD², ΣA², ΣAD (variance.WindowSums).
TAPPED_SUMS = ("requests", "request_drafted", "request_accepted", "request_draft_squared", "request_accepted_squared",
               "request_product")


def tapped_sum_record(cfg: MonitoringConfig, key: str, window: str) -> str:
    """The tap's per-request sum of ``key`` over ``window``, per model (one of the variance's inputs)."""
    return record_name(cfg.alert_level, stage.family(cfg, key).name, f"tapped{window}")


def _variance_windows(cfg: MonitoringConfig) -> list[str]:
    return list(dict.fromkeys([VARIANCE_WINDOW, cfg.long_window]))


def _tapped_sum_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """Each of the variance's sums over each of its windows, once per evaluation: the variance's expressions use
    each sum up to 13 times, and read over the hour each time they cost a fifth of the rules' evaluation at 100 pods."""
    model = cfg.level_labels()
    for window in _variance_windows(cfg):
        for key in TAPPED_SUMS:
            yield {"record": tapped_sum_record(cfg, key, window),
                   "expr": stage.count(cfg, key, window, by_labels=model)}


def _window_sums(cfg: MonitoringConfig, window: str) -> variance.WindowSums:
    """The tap's per-request sums over a window, per model, as recorded by the requests group."""
    return variance.WindowSums(*(tapped_sum_record(cfg, key, window) for key in TAPPED_SUMS))


def _variance_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """The variance per drafted token measured on the tap's requests over each of its windows, and α of those
    requests over the page's (the bound's floor)."""
    for window in _variance_windows(cfg):
        yield {"record": variance_record(cfg, "estimate", window),
               "expr": multiline(variance.estimate(_window_sums(cfg, window)))}
    sums = _window_sums(cfg, VARIANCE_WINDOW)
    yield {"record": tapped_alpha_record(cfg, VARIANCE_WINDOW), "expr": multiline(variance.alpha(sums))}
    yield {"record": bound_divisor_record(cfg, VARIANCE_WINDOW),
           "expr": multiline(variance.backed_divisor(sums.requests, cfg.statistics.min_requests))}


def _variance_bound_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """The page's measured variance: the upper bound of the estimate as recorded VARIANCE_OFFSET ago, never below
    α(1 − α), where min_requests requests back it."""
    ago = f" offset {VARIANCE_OFFSET}"
    estimated = variance_record(cfg, "estimate", VARIANCE_WINDOW) + ago
    divisor = bound_divisor_record(cfg, VARIANCE_WINDOW) + ago
    yield {"record": variance_record(cfg, "bound"),
           "expr": multiline(variance.bound_of(estimated, divisor, tapped_alpha_record(cfg, VARIANCE_WINDOW) + ago))}


def window_interval(cfg: MonitoringConfig) -> dict[str, str]:
    """The `interval` of the groups that run every windows.evaluation_interval (a value of _config; none, the
    ruler's default, where it is empty)."""
    return {"interval": p("windowEvaluationInterval")}


def _laid_out(rules: Iterable[Rule]) -> list[Rule]:
    return [{**rule, "expr": multiline(rule["expr"])} for rule in rules]


def _window_group(cfg: MonitoringConfig, name: str, purpose: str, rules: Iterable[Rule]) -> Group:
    return Group(purpose, {"name": f"specdecode.rules.{name}", **window_interval(cfg), "rules": _laid_out(rules)})


def _budgeted_group(cfg: MonitoringConfig, name: str, purpose: str, rules: Iterable[Rule]) -> Group:
    """A group evaluated as often as the budgets assume (the page's timing must not depend on the ruler's)."""
    return Group(purpose, {"name": name, "interval": cfg.statistics.evaluation_interval, "rules": _laid_out(rules)})


STAGE_PURPOSE = {
    "page": "The page's evidence, staged every {step}: drafted and accepted tokens and drafts per model, each as "
            "its increase since the last evaluation. The only reads of raw counters the page needs.",
    "acceptance": "Staged every {step}, per model: routed requests, scheduled steps, acceptance per draft position "
                  "and the per-interval α histogram.",
    "latency": "Staged every {step}, per model and side (spec_decode true, or false for control pods): the TPOT "
               "histogram, preemptions, generated tokens, generating engines, KV-cache usage; per pod the finished "
               "spec-decode requests.",
    "requests": "Staged every {step}: the per-request α histograms (the tap's, the engine's), the tap's per-band "
                "counters, the per-request sums of the page's variance, requests without spec decode and the request "
                "speed per α band.",
    "series": "Staged every {step}, per engine series: emitted, generated and drafted tokens (speculation stopped) "
              "and the collection errors per target (the health tickets).",
}


def _stage_groups(cfg: MonitoringConfig) -> list[Group]:
    return [Group(STAGE_PURPOSE[g["name"].rsplit(".", 1)[1]].format(step=g["interval"]),
                  {**g, "rules": _laid_out(g["rules"])}) for g in stage.stage_templates(cfg)]


def _window_groups(cfg: MonitoringConfig) -> list[Group]:
    long_w = cfg.long_window
    windows = list(dict.fromkeys([SHORT, long_w]))
    out = [_window_group(cfg, cfg.alert_level, f"Per model over the short window and {long_w}: the counters' rates, "
                         f"α and mean acceptance length; over {long_w} the per-interval α quantiles. What the "
                         "dashboard and the tickets read.",
                         [*(r for w in windows for r in _records(cfg, w)), *_quantile_records(cfg)]),
           _window_group(cfg, "series", "Per target, engine and routed class: failed collections by reason (the "
                         "health tickets), each engine's generated and drafted tokens and speculative token share "
                         "(speculation stopped), requests per routed class (routing). A layer between the stage and "
                         "those tickets: they see a collection up to one evaluation (a minute) later, against for: "
                         "of 5 minutes and more.", _series_rules(cfg))]
    # A group per tested window: one group for all would exceed Mimir's default of 20 rules per group.
    for window in tested_windows(cfg):
        whose = "the page's and the tickets'" if window in cfg.statistics.page_windows and window == long_w else \
            "the page's" if window in cfg.statistics.page_windows else "the tickets'"
        out.append(_budgeted_group(
            cfg, evidence_group(window),
            f"The {window} window, {whose}, evaluated every {cfg.statistics.evaluation_interval} as the false-alarm "
            "budgets assume: the drafted tokens its samples cover and the variance per drafted token the statistics "
            "section assumes at its draft length (and its rates and α, where the group above has none).",
            _evidence_rules(cfg, window)))
    return out


def _derived_groups(cfg: MonitoringConfig) -> list[Group]:
    long_w, rng = cfg.long_window, cfg.baseline_range
    return [
        _window_group(cfg, "baseline", f"α over {rng} ending baselineOffset ago (the drift ticket's reference), and "
                      "the variance of α's drop below it.", _baseline_rules(cfg)),
        _window_group(cfg, "latency", "Time per output token per model and side (mean, P50, P99), and the requests "
                      "and bucket counts the latency tests rest on.", _latency_rules(cfg)),
        _window_group(cfg, "speedup", "The observed speedup per model: the control pods' TPOT over the spec-decode "
                      "pods'; per side and bucket bound, the share of requests slower than the bound (the tail "
                      "test's).", _speedup_rules(cfg)),
        _window_group(cfg, "requests", f"Per-request α over {long_w} (the tap's, else the engine's histogram), α per "
                      "workload and temperature band, the requests behind them, and the tap's per-request sums.",
                      _request_rules(cfg)),
        _window_group(cfg, "capacity", f"What spec decode costs against the control pods over {long_w}: "
                      "preemptions per request, tokens per second per engine, KV-cache usage; finished spec-decode "
                      "requests per hour.", _capacity_rules(cfg)),
    ]


def _page_groups(cfg: MonitoringConfig) -> list[Group]:
    stats = cfg.statistics
    return [
        _window_group(cfg, "variance", f"The variance per drafted token measured on the tap's requests over "
                      f"{', '.join(_variance_windows(cfg))}; over {VARIANCE_WINDOW}, α of those requests and the "
                      "divisor of the estimate's upper bound.",
                      _variance_rules(cfg)),
        _window_group(cfg, "variance.bound", f"The page's measured variance: the upper bound of the {VARIANCE_WINDOW} "
                      f"estimate as recorded {VARIANCE_OFFSET} ago (a drop's own minutes stay out of it), never below "
                      f"α(1 − α), where {fmt_num(stats.min_requests)} requests back it. One layer after the estimate: "
                      f"up to a minute later, on data {VARIANCE_OFFSET} old anyway.", _variance_bound_rules(cfg)),
        _budgeted_group(cfg, PAGE_EVIDENCE_GROUP, PAGE_EVIDENCE_PURPOSE.format(every=stats.evaluation_interval),
                        page_evidence_rules(cfg)),
    ]


# ---------------------------------------------------------------------------------------------- the page


def alpha_record(cfg: MonitoringConfig, window: str) -> str:
    return record_name(cfg.alert_level, ACCEPTANCE, f"rate{window}")


def page_z_record(cfg: MonitoringConfig, window: str) -> str:
    """The page's test statistic over ``window``: z = (null − α)·√(D / v)."""
    return record_name(cfg.alert_level, "specdecode_page_z_score", f"rate{window}")


def proven_below_record(cfg: MonitoringConfig, window: str) -> str:
    """α over ``window`` where the window proves it below the page's null (its value: α)."""
    return record_name(cfg.alert_level, ACCEPTANCE, f"proven_below_page_rate{window}")


def at_or_above_record(cfg: MonitoringConfig, window: str) -> str:
    """α over ``window`` where the window holds the evidence and shows α at or above the page threshold."""
    return record_name(cfg.alert_level, ACCEPTANCE, f"at_or_above_page_rate{window}")


def shortest_window_record(cfg: MonitoringConfig) -> str:
    """α over the shortest page window that holds half the page's minimum evidence."""
    return record_name(cfg.alert_level, ACCEPTANCE, "shortest_page_window")


def page_tests(cfg: MonitoringConfig) -> list[tuple[str, float]]:
    """(window, z*) of each of the page's tests: the false-page budget split between its windows by their shares
    (a union bound: the expected false pages of all windows together stay within the budget)."""
    stats = cfg.statistics
    every = duration_seconds(stats.evaluation_interval)
    return [(w, critical_z(budget, duration_seconds(w), every))
            for w, budget in zip(stats.page_windows, stats.page_budgets(), strict=True)]


def page_z(cfg: MonitoringConfig, window: str) -> str:
    """The page's z over ``window``: α's distance below the null, in standard errors of α over the drafted tokens
    the window covers; the variance the measured bound where the tap's requests give one, else the assumed."""
    variance = f"{variance_record(cfg, 'bound')} or {assumed_variance_record(cfg, window)}"
    return (f"({p('pageNullRatio')} - {alpha_record(cfg, window)})\n"
            f"* sqrt(\n  {evidence_record(cfg, window)}\n  / ({variance})\n)")


def _on(cfg: MonitoringConfig) -> str:
    return f"on ({by(cfg.level_labels())})"


def page_evidence_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """Each page window's evidence, and what keeps a firing page firing; all read the window groups (and the
    variance's bound), none another record of this group."""
    on, least = _on(cfg), fmt_num(cfg.statistics.min_draft_tokens)
    for window, z in page_tests(cfg):
        alpha, drafted = alpha_record(cfg, window), evidence_record(cfg, window)
        yield {"record": page_z_record(cfg, window), "expr": multiline(page_z(cfg, window))}
        yield {"record": proven_below_record(cfg, window), "expr": multiline(
            f"{alpha} < {p('pageAcceptanceRatio')}\nand {on}\n{drafted} >= {least}\nand {on}\n"
            f"{page_z(cfg, window)}\n> {z:.2f}")}
        yield {"record": at_or_above_record(cfg, window), "expr": multiline(
            f"{alpha} >= {p('pageAcceptanceRatio')}\nand {on}\n{drafted} >= {least}")}
    yield {"record": shortest_window_record(cfg), "expr": multiline(page_holds_source(cfg))}


def page_holds_source(cfg: MonitoringConfig) -> str:
    """α over the shortest page window that holds half of min_requests' worth of drafted tokens."""
    on, half = _on(cfg), fmt_num(cfg.statistics.min_draft_tokens / 2)
    return "\nor ".join(f"({alpha_record(cfg, w)} and {on} {evidence_record(cfg, w)} >= {half})"
                        for w in cfg.statistics.page_windows)


PAGE = "SpecDecodeAcceptanceRateLow"
PAGE_EVIDENCE_GROUP = "specdecode.rules.page"
PAGE_EVIDENCE_PURPOSE = (
    "The page's evidence, per window (every {every}): its z-score against the page's null (the threshold plus "
    "statistics.page_margin), α where that z proves α below the null (α below the threshold, enough drafted "
    "tokens, z above the window's bar), α where the window has the evidence and shows α at or above the threshold; "
    "and α over the shortest window with half the evidence, which keeps a firing page firing. One layer after the "
    "window groups: a ruler that runs its groups at independent phases (Prometheus does) sees them up to one "
    "evaluation later than the windows.")


def page_proof(cfg: MonitoringConfig) -> str:
    """What starts the page: the shortest page window that decides (it proves α below the null, or shows α at or
    above the threshold) proves it low. A shorter window that shows α back vetoes the longer ones: they still hold
    minutes the shorter ones have seen end (a recovery), or not yet begin."""
    windows = "\n  or ".join(f"{proven_below_record(cfg, w)} or {at_or_above_record(cfg, w)}"
                             for w in cfg.statistics.page_windows)
    return f"(\n  {windows}\n) < {p('pageAcceptanceRatio')}"


def page_holds(cfg: MonitoringConfig) -> str:
    """What keeps a firing page firing (hysteresis): α over the shortest window that holds half of min_requests'
    worth of drafted tokens is still below the threshold. Without it, a test near its bar (or a window whose evidence
    hovers at min_requests) would resolve and fire again, a page each time; with it the page resolves once the
    requests of a short window show α back, or traffic stops."""
    return f"{shortest_window_record(cfg)} < {p('pageAcceptanceRatio')}"


def page_expr(proof: str, holds: str, level_labels: tuple[str, ...]) -> str:
    """The page: proof, or (while it fires: ALERTS, as the ruler wrote it at the last evaluation) holds."""
    return (f"{proof}\nor\n(\n  {holds}\n  and on ({by(level_labels)})\n"
            f'  ALERTS{{alertname="{PAGE}", alertstate="firing"}}\n)\n')


def acceptance_low(cfg: MonitoringConfig) -> Alert:
    stats = cfg.statistics
    windows = ", ".join(stats.page_windows)
    thr = f"{p('pageAcceptancePercent')}%%"
    return Alert(
        PAGE, page_expr(page_proof(cfg), page_holds(cfg), cfg.level_labels()),
        f"Speculative decoding acceptance rate for {{{{ $labels.model_name }}}} is below {thr}",
        f"{WHERE} accepted only {PCT} of its drafted tokens (all pods together; page threshold {thr}) over "
        f"the shortest of its windows ({windows}) that holds enough requests to prove α below "
        f"{p('pageNullPercent')}%% (at most {fmt_num(stats.false_pages_per_30d)} false page per 30 days). At "
        "this rate speculative decoding most likely makes generation slower than plain decoding.")


# ------------------------------------------------------------------------------------- the tickets' evidence


def query_value(promql: str, fmt: str, *args: str, default: str = "unknown") -> str:
    """An annotation snippet that runs ``printf promql args`` and prints the first result's value through fmt
    (templates: a literal % doubled)."""
    return (f'{{{{ with printf "{promql}" {" ".join(args)} | query }}}}'
            f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}{default}{{{{ end }}}}")


def _model_query(cfg: MonitoringConfig) -> tuple[str, list[str]]:
    """Matchers and template arguments that select the alert's own model in an annotation query."""
    labels = cfg.level_labels()
    return ", ".join(f"{label}={Q}" for label in labels), [f"$labels.{label}" for label in labels]


def _target_query(cfg: MonitoringConfig) -> tuple[str, str]:
    return (", ".join(f"{label}={Q}" for label in cfg.target_labels),
            " ".join(f"$labels.{label}" for label in cfg.target_labels))


def ticket_z(cfg: MonitoringConfig, window: str) -> float:
    """The bar of a ticket's test over one window: the whole false-ticket budget for it."""
    stats = cfg.statistics
    every = duration_seconds(stats.evaluation_interval)
    return critical_z(stats.false_tickets_per_30d, duration_seconds(window), every)


def z_record(cfg: MonitoringConfig, test: str, window: str, level: str | None = None) -> str:
    """A ticket's test statistic over ``window`` (``test``: what it tests), per model or ``level``."""
    return record_name(level or cfg.alert_level, f"specdecode_{test}_z_score", f"rate{window}")


def _in_force(cfg: MonitoringConfig) -> str:
    return f"(\n{indent(break_even_in_force(Scope(METRIC_SELECTOR, cfg.level_labels())))}\n)"


def _drift_null(cfg: MonitoringConfig) -> str:
    return f"({baseline_record(cfg)} - {p('driftDrop')})"


def _below_break_even_z(cfg: MonitoringConfig) -> str:
    w = alert_window(cfg, "SpecDecodeBelowBreakEven", "long")
    return z_score(alpha_record(cfg, w), _in_force(cfg), evidence_record(cfg, w), assumed_variance_record(cfg, w))


def _drift_z(cfg: MonitoringConfig) -> str:
    w = _drift_w(cfg)
    return z_score(alpha_record(cfg, w), _drift_null(cfg), evidence_record(cfg, w), drop_variance_record(cfg))


def _request_z(cfg: MonitoringConfig) -> str:
    """The q-quantile of per-request α below the threshold ⟺ more than q of the requests at or below its bucket:
    requests are independent units, so the proof is a binomial test of that share against q."""
    q = cfg.thresholds.request_quantile
    return f"({request_share_record(cfg)} - {fmt_num(q)}) * sqrt({requests_record(cfg)} / {fmt_num(q * (1 - q))})"


def _band_z(cfg: MonitoringConfig) -> str:
    """α of a (workload, temperature band) from the tap's exact counters against the page threshold: the tap counts
    the band's requests, so the variance is k̄(¼ − s²)/D + s²/N with D drafted tokens in N requests (k̄, tokens per
    draft, the model's)."""
    w, level, dispersion = cfg.long_window, cfg.alert_level, cfg.statistics.dispersion
    alpha, requests, drafted = band_record(cfg, REQUEST_ACCEPTANCE), requests_record(cfg, f"{level}_band"), \
        band_drafted_record(cfg)
    model_drafted = record_name(level, m.DRAFT_TOKENS.name, f"rate{w}")
    model_drafts = record_name(level, m.DRAFTS.name, f"rate{w}")
    # Without the model's drafts counter, k̄ ≤ D/N (a request's tokens all falling together): (¼ − s²)/N.
    within = (f"({fmt_num(dispersion.per_draft_token)} * ({model_drafted} / {model_drafts})\n"
              f"/ on ({by(cfg.level_labels())}) group_right\n{drafted}\n"
              f"or\n{fmt_num(dispersion.per_draft_token)} / {requests})")
    variance = f"{within}\n+ {fmt_num(cfg.statistics.request_acceptance_sd ** 2)} / {requests}"
    return f"({p('pageAcceptanceRatio')} - {alpha})\n/ sqrt(\n{variance}\n)"


# A TPOT distribution's spread from its quantiles: (P99 − P50) / 2.326, the sd of a normal with those quantiles;
# for TPOT's right-skewed distributions it overstates the sd, so the tests below err toward "not proven".
def tpot_sd(p99: str, p50: str) -> str:
    return f"(\n  {p99}\n  - {p50}\n) / 2.326"


# vLLM's TPOT histogram has 19 bounds and +Inf: the tail test runs at each, so its budget is split 20 ways.
TPOT_BUCKETS = 20
TAIL_Q = 0.99  # the tail test's quantile: requests beyond the control pods' P99


def _slower_z_fleet(cfg: MonitoringConfig) -> str:
    """Welch's two-sample test on mean TPOT: spec-decode pods' mean × h above the control pods' (speedup below h),
    each side's variance of the mean its spread² / its requests."""
    w = alert_window(cfg, "SpecDecodeObservedSpeedupLow", "long")

    def side(label: str, stat: str) -> str:
        return f'{latency_record(cfg, TPOT, stat, w)}{{spec_decode="{label}"}}'

    def spread(label: str) -> str:
        return f"(\n{indent(tpot_sd(side(label, 'p99'), side(label, 'p50')))}\n) ^ 2"

    n, h = tpot_requests_record(cfg), p("hurtingBelow")
    variance = (f"{h} ^ 2 * {spread('true')}\n/ {n}{{spec_decode=\"true\"}}\n"
                f"+ ignoring (spec_decode)\n{spread('false')}\n/ {n}{{spec_decode=\"false\"}}")
    return (f"(\n  {h} * {side('true', 'mean')}\n  - ignoring (spec_decode)\n  {side('false', 'mean')}\n)\n"
            f"/ ignoring (spec_decode)\nsqrt(\n{indent(variance)}\n)")


def _per_pod(cfg: MonitoringConfig, statistic: str, metric: str = OBSERVED, labels: tuple[str, ...] = ()) -> str:
    """A sidecar's own windowed gauge (the sidecar's alert window), the largest per pod (or per ``labels``: the
    best pod's)."""
    w = cfg.sidecar_alert_window
    matchers = ", ".join((METRIC_SELECTOR, f'statistic="{statistic}"', f'window="{w}"'))
    return call(f"max by ({by(labels or cfg.level_labels('instance'))})", selector(metric, matchers))


def _slower_z_pods(cfg: MonitoringConfig) -> str:
    """Per pod against its measured baseline (a figure, not a sample): a one-sample test of the pod's mean TPOT
    over the sidecar's window, z = (1 − S/h) · mean · √n / spread."""
    spread = tpot_sd(_per_pod(cfg, "p99", TPOT), _per_pod(cfg, "p50", TPOT))
    return (f"(1 - {_per_pod(cfg, 'mean')}\n  / {p('hurtingBelow')})\n* {_per_pod(cfg, 'mean', TPOT)}\n"
            f"/ ({spread} > 0)\n* sqrt({pod_tpot_requests_record(cfg)})")


def tail_share_record(cfg: MonitoringConfig) -> str:
    """Per model, side and bucket bound: the share of the side's requests slower than the bound, over the long
    window."""
    return record_name(cfg.alert_level, m.REQUEST_TPOT.name + "_slower_share", f"sampled_increase{cfg.long_window}")


def _tail_share(cfg: MonitoringConfig) -> str:
    buckets = tpot_buckets_record(cfg)
    return f'1 - {buckets}\n/ ignoring (le) group_left\n{buckets}{{le="+Inf"}}'


def _tail_z_fleet(cfg: MonitoringConfig) -> str:
    """At each bucket bound in the control pods' top 1 − q, a two-proportion test: more spec-decode requests slower
    than it than control requests; per model the largest z over those bounds."""
    share, buckets, label = tail_share_record(cfg), tpot_buckets_record(cfg), "spec_decode"

    def side(name: str, value: str, *more: str) -> str:
        return f'{name}{{{", ".join((f"{label}={chr(34)}{value}{chr(34)}", *more))}}}'

    def spread(value: str) -> str:
        return (f"{side(share, value)}\n* (1 - {side(share, value)})\n/ ignoring (le) group_left\n"
                f"{side(buckets, value, 'le=' + chr(34) + '+Inf' + chr(34))}")

    tests = (f"(\n  {side(share, 'true')}\n  - ignoring ({label})\n  {side(share, 'false')}\n)\n"
             f"/ ignoring ({label})\nsqrt(\n{indent(spread('true'))}\n  + ignoring ({label})\n"
             f"{indent(spread('false'))}\n)\nand ignoring ({label})\n{side(share, 'false')} <= {fmt_num(1 - TAIL_Q)}")
    return f"max by ({by(cfg.level_labels())}) (\n{indent(tests)}\n)"


def tail_z(cfg: MonitoringConfig) -> float:
    """The tail test's bar: the ticket's budget split over the TPOT histogram's bounds."""
    stats = cfg.statistics
    w = alert_window(cfg, "SpecDecodeTailRegression", "long")
    return critical_z(stats.false_tickets_per_30d / TPOT_BUCKETS, duration_seconds(w),
                      duration_seconds(stats.evaluation_interval))


def _ticket_evidence(cfg: MonitoringConfig) -> Iterator[Rule]:
    """Each ticket's test statistic, by name (the tickets compare them with their bars)."""
    long_w, pod_w = cfg.long_window, cfg.sidecar_alert_window
    tests = (
        (z_record(cfg, "below_break_even", alert_window(cfg, "SpecDecodeBelowBreakEven", "long")),
         _below_break_even_z(cfg)),
        (z_record(cfg, "acceptance_drop", _drift_w(cfg)), _drift_z(cfg)),
        (z_record(cfg, "requests_below_threshold", long_w), _request_z(cfg)),
        (z_record(cfg, "band_below_page", long_w, f"{cfg.alert_level}_band"), _band_z(cfg)),
        (z_record(cfg, "tpot_slower", alert_window(cfg, "SpecDecodeObservedSpeedupLow", "long")),
         _slower_z_fleet(cfg)),
        (z_record(cfg, "tpot_slower", pod_w, "instance"), _slower_z_pods(cfg)),
        (z_record(cfg, "tpot_tail_slower", alert_window(cfg, "SpecDecodeTailRegression", "long")), _tail_z_fleet(cfg)),
    )
    for record, expr in tests:
        yield {"record": record, "expr": multiline(expr)}


# ---------------------------------------------------------------------------------------------- the tickets


def alpha_proven_below(cfg: MonitoringConfig, window: str, below: str, z_name: str, z: float) -> str:
    """α over the window is below ``below``, the window holds at least min_requests requests' worth of drafted
    tokens, and its test statistic (record ``z_name``) is past the bar ``z``."""
    on = f"\nand {_on(cfg)}\n"
    return (f"{alpha_record(cfg, window)} < {below}{on}{evidence_record(cfg, window)} >= "
            f"{fmt_num(cfg.statistics.min_draft_tokens)}{on}{z_name} > {z:.2f}")


def below_break_even(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeBelowBreakEven"
    w = alert_window(cfg, name, "long")
    model_match, model_args = _model_query(cfg)
    bases = ("calibrated", "configured")  # the one in force first; single quotes: this goes inside printf "…"
    now = " or ".join(f"max({m.BREAK_EVEN.name}{{cost_basis='{basis}', {model_match}}})" for basis in bases)
    break_even_now = query_value(now, "humanizePercentage", *model_args * len(bases))
    return Alert(
        name, alpha_proven_below(cfg, w, _in_force(cfg), z_record(cfg, "below_break_even", w), ticket_z(cfg, w)),
        "Speculative decoding for {{ $labels.model_name }} is below break-even (modelled speedup < 1)",
        f"Over the last {w}, {WHERE} accepted {PCT} of its drafted tokens, below the break-even "
        f"acceptance rate of {break_even_now} from the sidecar's cost model (calibrated to the observed speedup "
        "where a baseline gives one), and its requests prove it below: speculative decoding is modelled "
        "to cost more time than it saves.")


def acceptance_drift(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeAcceptanceRateDrift"
    w, rng = _drift_w(cfg), cfg.baseline_range
    model_match, model_args = _model_query(cfg)
    base = baseline_record(cfg)
    return Alert(
        name, alpha_proven_below(cfg, w, _drift_null(cfg), z_record(cfg, "acceptance_drop", w), ticket_z(cfg, w)),
        f"Speculative decoding acceptance rate for {{{{ $labels.model_name }}}} dropped more than "
        f"{p('driftDropPoints')} points below its {rng} baseline",
        f"Over the last {w}, {WHERE} accepted {PCT} of its drafted tokens; its baseline over the "
        f"previous {rng} was {query_value(f'{base}{{{model_match}}}', 'humanizePercentage', *model_args)}, and its "
        "requests prove the drop. A drop like this usually means drift in the traffic, a stale draft model, or a "
        "quantization or version change.")


def interval_acceptance_low(cfg: MonitoringConfig) -> Alert:
    q, long_w = cfg.thresholds.interval_quantile, cfg.long_window
    qname, thr = quantile_name(q), f"{p('intervalAcceptancePercent')}%%"
    return Alert(
        "SpecDecodeIntervalAcceptanceLow",
        f"{record_name(cfg.alert_level, INTERVAL, f'{qname}_rate{long_w}')} < {p('intervalAcceptanceRatio')}",
        f"{qname.upper()} of per-interval acceptance rate for {{{{ $labels.model_name }}}} is below {thr}",
        f"Over the last {long_w}, {escape(f'{q:.0%}')} of the collection intervals of {WHERE} had an acceptance rate "
        f"below {PCT} (threshold {thr}): for a sizeable share of the time speculative decoding was "
        "net-negative, even if the average looks fine.", guard_window=long_w)


# Collection errors that are not an outage: the target answers, but without what the sidecar needs. Each has its
# own alert, and SpecDecodeTargetDown leaves them to it.
NO_SPEC, NO_LATENCY = FailureReason.NO_SPEC_METRICS.value, FailureReason.NO_LATENCY_METRICS.value


def _errors_increasing(cfg: MonitoringConfig, *reasons: str) -> str:
    reason = f'reason="{reasons[0]}"' if len(reasons) == 1 else f'reason=~"{"|".join(reasons)}"'
    return f"{errors_record(cfg)}{{{reason}}} > 0"


def target_down(cfg: MonitoringConfig) -> Alert:
    window = alert_window(cfg, "SpecDecodeMetricsMissing", "short")
    target_match, target_args = _target_query(cfg)
    reason_q = f"topk(1, increase({m.COLLECT_ERRORS.exposed_name}{{{target_match}}}[{window}]) > 0)"
    reason = f'{{{{ range printf "{reason_q}" {target_args} | query }}}}{{{{ .Labels.reason }}}}' \
             "{{ else }}unknown{{ end }}"
    return Alert(
        "SpecDecodeTargetDown", f"{selector(m.UP.name, METRIC_SELECTOR)} == 0\nunless on ({by(cfg.target_labels)})\n"
                                f"{_errors_increasing(cfg, NO_SPEC, NO_LATENCY)}",
        "specdecode sidecar cannot collect metrics from {{ $labels.target }}",
        "The sidecar {{ $labels.instance }} (job {{ $labels.job }}) has failed to collect from target "
        f"{{{{ $labels.target }}}} for %(for)s; most frequent error reason: {reason}. "
        "No acceptance-rate alert can fire for this target meanwhile.")


def metrics_missing(cfg: MonitoringConfig) -> Alert:
    window = alert_window(cfg, "SpecDecodeMetricsMissing", "short")
    return Alert(
        "SpecDecodeMetricsMissing", _errors_increasing(cfg, NO_SPEC),
        "vLLM at {{ $labels.target }} serves no speculative-decoding metrics",
        f"{{{{ $value | humanize }}}} collections by {{{{ $labels.instance }}}} in the last {window} found "
        "target {{ $labels.target }} answering without any speculative-decoding metrics: spec decode was "
        "switched off, or a vLLM upgrade renamed the metrics.")


def exporter_down(cfg: MonitoringConfig) -> Alert:
    return Alert(
        "SpecDecodeExporterDown", f"up{{{p('exporterJobSelector')}}} == 0",
        "Prometheus cannot scrape the specdecode sidecar {{ $labels.instance }}",
        "Prometheus has failed to scrape the specdecode sidecar {{ $labels.instance }} (job "
        "{{ $labels.job }}) for %(for)s. The acceptance-rate alerts are blind for the models it watches.")


def exporter_absent(cfg: MonitoringConfig) -> Alert:
    return Alert(
        "SpecDecodeExporterAbsent", f"absent(up{{{p('exporterJobSelector')}}} == 1)", "No specdecode sidecar is up",
        "For %(for)s Prometheus has had no successfully scraped target matching "
        f"up{{{p('exporterJobSelectorQuoted')}}}. Every speculative-decoding alert is blind. Check that the "
        "sidecars run and that the scrape job (or ServiceMonitor/PodMonitor) still selects them.")


def recommended_k_lower(cfg: MonitoringConfig) -> Alert:
    """The configured k travels on the alert as its ``num_speculative_tokens`` label (from specdecode_info, one per
    series: topk), not as an annotation's query: a ruler expands annotations for every pending alert at every
    evaluation, and this one is pending for 6h on every pod whose k is too long (at 400 such pods the query cost
    150 ms of the group's 244 ms a minute)."""
    sw = cfg.sidecar_alert_window
    window = ", ".join((METRIC_SELECTOR, f'window="{sw}"'))
    recommended = selector(m.RECOMMENDED_K.name, window)
    info = selector(m.INFO.name, ", ".join((METRIC_SELECTOR, 'num_speculative_tokens!=""')))
    return Alert(
        "SpecDecodeRecommendedKLower",
        f"(\n{recommended}\nunless ignoring (window, num_speculative_tokens)\n"
        f'(count_values without (window) ("num_speculative_tokens", {recommended})\n'
        f" and ignoring (api, method) {info})\n)\n"
        "* ignoring (window, api, method, num_speculative_tokens) group_left (num_speculative_tokens)\n"
        f"topk without (api, method, num_speculative_tokens) (1, {info})\n"
        f"and ignoring (num_speculative_tokens) {selector(m.DRAFT_TOKENS_PER_SECOND.name, window)}"
        f" >= {p('minDraftTokensPerSecond')}",
        "Fewer speculative tokens would be faster for {{ $labels.model_name }} on {{ $labels.target }}",
        "For %(for)s the sidecar's cost model has recommended num_speculative_tokens = "
        "{{ $value }} for {{ $labels.model_name }} on {{ $labels.target }}, lower than the "
        f"configured {{{{ $labels.num_speculative_tokens }}}} (window {sw}): later draft positions are rarely "
        "accepted.")


def _fleet_else_pods(cfg: MonitoringConfig, fleet: str, fleet_record: str, pods: str) -> str:
    """The fleet's condition (control pods against spec-decode pods) where there are control pods, else the
    pods' own comparisons. Parenthesised whole: `or` binds looser than the guard's `and`."""
    return f"(\n  {fleet}\n)\nor\n(\n  {pods}\n  unless {_on(cfg)} {fleet_record}\n)"


def observed_speedup_low(cfg: MonitoringConfig) -> Alert:
    name, h, on = "SpecDecodeObservedSpeedupLow", p("hurtingBelow"), _on(cfg)
    w, pod_w = alert_window(cfg, name, "long"), cfg.sidecar_alert_window
    fleet_record, labels = latency_record(cfg, OBSERVED, "mean", w), by(cfg.level_labels())
    least, pod_labels = fmt_num(cfg.statistics.min_requests), by(cfg.level_labels("instance"))
    fleet = (f"{fleet_record} < {h}\n  and {on} {z_record(cfg, 'tpot_slower', w)} > {ticket_z(cfg, w):.2f}\n"
             f"  and {on}\n  min by ({labels}) ({tpot_requests_record(cfg)}) >= {least}")
    pods = (f"{_per_pod(cfg, 'mean', labels=cfg.level_labels())} < {h}\n"
            f"  and {on} min by ({labels}) (\n"
            f"    {z_record(cfg, 'tpot_slower', pod_w, 'instance')}\n"
            f"    and on ({pod_labels}) {pod_tpot_requests_record(cfg)} >= {least}\n"
            f"  ) > {ticket_z(cfg, pod_w):.2f}")
    return Alert(
        name, multiline(_fleet_else_pods(cfg, fleet, fleet_record, pods)),
        "Speculative decoding makes {{ $labels.model_name }} slower, measured",
        f"Over the last {w}, tokens of {WHERE} came {{{{ $value | printf \"%%.2f\" }}}}× as fast as without "
        "speculative decoding (baseline TPOT / current TPOT, below 1 means slower), and the requests prove it slower "
        "than without (a test of mean time per output token against the control pods, or against each pod's "
        "measured baseline): measured, not modelled. Turn it off or lower k; check load (verification turns "
        "compute-bound at large batches) and acceptance.")


def tail_regression(cfg: MonitoringConfig) -> Alert:
    name, h, on = "SpecDecodeTailRegression", p("hurtingBelow"), _on(cfg)
    w, labels = alert_window(cfg, name, "long"), by(cfg.level_labels())
    tail_least = fmt_num(cfg.statistics.min_requests / (1 - TAIL_Q))
    buckets = f'{tpot_buckets_record(cfg)}{{le="+Inf"}}'
    fleet = (f"{latency_record(cfg, OBSERVED, 'p99', w)} < {h}\n"
             f"  and {on} {latency_record(cfg, OBSERVED, 'p50', w)} > {h}\n"
             f"  and {on} {z_record(cfg, 'tpot_tail_slower', w)} > {tail_z(cfg):.2f}\n"
             f"  and {on}\n  min by ({labels}) ({buckets}) >= {tail_least}")

    def best_pod(statistic: str) -> str:
        return _per_pod(cfg, statistic, labels=cfg.level_labels())

    pods = (f"{best_pod('p99')} < {h}\n  and {on}\n  {best_pod('p50')} > {h}\n"
            f"  and {on}\n  max by ({labels}) ({pod_tpot_requests_record(cfg)}) >= {tail_least}")
    return Alert(
        name, multiline(_fleet_else_pods(cfg, fleet, latency_record(cfg, OBSERVED, "p99", w), pods)),
        "Speculative decoding helps {{ $labels.model_name }}'s median but hurts its slowest requests",
        f"Over the last {w}, the P99 time per output token of {WHERE} is slower than without speculative "
        f"decoding (P99 speedup {{{{ $value | printf \"%%.2f\" }}}}×) while the median is faster: more requests are "
        "slower than the control pods' slowest than chance allows (where there are control pods; against a pod's "
        f"measured baseline, from a P99 over at least {tail_least} requests). A tail "
        "regression, typical of "
        "mixed workloads where some requests accept few drafts. Find them per temperature and workload (the "
        "request tap) and disable spec decode for them.")


def latency_missing(cfg: MonitoringConfig) -> Alert:
    labels = by(cfg.target_labels)
    info = selector(m.BASELINE_INFO.name, METRIC_SELECTOR)
    histogram = selector(f"{m.REQUEST_TPOT.name}_count", METRIC_SELECTOR)
    up = selector(m.UP.name, METRIC_SELECTOR)
    # A control target without the histogram fails its collections (no_latency_metrics, specdecode_up 0): that
    # is this alert too, not SpecDecodeTargetDown.
    return Alert(
        "SpecDecodeLatencyMissing",
        f"((max by ({labels}) ({info})\nunless on ({labels})\ngroup by ({labels}) ({histogram}))\n"
        f"and on ({labels})\n{up} == 1)\nor\nmax by ({labels}) ({_errors_increasing(cfg, NO_LATENCY)})",
        "No latency metrics from {{ $labels.target }}, which takes part in a baseline comparison",
        "The sidecar {{ $labels.instance }} collects target {{ $labels.target }}, a spec-decode target with a "
        "baseline or a control target, but its exposition has no vllm:request_time_per_output_token_seconds "
        "histogram (vLLM older than 0.11, or renamed): no observed speedup can be measured.")


def request_acceptance_low(cfg: MonitoringConfig) -> Alert:
    name, q = "SpecDecodeRequestAcceptanceLow", cfg.thresholds.request_quantile
    qname, thr = quantile_name(q), f"{p('requestAcceptancePercent')}%%"
    w = alert_window(cfg, name, "long")
    on = f"\nand {_on(cfg)}\n"
    return Alert(
        name, f"{request_quantile_record(cfg)} < {p('requestAcceptanceRatio')}{on}{requests_record(cfg)} >= "
              f"{fmt_num(cfg.statistics.min_requests)}{on}{z_record(cfg, 'requests_below_threshold', w)} > "
              f"{ticket_z(cfg, w):.2f}",
        f"{qname.upper()} of per-request acceptance rate for {{{{ $labels.model_name }}}} is below {thr}",
        f"Over the last {w}, {escape(f'{q:.0%}')} of the requests of {WHERE} accepted at most {PCT} of their drafted "
        f"tokens (threshold {thr}, measured per request by the request tap, or by vLLM's own per-request histogram "
        "where it has one), and there are requests enough to prove it: for those requests speculative "
        "decoding is net-negative even if the model's overall α looks healthy. See α per workload and temperature "
        "band to find them.")


def band_acceptance_low(cfg: MonitoringConfig) -> Alert:
    name, level, thr = "SpecDecodeBandAcceptanceLow", cfg.alert_level, f"{p('pageAcceptancePercent')}%%"
    w = alert_window(cfg, name, "long")
    band_on = f"on ({by((*cfg.level_labels(), *BAND_LABELS))})"
    alpha, requests = band_record(cfg, REQUEST_ACCEPTANCE), requests_record(cfg, f"{level}_band")
    return Alert(
        name,
        f"{alpha} < {p('pageAcceptanceRatio')}\nand {band_on}\n{requests} >= {fmt_num(cfg.statistics.min_requests)}\n"
        f"and {band_on}\n{z_record(cfg, 'band_below_page', w, f'{level}_band')} > {ticket_z(cfg, w):.2f}",
        "Requests of {{ $labels.model_name }} in workload {{ $labels.workload }}, temperature "
        "{{ $labels.temperature }} accept below " f"{thr}",
        f"Over the last {w}, the requests of {WHERE} with workload {{{{ $labels.workload }}}} and temperature band "
        f"{{{{ $labels.temperature }}}} accepted {PCT} of their drafted tokens (page threshold {thr}, "
        "exact from the request tap's counters), and they are enough to prove it: speculative decoding slows these "
        "requests down. Route them to replicas without spec decode, or lower k.")


ROUTE_CLASS_LABELS = stage.ROUTE_CLASS_LABELS


def class_routed(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeClassRouted"
    labels = by((*cfg.level_labels(), *ROUTE_CLASS_LABELS))
    state = selector(m.ROUTE_CLASS_STATE.name, METRIC_SELECTOR)
    return Alert(
        name,
        f"max by ({labels}) ({state}) == 1\nand on ({labels})\n{class_requests_record(cfg)} > 0",
        "Requests of {{ $labels.model_name }} in workload {{ $labels.workload }}, temperature "
        "{{ $labels.temperature }} are routed away from speculative decoding",
        f"For %(for)s the request tap has sent the requests of {WHERE} with workload "
        "{{ $labels.workload }} and temperature band {{ $labels.temperature }}{{ with $labels.prompt_length }} "
        "(prompts of {{ . }} tokens){{ end }} to the pool without speculative decoding: a block of them showed α "
        "below the break-even, and the canary has not shown it above since. Users are not slowed down, but the "
        "draft model does not fit this traffic: it needs attention (another draft or method, a lower k, a draft "
        "trained on this workload).")


def _series_labels(cfg: MonitoringConfig) -> tuple[str, ...]:
    """One engine of one target: the alert level's labels, the target's and the engine."""
    return tuple(dict.fromkeys((*cfg.level_labels(), *cfg.target_labels, "model_name", "engine")))


def speculation_stopped(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeSpeculationStopped"
    w = alert_window(cfg, name, "short")
    scope = Scope(METRIC_SELECTOR, _series_labels(cfg))
    on = f"on ({scope.by_clause})"
    generated = engine_record(cfg, m.GENERATED_TOKENS.name)
    share = engine_record(cfg, SPECULATIVE_SHARE)
    drafted = engine_record(cfg, m.DRAFT_TOKENS.name)
    speculated = f"max by ({scope.by_clause}) ({selector(m.DRAFT_TOKENS.exposed_name, METRIC_SELECTOR)}) > 0"
    args = [f"$labels.{label}" for label in scope.by]
    series_match = ", ".join(f"{label}={Q}" for label in scope.by)
    rate_now = query_value(f"sum(rate({m.GENERATED_TOKENS.exposed_name}{{{series_match}}}[{w}]))",
                           'printf "%%.0f"', *args)
    # A source without an emitted-token count (TensorRT-LLM) stops when it drafts nothing while it generates.
    return Alert(
        name,
        f"(\n  {share} < {p('speculationShareBelow')}\n  or\n  {drafted} == 0\n)\n"
        f"and {on}\n{generated} >= {p('minGeneratedTokensPerSecond')}\nand {on}\n{speculated}",
        "{{ $labels.target }} stopped speculating while it still generates ({{ $labels.model_name }})",
        f"Over the last {w}, target {{{{ $labels.target }}}} (engine {{{{ $labels.engine }}}}) of {WHERE} generated "
        f"{rate_now} tokens/s, of which speculative steps produced {PCT} (threshold "
        f"{p('speculationSharePercent')}%%), though it drafted before. Speculation stopped without an error: an "
        "acceptance gate (TensorRT-LLM switches it off for good once the mean acceptance rate over "
        "acceptance_rate_window_size iterations is below acceptance_rate_threshold), a batch-size schedule at "
        "k = 0 (vLLM's num_speculative_tokens_per_batch_size), a drafter that finds nothing (ngram), or a config "
        "change. The acceptance alerts are blind meanwhile: no drafts, no α.")


def preemptions_raised(cfg: MonitoringConfig) -> Alert:
    name, bound = "SpecDecodePreemptionsRaised", p("maxPreemptionsPerRequestIncrease")
    w = alert_window(cfg, name, "long")
    record = capacity_record(cfg, "specdecode_preemptions_per_request", "ratio_rate")
    model_match, model_args = _model_query(cfg)
    control = query_value(f"{record}{{spec_decode='false', {model_match}}}", 'printf "%%.3f"', *model_args)
    return Alert(
        name, f'{record}{{spec_decode="true"}}\n- ignoring (spec_decode)\n{record}{{spec_decode="false"}}\n'
              f"> {bound}",
        "Speculative decoding makes {{ $labels.model_name }} preempt more requests than its control pods",
        f"Over the last {w}, the spec-decode pods of {WHERE} preempted {{{{ $value | printf \"%%.3f\" }}}} more "
        f"requests per finished request than its control pods (the same model with spec decode off; they preempted "
        f"{control}; bound {bound}): the draft model and its KV cache take memory the batch needs. A latency "
        "win at this cost is not paying off.", guard_window=w, guard="requests")


def throughput_cut(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeThroughputCut"
    w = alert_window(cfg, name, "long")
    record = capacity_record(cfg, "specdecode_generated_tokens_per_second", "avg_rate")
    scope = Scope(METRIC_SELECTOR, cfg.level_labels())
    return Alert(
        name,
        f'{record}{{spec_decode="true"}}\n/ ignoring (spec_decode)\n({record}{{spec_decode="false"}} > 0)\n'
        f"< {p('minThroughputRatio')}\nand on ({by(cfg.level_labels())})\n"
        f"{spec_pods_waiting(scope, cfg.sidecar_alert_window)} >= {p('minWaitingRequests')}",
        "Speculative decoding cuts the throughput of {{ $labels.model_name }}'s pods",
        f"Over the last {w}, each spec-decode engine of {WHERE} generated {{{{ $value | humanizePercentage }}}} of "
        f"the tokens per second of a control engine (the same model with spec decode off; bound "
        f"{p('minThroughputPercent')}%%) while requests waited on it (at least {p('minWaitingRequests')} on "
        "average): it runs at its capacity, and that capacity is lower. Faster tokens per request do not make up "
        "for fewer requests served.", guard_window=w, guard="requests")


def dispersion_above_assumed(cfg: MonitoringConfig) -> Alert:
    """The measured variance per drafted token (the tap's requests over the long window) above the configured bound
    the page assumes where it measures none: there the stated false-page rate no longer holds."""
    name, stats, w = "SpecDecodeDispersionAboveAssumed", cfg.statistics, cfg.long_window
    on = f"\nand {_on(cfg)}\n"
    return Alert(
        name, f"{variance_record(cfg, 'estimate')}\n> {_on(cfg)}\n{assumed_variance_record(cfg, w)}"
              f"{on}{tapped_requests_record(cfg)} >= {fmt_num(stats.min_requests)}",
        "Requests of {{ $labels.model_name }} scatter more than the page assumes",
        f"Over the last {w}, the acceptance of {WHERE}'s tapped requests varied by {{{{ $value | printf \"%%.2f\" }}}} "
        f"per drafted token, above the {fmt_num(stats.draft_tokens_per_request)} drafted tokens per request and sd "
        f"{fmt_num(stats.request_acceptance_sd)} the page assumes where it measures none (statistics in the "
        "monitoring config): where the tap has too few requests, the page's stated false-page rate does not hold. "
        "Set draft_tokens_per_request and request_acceptance_sd from the measured figures (the runbook says how).")


# The alert table: one entry per alert, in the order of the rules files. A new alert is a function above,
# an entry here, its severity and for: in monitoring.yaml, a runbook section and a promtool test.
ALERTS: tuple[Callable[[MonitoringConfig], Alert], ...] = (
    acceptance_low,
    below_break_even,
    acceptance_drift,
    interval_acceptance_low,
    target_down,
    metrics_missing,
    exporter_down,
    exporter_absent,
    recommended_k_lower,
    observed_speedup_low,
    tail_regression,
    latency_missing,
    request_acceptance_low,
    band_acceptance_low,
    class_routed,
    speculation_stopped,
    preemptions_raised,
    throughput_cut,
    dispersion_above_assumed,
)


def _alerts_of(cfg: MonitoringConfig) -> list[Alert]:
    return [make(cfg) for make in ALERTS]


def runbook_url_template(alert: str) -> str:
    return f"{p('runbookURL')}#{alert.lower()}"


def _traffic_guard(cfg: MonitoringConfig, alert: Alert) -> str:
    assert alert.guard_window is not None
    if alert.guard == "requests":
        return f"{spec_requests_per_hour_record(cfg, alert.guard_window)} >= {p('minRequestsPerHour')}"
    traffic = record_name(cfg.alert_level, m.DRAFT_TOKENS.name, f"rate{alert.guard_window}")
    return f"{traffic} >= {p('minDraftTokensPerSecond')}"


def finish(alert: Alert, cfg: MonitoringConfig) -> Rule:
    """The pass over every alert: the low-traffic guard where it has one, for:, severity (the extra labels are
    added as the template is filled: _filled_group), runbook link. ``%(for)s`` and ``%(severity)s`` are the alert's
    own settings."""
    if not alert.name.startswith(ALERT_NAME_PREFIX):
        raise ValueError(f"alert {alert.name}: names start with {ALERT_NAME_PREFIX}")
    cfg.alert(alert.name)  # every alert has its settings
    expr = alert.expr
    if alert.guard_window is not None:
        expr += f"\nand {_on(cfg)}\n{_traffic_guard(cfg, alert)}"
    return {
        "alert": alert.name,
        "expr": multiline(expr),
        "for": "%(for)s",
        "labels": {"severity": "%(severity)s"},
        "annotations": {"summary": alert.summary, "description": alert.description,
                        "runbook_url": runbook_url_template(alert.name)},
    }


PAGE_GROUP = "specdecode.alerts"
TICKETS_GROUP = "specdecode.alerts.tickets"
ALERT_GROUPS = (PAGE_GROUP, TICKETS_GROUP)
PAGE_PURPOSE = (
    "The page, in a group of its own evaluated every {every}: its false-page budget counts those evaluations and "
    "its delay is what it promises. It fires when the shortest page window that decides proves α low, and holds "
    "while α over the shortest window with half the evidence stays below the threshold (docs/paging.md).")
TICKETS_PURPOSE = (
    "Every other alert (tickets and context, for: of minutes to hours), with the window groups: at a fleet's size "
    "they are most of the alert groups' cost and a minute more on a 15-minute wait changes nothing. Their bars "
    "still count an evaluation every statistics.evaluation_interval: fewer evaluations hold the same budget with "
    "room.")


def _alert_templates(cfg: MonitoringConfig) -> tuple[Group, Group, Group]:
    """The page's group, the tickets' evidence and the tickets' group (templates)."""
    finished = [finish(alert, cfg) for alert in _alerts_of(cfg)]
    page = _budgeted_group(cfg, PAGE_GROUP, PAGE_PURPOSE.format(every=cfg.statistics.evaluation_interval),
                           [r for r in finished if r["alert"] == PAGE])
    evidence = _window_group(cfg, "tickets", "The tickets' test statistics, by name: each ticket compares one with "
                             "its bar (the false-ticket budget per window). One layer after what they read: up to "
                             "one evaluation (a minute) later than the records they read.", _ticket_evidence(cfg))
    tickets = Group(TICKETS_PURPOSE, {"name": TICKETS_GROUP, **window_interval(cfg),
                                      "rules": _laid_out(r for r in finished if r["alert"] != PAGE)})
    return page, evidence, tickets


# ------------------------------------------------------------------------------------------------- the files


FILES = {
    "stage": "specdecode-stage.rules.yaml",
    "windows": "specdecode-windows.rules.yaml",
    "derived": "specdecode-derived.rules.yaml",
    "page": "specdecode-page.rules.yaml",
    "tickets": "specdecode-tickets.rules.yaml",
}
RULE_FILES = tuple(FILES.values())  # in the order they read each other (load them all: a ruler's rule_files glob)


def rule_file_templates(cfg: MonitoringConfig) -> list[RuleFile]:
    """The rules, file by file, as templates."""
    page, ticket_evidence, tickets = _alert_templates(cfg)
    return [
        RuleFile(FILES["stage"], "The short stage: the only rules that read the pods' raw counters and histograms, "
                 "each summed per model (or band, side, engine) as its increase over one step (docs/fleet.md, "
                 "\"Two stages\"). Every window below is built from these records.", tuple(_stage_groups(cfg))),
        RuleFile(FILES["windows"], "The windows: per model rates, α and evidence over the short and long windows "
                 "and over each window a test on α reads, from the stage's records.", tuple(_window_groups(cfg))),
        RuleFile(FILES["derived"], "The derived figures: the baseline, latency and observed speedup, per-request "
                 "and band α, capacity against the control pods; what the dashboard and the tickets read.",
                 tuple(_derived_groups(cfg))),
        RuleFile(FILES["page"], f"The page ({PAGE}): its measured variance, each window's evidence by name, and "
                 "the alert that combines them (docs/paging.md explains it from the records' names).",
                 (*_page_groups(cfg), page)),
        RuleFile(FILES["tickets"], "The tickets: each test's statistic by name, and every alert but the page.",
                 (ticket_evidence, tickets)),
    ]


def _filled_group(group: Group, cfg: MonitoringConfig, values: dict[str, Any]) -> Group:
    if group.name not in ALERT_GROUPS:
        return Group(group.purpose, tunables.fill(group.body, values))
    extra = dict(cfg.extra_alert_labels)
    rules = []
    for rule in group.body["rules"]:
        settings = cfg.alert(rule["alert"])
        filled = tunables.fill(rule, {**values, "for": settings.for_, "severity": settings.severity})
        rules.append({**filled, "labels": {**filled["labels"], **extra}})
    return Group(group.purpose, {**tunables.fill({k: v for k, v in group.body.items() if k != "rules"}, values),
                                 "rules": rules})


def rule_files(cfg: MonitoringConfig) -> list[RuleFile]:
    """The rules, file by file, as a ruler reads them."""
    values = tunables.mapping(cfg)
    return [RuleFile(f.name, f.purpose, tuple(_filled_group(g, cfg, values) for g in f.groups))
            for f in rule_file_templates(cfg)]


def rule_groups(cfg: MonitoringConfig) -> dict[str, Any]:
    """Every group of every file, in the files' order: one document (a ruler loads all files; this is the same)."""
    return {"groups": [g.body for f in rule_files(cfg) for g in f.groups]}


def recording_groups(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    """The recording groups, as a ruler reads them."""
    return [g for g in rule_groups(cfg)["groups"] if g["name"] not in ALERT_GROUPS]

