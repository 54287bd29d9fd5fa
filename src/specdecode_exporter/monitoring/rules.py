"""Recording and alerting rules from the monitoring config.

Alerts are a table: each entry says what is wrong (its expression and words) and nothing else. One pass over
every rule (``finish``) adds what all of them share: ``for:``, the severity and extra labels, and the runbook
link — the way kubernetes-mixin adds ``runbook_url`` to every group with one function. An alert on a ratio is a
statistical test with its own minimum evidence (core.stats.evidence; the statistics section of the monitoring config).
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
from specdecode_exporter.monitoring import stage, variance
from specdecode_exporter.monitoring.promql import (
    Scope,
    baseline_over_current,
    break_even_in_force,
    bucket_at_or_below,
    by,
    fmt_num,
    guarded_ratio,
    proven_below,
    record_name,
    selector,
    spec_pods_waiting,
)

Rule = dict[str, Any]
ALERT_NAME_PREFIX = "SpecDecode"  # every alert's name starts with it (the dashboard selects ALERTS by it)
WHERE = "{{ $labels.model_name }}{{ with $labels.namespace }} (namespace {{ . }}){{ end }}"
PCT = "{{ $value | humanizePercentage }}"
ACCEPTANCE = m.ACCEPTANCE_RATIO.name
INTERVAL = m.INTERVAL_ACCEPTANCE.name


@dataclass(frozen=True, slots=True)
class Alert:
    """What one alert says; ``finish`` turns it into a rule."""

    name: str
    expr: str
    summary: str
    description: str
    # A low-traffic guard at this window: only where the alert is not a test with its own minimum evidence (the
    # per-interval quantile, whose per-interval α is noise below some tokens per collection; the capacity alerts).
    guard_window: str | None = None
    guard: str = "drafts"  # what the guard counts: drafted tokens, or finished spec-decode requests ("requests")


# ------------------------------------------------------------------------------------------- recording


def _records(cfg: MonitoringConfig, window: str) -> Iterator[Rule]:
    """Per model over ``window``: the page's counters' rates, α and mean acceptance length, from the stage."""
    level, op = cfg.alert_level, f"rate{window}"
    # The windows the tests read hold each step once (the short window is a value the mixin's _config may change).
    exact = window != cfg.short_window
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


def _baseline_rule(cfg: MonitoringConfig) -> Rule:
    level, labels = cfg.alert_level, by(cfg.level_labels())
    rng, off, long_w = cfg.baseline_range, cfg.baseline_offset, cfg.long_window
    accepted = record_name(level, m.ACCEPTED_TOKENS.name, f"rate{long_w}")
    drafted = record_name(level, m.DRAFT_TOKENS.name, f"rate{long_w}")
    return {"record": baseline_record(cfg),
            "expr": guarded_ratio(f"sum by ({labels}) (sum_over_time({accepted}[{rng}] offset {off}))",
                                  f"sum by ({labels}) (sum_over_time({drafted}[{rng}] offset {off}))")}


TPOT = m.TIME_PER_OUTPUT_TOKEN.name
OBSERVED = m.OBSERVED_SPEEDUP.name
LATENCY_STATISTICS = (("mean", None), ("p50", 0.5), ("p99", 0.99))


def latency_record(cfg: MonitoringConfig, metric: str, statistic: str, window: str) -> str:
    return record_name(cfg.alert_level, metric, f"{statistic}_rate{window}")


def _latency_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """Time per output token per model, apart for spec-decode and control pods (mean exact; p50 and p99 from the
    histograms), from the stage."""
    for window in dict.fromkeys([cfg.short_window, cfg.long_window]):
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
    group's records (so a group of its own: see recording_groups)."""
    for window in dict.fromkeys([cfg.short_window, cfg.long_window]):
        for statistic, _ in LATENCY_STATISTICS:
            yield {"record": latency_record(cfg, OBSERVED, statistic, window),
                   "expr": baseline_over_current(latency_record(cfg, TPOT, statistic, window))}


def tpot_requests_record(cfg: MonitoringConfig) -> str:
    return record_name(cfg.alert_level, m.REQUEST_TPOT.name + "_count", f"sampled_increase{cfg.long_window}")


def pod_tpot_requests_record(cfg: MonitoringConfig) -> str:
    return record_name(stage.family(cfg, "pod_tpot_count").level, m.REQUEST_TPOT.name + "_count",
                       f"sampled_increase{cfg.sidecar_alert_window}")


def tpot_buckets_record(cfg: MonitoringConfig) -> str:
    return record_name(cfg.alert_level, m.REQUEST_TPOT.name + "_bucket", f"sampled_increase{cfg.long_window}")


REQUEST_ACCEPTANCE = m.REQUEST_ACCEPTANCE.name
BAND_LABELS = stage.BAND_LABELS


def below_page_bound(cfg: MonitoringConfig) -> float:
    """The per-request histogram's bucket bound the page threshold falls on (buckets every 0.05)."""
    return bucket_at_or_below(m.ACCEPTANCE_RATIO_BUCKETS, cfg.thresholds.page_acceptance_ratio)


def request_quantile_record(cfg: MonitoringConfig) -> str:
    q = quantile_name(cfg.thresholds.request_quantile)
    return record_name(cfg.alert_level, REQUEST_ACCEPTANCE, f"{q}_rate{cfg.long_window}")


def band_record(cfg: MonitoringConfig, metric: str) -> str:
    return record_name(f"{cfg.alert_level}_band", metric, f"rate{cfg.long_window}")


def request_bound(cfg: MonitoringConfig) -> float:
    """The per-request histogram's bucket bound the per-request ticket's threshold falls on."""
    return bucket_at_or_below(m.ACCEPTANCE_RATIO_BUCKETS, cfg.thresholds.request_acceptance_ratio)


def request_share_record(cfg: MonitoringConfig) -> str:
    return record_name(cfg.alert_level, "specdecode_requests_below_request_threshold", f"ratio_rate{cfg.long_window}")


def requests_record(cfg: MonitoringConfig, level: str | None = None) -> str:
    """Requests the samples of the long window cover, per model (``level`` None) or per band: the evidence of the
    tests on per-request data."""
    level = level or cfg.alert_level
    return record_name(level, m.REQUESTS.name, f"sampled_increase{cfg.long_window}")


def _per_request(cfg: MonitoringConfig, query: Callable[[str], str]) -> str:
    """``query`` over the per-request α histogram's stage records: the request tap's where it has data for a
    result's labels, else the engine's own (vLLM's proposed vllm:request_spec_decode_acceptance_rate)."""
    return f"{query('request')}\nor\n{query('engine_request')}"


def le(bound: float) -> str:
    return f'le="{fmt_num(bound)}"'


def _request_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """The request tap's distribution per model, and exact α per workload and temperature band; the requests each
    of them counts (their evidence)."""
    w = cfg.long_window
    q, bound = cfg.thresholds.request_quantile, below_page_bound(cfg)

    def share(bound: float) -> Callable[[str], str]:
        return lambda h: guarded_ratio(f"sum without (le) ({stage.rate(cfg, f'{h}_bucket', w, le(bound))})",
                                       stage.rate(cfg, f"{h}_count", w))

    yield {"record": request_quantile_record(cfg),
           "expr": _per_request(cfg, lambda h: staged_quantile(cfg, q, h, w))}
    yield {"record": record_name(cfg.alert_level, "specdecode_requests_below_page_threshold", f"ratio_rate{w}"),
           "expr": _per_request(cfg, share(bound))}
    # Its own record even where the two thresholds share a bucket: which rules exist must not depend on a value
    # the mixin's _config may change.
    yield {"record": request_share_record(cfg), "expr": _per_request(cfg, share(request_bound(cfg)))}
    yield {"record": requests_record(cfg), "expr": _per_request(cfg, lambda h: stage.count(cfg, f"{h}_count", w))}
    yield {"record": band_record(cfg, m.REQUESTS.name), "expr": stage.rate(cfg, "requests", w)}
    yield {"record": band_record(cfg, REQUEST_ACCEPTANCE),
           "expr": guarded_ratio(stage.rate(cfg, "request_accepted", w), stage.rate(cfg, "request_drafted", w))}
    yield {"record": requests_record(cfg, f"{cfg.alert_level}_band"), "expr": stage.count(cfg, "requests", w)}
    yield {"record": record_name(f"{cfg.alert_level}_band", m.REQUEST_DRAFT_TOKENS.name, f"sampled_increase{w}"),
           "expr": stage.count(cfg, "request_drafted", w)}
    yield from _tapped_sum_rules(cfg)


CAPACITY = "specdecode_capacity"


def capacity_record(cfg: MonitoringConfig, metric: str, op: str) -> str:
    return record_name(cfg.alert_level, metric, f"{op}{cfg.long_window}")


def _capacity_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """What spec decode costs against the control pods, per model and spec_decode: preemptions per finished
    request, generated tokens per second per engine, mean KV-cache usage."""
    w = cfg.long_window
    yield {"record": capacity_record(cfg, "specdecode_preemptions_per_request", "ratio_rate"),
           "expr": guarded_ratio(stage.rate(cfg, "preemptions", w), stage.rate(cfg, "tpot_count", w))}
    yield {"record": capacity_record(cfg, "specdecode_generated_tokens_per_second", "avg_rate"),
           "expr": guarded_ratio(stage.rate(cfg, "generated", w), stage.rate(cfg, "engines", w))}
    yield {"record": capacity_record(cfg, m.KV_CACHE_USAGE.name, "avg_over_time"),
           "expr": stage.rate(cfg, "kv_cache", w)}


def evidence_record(cfg: MonitoringConfig, window: str) -> str:
    """Drafted tokens the samples of a window cover, per model: what a test on α over it has seen."""
    return record_name(cfg.alert_level, m.DRAFT_TOKENS.name, f"sampled_increase{window}")


def evidence_group(window: str) -> str:
    return f"specdecode.rules.evidence.{window}"


def tested_windows(cfg: MonitoringConfig) -> list[str]:
    """Every window a test on α reads: the page's, and the long one of the tickets."""
    return list(dict.fromkeys([*cfg.statistics.page_windows, cfg.long_window]))


def _evidence_rules(cfg: MonitoringConfig, window: str) -> Iterator[Rule]:
    """Per model, for one tested window: the rates and α (where the level group does not record them already) and
    the drafted tokens the samples cover (the evidence)."""
    if window not in (cfg.short_window, cfg.long_window):
        yield from _records(cfg, window)
    yield {"record": evidence_record(cfg, window), "expr": stage.count(cfg, "draft_tokens", window)}


# The page's variance measured over the hour before the last ten minutes: a drop's own minutes, which mix two α
# and inflate it, stay out of it while the page's windows fill (bench/paging_variance.py: P95 120 s at sd 0.1 where
# the hour up to now gave 125 s and six hours 165 s).
VARIANCE_WINDOW, VARIANCE_OFFSET = "1h", "10m"


def variance_record(cfg: MonitoringConfig, what: str) -> str:
    """``bound``: the page's (over VARIANCE_WINDOW before VARIANCE_OFFSET); ``estimate``: the long window's."""
    window = VARIANCE_WINDOW if what == "bound" else cfg.long_window
    return record_name(cfg.alert_level, m.ACCEPTANCE_VARIANCE.name, f"{what}{window}")


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


def _window_sums(cfg: MonitoringConfig, window: str, offset: str = "") -> variance.WindowSums:
    """The tap's per-request sums over a window, per model, as recorded by the requests group (``offset``: as
    recorded that long ago)."""
    after = f" offset {offset}" if offset else ""
    return variance.WindowSums(*(tapped_sum_record(cfg, key, window) + after for key in TAPPED_SUMS))


def _variance_rules(cfg: MonitoringConfig) -> Iterator[Rule]:
    """The page's variance per drafted token measured on the tap's requests: its upper bound (what the page divides
    by where it exists), and the hour's estimate (SpecDecodeDispersionAboveAssumed)."""
    min_requests = cfg.statistics.min_requests
    yield {"record": variance_record(cfg, "bound"),
           "expr": variance.upper_bound(_window_sums(cfg, VARIANCE_WINDOW, VARIANCE_OFFSET), min_requests)}
    yield {"record": variance_record(cfg, "estimate"), "expr": variance.estimate(_window_sums(cfg, cfg.long_window))}


def window_interval(cfg: MonitoringConfig) -> dict[str, str]:
    """The `interval` of the groups that run every windows.evaluation_interval (none: the ruler's default)."""
    return {"interval": cfg.windows.evaluation_interval} if cfg.windows.evaluation_interval else {}


def recording_groups(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    """Layers: no group reads a series recorded in that same group, and every group reads only records of the
    groups before it. A remote ruler (vmalert, Thanos Ruler, Mimir's ruler) writes a group's records to the store
    and reads them back from it, so a record chained on another of its own group would read the previous
    evaluation's value, or nothing until the write lands (docs/fleet.md)."""
    windows = list(dict.fromkeys([cfg.short_window, cfg.long_window]))
    every = window_interval(cfg)

    def window_group(name: str, rules: Iterable[Rule]) -> dict[str, Any]:
        return {"name": f"specdecode.rules.{name}", **every, "rules": list(rules)}

    # The stage first: the only groups that read the pods' raw series over a range. Per-pod windows are the
    # sidecar's own windowed gauges; the rules keep none.
    groups = [*stage.stage_groups(cfg),
              window_group(cfg.alert_level, [*(r for w in windows for r in _records(cfg, w)), *_quantile_records(cfg)])]
    # A group per tested window, evaluated as often as the budgets assume (the page's timing must not depend on the
    # ruler's); one group for all would exceed Mimir's default of 20 rules per group.
    groups.extend({"name": evidence_group(window), "interval": cfg.statistics.evaluation_interval,
                   "rules": list(_evidence_rules(cfg, window))} for window in tested_windows(cfg))
    groups.append(window_group("baseline", [_baseline_rule(cfg)]))
    groups.append(window_group("latency", _latency_rules(cfg)))
    groups.append(window_group("speedup", _speedup_rules(cfg)))
    groups.append(window_group("requests", _request_rules(cfg)))
    groups.append(window_group("variance", _variance_rules(cfg)))
    groups.append(window_group("capacity", _capacity_rules(cfg)))
    return groups


# ---------------------------------------------------------------------------------------------- alerts


def alpha_record(cfg: MonitoringConfig, window: str) -> str:
    return record_name(cfg.alert_level, ACCEPTANCE, f"rate{window}")


def query_value(promql: str, fmt: str, *args: str, default: str = "unknown") -> str:
    """An annotation snippet that runs ``printf promql args`` and prints the first result's value through fmt."""
    return (f'{{{{ with printf "{promql}" {" ".join(args)} | query }}}}'
            f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}{default}{{{{ end }}}}")


def _model_query(cfg: MonitoringConfig) -> tuple[str, list[str]]:
    """Matchers and template arguments that select the alert's own model in an annotation query."""
    labels = cfg.level_labels()
    return ", ".join(f"{label}=%q" for label in labels), [f"$labels.{label}" for label in labels]


def _target_query(cfg: MonitoringConfig) -> tuple[str, str]:
    return (", ".join(f"{label}=%q" for label in cfg.target_labels),
            " ".join(f"$labels.{label}" for label in cfg.target_labels))


def alpha_proven_below(cfg: MonitoringConfig, window: str, null: str, below: str, z: float,
                       inflation: float = 1.0, measured: bool = False) -> str:
    """α over the window is below ``below``, and the window holds at least min_requests requests' worth of drafted
    tokens which rule out α at ``null`` or above (a z-test, core.stats.evidence; ``null`` may be a series per model,
    whose own uncertainty ``inflation`` adds to the variance). ``measured``: the variance is the measured one's upper
    bound where the tap's requests give one (variance_record), else the configured."""
    level, on = cfg.alert_level, f"\nand on ({by(cfg.level_labels())})\n"
    alpha, evidence, dispersion = alpha_record(cfg, window), evidence_record(cfg, window), cfg.statistics.dispersion
    drafted = record_name(level, m.DRAFT_TOKENS.name, f"rate{window}")
    drafts = record_name(level, m.DRAFTS.name, f"rate{window}")
    # v = k̄·(¼ − s²) + m·s², k̄ = tokens per draft; an engine without a drafts counter gets k̄ = m (the bound for
    # a request whose tokens all fall together): slower to prove, never noisier.
    tokens_per_draft = f"({drafted} / {drafts} or {drafted} * 0 + {fmt_num(dispersion.tokens_per_request)})"
    variance = (f"{fmt_num(dispersion.per_draft_token * inflation)} * {tokens_per_draft} "
                f"+ {fmt_num(dispersion.per_request * inflation)}")
    if measured:
        variance = f"{variance_record(cfg, 'bound')}\nor\n{variance}"
    return (f"{alpha} < {below}{on}{evidence} >= {fmt_num(cfg.statistics.min_draft_tokens)}{on}"
            + proven_below(alpha, null, evidence, variance, z))


def ticket_z(cfg: MonitoringConfig, window: str) -> float:
    """The bar of a ticket's test over one window: the whole false-ticket budget for it."""
    stats = cfg.statistics
    every = duration_seconds(stats.evaluation_interval)
    return critical_z(stats.false_tickets_per_30d, duration_seconds(window), every)


def page_tests(cfg: MonitoringConfig) -> list[tuple[str, float]]:
    """(window, z*) of each of the page's tests: the false-page budget split between its windows by their shares
    (a union bound: the expected false pages of all windows together stay within the budget)."""
    stats = cfg.statistics
    every = duration_seconds(stats.evaluation_interval)
    return [(w, critical_z(budget, duration_seconds(w), every))
            for w, budget in zip(stats.page_windows, stats.page_budgets(), strict=True)]


def _vetoes(cfg: MonitoringConfig, windows: list[str], below: str) -> str:
    """Each shorter window that holds enough evidence and shows α at or above ``below`` vetoes a longer one: the
    longer window still holds minutes that the shorter ones have seen end (a recovery), or not yet begin."""
    on, least = f"on ({by(cfg.level_labels())})", fmt_num(cfg.statistics.min_draft_tokens)
    return "".join(f"\nunless {on}\n({alpha_record(cfg, w)} >= {below}\nand {on}\n{evidence_record(cfg, w)} >= {least})"
                   for w in windows)


PAGE = "SpecDecodeAcceptanceRateLow"


def page_proof(cfg: MonitoringConfig) -> str:
    """What starts the page: any of its windows proves α low (each one's test, vetoed by shorter windows)."""
    thr, stats = cfg.thresholds.page_acceptance_ratio, cfg.statistics
    null, below = fmt_num(thr + stats.page_margin), fmt_num(thr)
    return "\nor\n".join(
        f"(\n{alpha_proven_below(cfg, window, null, below, z, measured=True)}"
        f"{_vetoes(cfg, list(stats.page_windows[:i]), below)}\n)"
        for i, (window, z) in enumerate(page_tests(cfg)))


def page_holds(cfg: MonitoringConfig) -> str:
    """What keeps a firing page firing (hysteresis): α over the shortest window that holds half of min_requests'
    worth of drafted tokens is still below the threshold. Without it, a test near its bar (or a window whose evidence
    hovers at min_requests) would resolve and fire again, a page each time; with it the page resolves once the
    requests of a short window show α back, or traffic stops."""
    on, least = f"on ({by(cfg.level_labels())})", fmt_num(cfg.statistics.min_draft_tokens / 2)
    informative = "\nor\n".join(f"({alpha_record(cfg, w)}\nand {on}\n{evidence_record(cfg, w)} >= {least})"
                                  for w in cfg.statistics.page_windows)
    return f"(\n{informative}\n)\n< {fmt_num(cfg.thresholds.page_acceptance_ratio)}"


def page_expr(proof: str, holds: str, level_labels: tuple[str, ...]) -> str:
    """The page: proof, or (while it fires: ALERTS, as the ruler wrote it at the last evaluation) holds."""
    return (f"{proof}\nor\n(\n{holds}\nand on ({by(level_labels)})\n"
            f'ALERTS{{alertname="{PAGE}", alertstate="firing"}}\n)')


def acceptance_low(cfg: MonitoringConfig) -> Alert:
    thr, stats = cfg.thresholds.page_acceptance_ratio, cfg.statistics
    windows = ", ".join(stats.page_windows)
    return Alert(
        PAGE, page_expr(page_proof(cfg), page_holds(cfg), cfg.level_labels()),
        f"Speculative decoding acceptance rate for {{{{ $labels.model_name }}}} is below {thr:.0%}",
        f"{WHERE} accepted only {PCT} of its drafted tokens (all pods together; page threshold {thr:.0%}) over "
        f"the shortest of its windows ({windows}) that holds enough requests to prove α below "
        f"{thr + stats.page_margin:.0%} (at most {fmt_num(stats.false_pages_per_30d)} false page per 30 days). At "
        "this rate speculative decoding most likely makes generation slower than plain decoding.")


def below_break_even(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeBelowBreakEven"
    w = cfg.window(cfg.alert(name).window or "long")
    model_match, model_args = _model_query(cfg)
    in_force = f"(\n{break_even_in_force(Scope(cfg.metric_selector, cfg.level_labels()))}\n)"
    bases = ("calibrated", "configured")  # the one in force first; single quotes: this goes inside printf "…"
    now = " or ".join(f"max({m.BREAK_EVEN.name}{{cost_basis='{basis}', {model_match}}})" for basis in bases)
    break_even_now = query_value(now, "humanizePercentage", *model_args * len(bases))
    return Alert(
        name, alpha_proven_below(cfg, w, in_force, in_force, ticket_z(cfg, w)),
        "Speculative decoding for {{ $labels.model_name }} is below break-even (modelled speedup < 1)",
        f"Over the last {w}, {WHERE} accepted {PCT} of its drafted tokens, below the break-even "
        f"acceptance rate of {break_even_now} from the sidecar's cost model (calibrated to the observed speedup "
        "where a baseline gives one), and its requests prove it below: speculative decoding is modelled "
        "to cost more time than it saves.")


def acceptance_drift(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeAcceptanceRateDrift"
    w, drop, rng = cfg.window(cfg.alert(name).window or "long"), cfg.thresholds.drift_drop, cfg.baseline_range
    model_match, model_args = _model_query(cfg)
    base = baseline_record(cfg)
    # The baseline is an estimate too, over range/w times the evidence (steady traffic): its variance adds w/range.
    inflation = 1 + duration_seconds(w) / duration_seconds(rng)
    return Alert(
        name, alpha_proven_below(cfg, w, f"({base} - {fmt_num(drop)})", f"({base} - {fmt_num(drop)})",
                                 ticket_z(cfg, w), inflation),
        f"Speculative decoding acceptance rate for {{{{ $labels.model_name }}}} dropped more than "
        f"{drop * 100:g} points below its {rng} baseline",
        f"Over the last {w}, {WHERE} accepted {PCT} of its drafted tokens; its baseline over the "
        f"previous {rng} was {query_value(f'{base}{{{model_match}}}', 'humanizePercentage', *model_args)}, and its "
        "requests prove the drop. A drop like this usually means drift in the traffic, a stale draft model, or a "
        "quantization or version change.")


def interval_acceptance_low(cfg: MonitoringConfig) -> Alert:
    q, thr, long_w = cfg.thresholds.interval_quantile, cfg.thresholds.interval_acceptance_ratio, cfg.long_window
    qname = quantile_name(q)
    return Alert(
        "SpecDecodeIntervalAcceptanceLow",
        f"{record_name(cfg.alert_level, INTERVAL, f'{qname}_rate{long_w}')} < {fmt_num(thr)}",
        f"{qname.upper()} of per-interval acceptance rate for {{{{ $labels.model_name }}}} is below {thr:.0%}",
        f"Over the last {long_w}, {q:.0%} of the collection intervals of {WHERE} had an acceptance rate "
        f"below {PCT} (threshold {thr:.0%}): for a sizeable share of the time speculative decoding was "
        "net-negative, even if the average looks fine.", guard_window=long_w)


# Collection errors that are not an outage: the target answers, but without what the sidecar needs. Each has its
# own alert, and SpecDecodeTargetDown leaves them to it.
NO_SPEC, NO_LATENCY = FailureReason.NO_SPEC_METRICS.value, FailureReason.NO_LATENCY_METRICS.value


def _errors_increasing(cfg: MonitoringConfig, *reasons: str) -> str:
    window = cfg.window(cfg.alert("SpecDecodeMetricsMissing").window or "short")
    reason = f'reason="{reasons[0]}"' if len(reasons) == 1 else f'reason=~"{"|".join(reasons)}"'
    # The short window is a value the mixin's _config may change: no millisecond off it (a collection more, at most).
    return f"{stage.count(cfg, 'collect_errors', window, reason, exact=False)} > 0"


def _no_spec_metrics(cfg: MonitoringConfig) -> str:
    return _errors_increasing(cfg, NO_SPEC)


def target_down(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeTargetDown"
    window = cfg.window(cfg.alert("SpecDecodeMetricsMissing").window or "short")
    target_match, target_args = _target_query(cfg)
    reason_q = f"topk(1, increase({m.COLLECT_ERRORS.exposed_name}{{{target_match}}}[{window}]) > 0)"
    reason = f'{{{{ range printf "{reason_q}" {target_args} | query }}}}{{{{ .Labels.reason }}}}' \
             "{{ else }}unknown{{ end }}"
    return Alert(
        name, f"{selector(m.UP.name, cfg.metric_selector)} == 0\nunless on ({by(cfg.target_labels)})\n"
              f"{_errors_increasing(cfg, NO_SPEC, NO_LATENCY)}",
        "specdecode sidecar cannot collect metrics from {{ $labels.target }}",
        "The sidecar {{ $labels.instance }} (job {{ $labels.job }}) has failed to collect from target "
        f"{{{{ $labels.target }}}} for {cfg.alert(name).for_}; most frequent error reason: {reason}. "
        "No acceptance-rate alert can fire for this target meanwhile.")


def metrics_missing(cfg: MonitoringConfig) -> Alert:
    window = cfg.window(cfg.alert("SpecDecodeMetricsMissing").window or "short")
    return Alert(
        "SpecDecodeMetricsMissing", _no_spec_metrics(cfg),
        "vLLM at {{ $labels.target }} serves no speculative-decoding metrics",
        f"{{{{ $value | humanize }}}} collections by {{{{ $labels.instance }}}} in the last {window} found "
        "target {{ $labels.target }} answering without any speculative-decoding metrics: spec decode was "
        "switched off, or a vLLM upgrade renamed the metrics.")


def exporter_down(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeExporterDown"
    return Alert(
        name, f"up{{{cfg.exporter_job_selector}}} == 0",
        "Prometheus cannot scrape the specdecode sidecar {{ $labels.instance }}",
        "Prometheus has failed to scrape the specdecode sidecar {{ $labels.instance }} (job "
        f"{{{{ $labels.job }}}}) for {cfg.alert(name).for_}. The acceptance-rate alerts are blind for "
        "the models it watches.")


def exporter_absent(cfg: MonitoringConfig) -> Alert:
    name, job = "SpecDecodeExporterAbsent", cfg.exporter_job_selector
    return Alert(
        name, f"absent(up{{{job}}} == 1)", "No specdecode sidecar is up",
        f"For {cfg.alert(name).for_} Prometheus has had no successfully scraped target matching "
        f"up{{{job.replace(chr(34), chr(39))}}}. Every speculative-decoding alert is blind. Check that the "
        "sidecars run and that the scrape job (or ServiceMonitor/PodMonitor) still selects them.")


def recommended_k_lower(cfg: MonitoringConfig) -> Alert:
    """The configured k travels on the alert as its ``num_speculative_tokens`` label (from specdecode_info, one per
    series: topk), not as an annotation's query: a ruler expands annotations for every pending alert at every
    evaluation, and this one is pending for 6h on every pod whose k is too long (at 400 such pods the query cost
    150 ms of the group's 244 ms a minute)."""
    name, sw = "SpecDecodeRecommendedKLower", cfg.sidecar_alert_window
    window = ", ".join(p for p in (cfg.metric_selector, f'window="{sw}"') if p)
    recommended = selector(m.RECOMMENDED_K.name, window)
    info = selector(m.INFO.name, ", ".join(p for p in (cfg.metric_selector, 'num_speculative_tokens!=""') if p))
    return Alert(
        name,
        f"(\n{recommended}\nunless ignoring (window, num_speculative_tokens)\n"
        f'(count_values without (window) ("num_speculative_tokens", {recommended})\n'
        f" and ignoring (api, method) {info})\n)\n"
        "* ignoring (window, api, method, num_speculative_tokens) group_left (num_speculative_tokens)\n"
        f"topk without (api, method, num_speculative_tokens) (1, {info})\n"
        f"and ignoring (num_speculative_tokens) {selector(m.DRAFT_TOKENS_PER_SECOND.name, window)}"
        f" >= {fmt_num(cfg.min_draft_tokens_per_second)}",
        "Fewer speculative tokens would be faster for {{ $labels.model_name }} on {{ $labels.target }}",
        f"For {cfg.alert(name).for_} the sidecar's cost model has recommended num_speculative_tokens = "
        f"{{{{ $value }}}} for {{{{ $labels.model_name }}}} on {{{{ $labels.target }}}}, lower than the "
        f"configured {{{{ $labels.num_speculative_tokens }}}} (window {sw}): later draft positions are rarely "
        "accepted.")


def _per_pod_speedup(cfg: MonitoringConfig, statistic: str, labels: tuple[str, ...] | None = None) -> str:
    """The best pod's own observed speedup (against its control target or measured baseline), per model (or per
    ``labels``)."""
    window = ", ".join(p for p in (cfg.metric_selector, f'statistic="{statistic}"',
                                   f'window="{cfg.sidecar_alert_window}"') if p)
    return f"max by ({by(labels or cfg.level_labels())}) ({selector(OBSERVED, window)})"


def _fleet_else_pods(cfg: MonitoringConfig, fleet: str, fleet_record: str, pods: str) -> str:
    """The fleet's condition (control pods against spec-decode pods) where there are control pods, else the
    pods' own comparisons. Parenthesised whole: `or` binds looser than the guard's `and`."""
    return f"(({fleet})\nor\n(({pods})\nunless on ({by(cfg.level_labels())})\n{fleet_record}))"


# A TPOT distribution's spread from its quantiles: (P99 − P50) / 2.326, the sd of a normal with those quantiles;
# for TPOT's right-skewed distributions it overstates the sd, so the tests below err toward "not proven".
TPOT_SD = "(({p99} - {p50}) / 2.326)"
# vLLM's TPOT histogram has 19 bounds and +Inf: the tail test runs at each, so its budget is split 20 ways.
TPOT_BUCKETS = 20


def _slower_proven_fleet(cfg: MonitoringConfig, w: str) -> str:
    """Welch's two-sample test on mean TPOT: spec-decode pods' mean × h above the control pods' (speedup below h),
    each side's variance of the mean its spread² / its requests."""
    def side(label: str, stat: str) -> str:
        return f'{latency_record(cfg, TPOT, stat, w)}{{spec_decode="{label}"}}'

    def spread(label: str) -> str:
        return TPOT_SD.format(p99=side(label, "p99"), p50=side(label, "p50"))

    n, h = tpot_requests_record(cfg), cfg.verdict.hurting_below
    variance = (f"{fmt_num(h * h)} * {spread('true')} ^ 2 / {n}{{spec_decode=\"true\"}}\n"
                f"+ ignoring (spec_decode)\n{spread('false')} ^ 2 / {n}{{spec_decode=\"false\"}}")
    least = fmt_num(cfg.statistics.min_requests)
    return (f"({fmt_num(h)} * {side('true', 'mean')} - ignoring (spec_decode) {side('false', 'mean')})\n"
            f"/ ignoring (spec_decode)\nsqrt(\n{variance}\n)\n> {ticket_z(cfg, w):.2f}\n"
            f"and on ({by(cfg.level_labels())})\nmin by ({by(cfg.level_labels())}) ({n}) >= {least}")


def _slower_proven_pods(cfg: MonitoringConfig, h: str) -> str:
    """Per pod against its measured baseline (a figure, not a sample): a one-sample test of the pod's mean TPOT
    over the sidecar's window, z = (1 − S/h) · mean · √n / spread. The model is slower where even its best pod's
    speedup is below h, and proven so where every pod with min_requests requests is."""
    pod, w = cfg.level_labels("instance"), cfg.sidecar_alert_window
    speedup = _per_pod_speedup(cfg, "mean", pod)

    def tpot(statistic: str) -> str:  # the sidecar's own window of the pod's TPOT
        matchers = ", ".join(p for p in (cfg.metric_selector, f'statistic="{statistic}"', f'window="{w}"') if p)
        return f"max by ({by(pod)}) ({selector(TPOT, matchers)})"

    spread = TPOT_SD.format(p99=tpot("p99"), p50=tpot("p50"))
    n = pod_tpot_requests_record(cfg)
    z = f"(1 - {speedup} / {h})\n* {tpot('mean')}\n/ ({spread} > 0)\n* sqrt({n})"
    return (f"{_per_pod_speedup(cfg, 'mean')} < {h}\nand on ({by(cfg.level_labels())})\n"
            f"min by ({by(cfg.level_labels())}) (\n{z}\nand on ({by(pod)})\n{n} >= "
            f"{fmt_num(cfg.statistics.min_requests)}\n) > {ticket_z(cfg, w):.2f}")


def observed_speedup_low(cfg: MonitoringConfig) -> Alert:
    name, hurting = "SpecDecodeObservedSpeedupLow", fmt_num(cfg.verdict.hurting_below)
    w = cfg.window(cfg.alert(name).window or "long")
    fleet = latency_record(cfg, OBSERVED, "mean", w)
    on = f"\nand on ({by(cfg.level_labels())})\n"
    return Alert(
        name, _fleet_else_pods(cfg, f"{fleet} < {hurting}{on}({_slower_proven_fleet(cfg, w)})", fleet,
                               _slower_proven_pods(cfg, hurting)),
        "Speculative decoding makes {{ $labels.model_name }} slower, measured",
        f"Over the last {w}, tokens of {WHERE} came {{{{ $value | printf \"%.2f\" }}}}× as fast as without "
        "speculative decoding (baseline TPOT / current TPOT, below 1 means slower), and the requests prove it slower "
        "than without (a test of mean time per output token against the control pods, or against each pod's "
        "measured baseline): measured, not modelled. Turn it off or lower k; check load (verification turns "
        "compute-bound at large batches) and acceptance.")


def _tail_proven_fleet(cfg: MonitoringConfig, w: str, q: float = 0.99) -> str:
    """At some bucket bound in the control pods' top 1 − q, more spec-decode requests are slower than it than
    control requests, by a two-proportion test (each bound one test of the budget); each side needs min_requests
    requests beyond its P99."""
    buckets, label = tpot_buckets_record(cfg), "spec_decode"

    def above(side: str) -> str:  # per bound: the share of the side's requests slower than it
        return (f'(1 - {buckets}{{{label}="{side}"}}\n/ ignoring (le) group_left\n'
                f'{buckets}{{{label}="{side}", le="+Inf"}})')

    def n(side: str) -> str:
        return f'{buckets}{{{label}="{side}", le="+Inf"}}'

    spec, control = above("true"), above("false")
    variance = (f"{spec} * (1 - {spec}) / ignoring (le) group_left {n('true')}\n+ ignoring ({label})\n"
                f"{control} * (1 - {control}) / ignoring (le) group_left {n('false')}")
    stats = cfg.statistics
    z = critical_z(stats.false_tickets_per_30d / TPOT_BUCKETS, duration_seconds(w),
                   duration_seconds(stats.evaluation_interval))
    tests = (f"({spec}\n- ignoring ({label})\n{control})\n/ ignoring ({label})\nsqrt(\n{variance}\n)\n"
             f"and ignoring ({label})\n{control} <= {fmt_num(1 - q)}")
    least = fmt_num(stats.min_requests / (1 - q))
    return (f"max by ({by(cfg.level_labels())}) (\n{tests}\n) > {z:.2f}\nand on ({by(cfg.level_labels())})\n"
            f"min by ({by(cfg.level_labels())}) ({n('true')} or {n('false')}) >= {least}")


def tail_regression(cfg: MonitoringConfig) -> Alert:
    name, hurting = "SpecDecodeTailRegression", fmt_num(cfg.verdict.hurting_below)
    w = cfg.window(cfg.alert(name).window or "long")
    on = f"and on ({by(cfg.level_labels())})"
    fleet = (f"{latency_record(cfg, OBSERVED, 'p99', w)} < {hurting}\n{on}\n"
             f"{latency_record(cfg, OBSERVED, 'p50', w)} > {hurting}\n{on}\n({_tail_proven_fleet(cfg, w)})")
    tail_requests = f"max by ({by(cfg.level_labels())}) ({pod_tpot_requests_record(cfg)})"
    pods = (f"{_per_pod_speedup(cfg, 'p99')} < {hurting}\n{on}\n{_per_pod_speedup(cfg, 'p50')} > {hurting}\n{on}\n"
            f"{tail_requests} >= {fmt_num(cfg.statistics.min_requests / 0.01)}")
    return Alert(
        name, _fleet_else_pods(cfg, fleet, latency_record(cfg, OBSERVED, "p99", w), pods),
        "Speculative decoding helps {{ $labels.model_name }}'s median but hurts its slowest requests",
        f"Over the last {w}, the P99 time per output token of {WHERE} is slower than without speculative "
        f"decoding (P99 speedup {{{{ $value | printf \"%.2f\" }}}}×) while the median is faster: more requests are "
        "slower than the control pods' slowest than chance allows (where there are control pods; against a pod's "
        f"measured baseline, from a P99 over at least {cfg.statistics.min_requests / 0.01:.0f} requests). A tail "
        "regression, typical of "
        "mixed workloads where some requests accept few drafts. Find them per temperature and workload (the "
        "request tap) and disable spec decode for them.")


def latency_missing(cfg: MonitoringConfig) -> Alert:
    labels = by(cfg.target_labels)
    info = selector(m.BASELINE_INFO.name, cfg.metric_selector)
    histogram = selector(f"{m.REQUEST_TPOT.name}_count", cfg.metric_selector)
    up = selector(m.UP.name, cfg.metric_selector)
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
    """The q-quantile of per-request α below the threshold ⟺ more than q of the requests at or below its bucket:
    requests are independent units, so the proof is a binomial test of that share against q."""
    name = "SpecDecodeRequestAcceptanceLow"
    q, threshold = cfg.thresholds.request_quantile, cfg.thresholds.request_acceptance_ratio
    qname = quantile_name(q)
    w = cfg.window(cfg.alert(name).window or "long")
    on, requests = f"\nand on ({by(cfg.level_labels())})\n", requests_record(cfg)
    proof = (f"({request_share_record(cfg)} - {fmt_num(q)}) * sqrt({requests} / {fmt_num(q * (1 - q))})\n"
             f"> {ticket_z(cfg, w):.2f}")
    return Alert(
        name, f"{request_quantile_record(cfg)} < {fmt_num(threshold)}{on}{requests} >= "
              f"{fmt_num(cfg.statistics.min_requests)}{on}{proof}",
        f"{qname.upper()} of per-request acceptance rate for {{{{ $labels.model_name }}}} is below {threshold:.0%}",
        f"Over the last {w}, {q:.0%} of the requests of {WHERE} accepted at most {PCT} of their drafted tokens "
        f"(threshold {threshold:.0%}, measured per request by the request tap, or by vLLM's own per-request histogram "
        "where it has one), and there are requests enough to prove it: for those requests speculative "
        "decoding is net-negative even if the model's overall α looks healthy. See α per workload and temperature "
        "band to find them.")


def band_acceptance_low(cfg: MonitoringConfig) -> Alert:
    """α of a (workload, temperature band) from the tap's exact counters, proven below the page threshold: the
    tap counts the band's requests, so the variance is k̄(¼ − s²)/D + s²/N with D drafted tokens in N requests
    (k̄, tokens per draft, the model's)."""
    name, threshold = "SpecDecodeBandAcceptanceLow", cfg.thresholds.page_acceptance_ratio
    w, level, dispersion = cfg.window(cfg.alert(name).window or "long"), cfg.alert_level, cfg.statistics.dispersion
    band_on = f"on ({by((*cfg.level_labels(), *BAND_LABELS))})"
    alpha, requests = band_record(cfg, REQUEST_ACCEPTANCE), requests_record(cfg, f"{level}_band")
    drafted = record_name(f"{level}_band", m.REQUEST_DRAFT_TOKENS.name, f"sampled_increase{w}")
    model_drafted = record_name(level, m.DRAFT_TOKENS.name, f"rate{w}")
    model_drafts = record_name(level, m.DRAFTS.name, f"rate{w}")
    # Without the model's drafts counter, k̄ ≤ D/N (a request's tokens all falling together): (¼ − s²)/N.
    within = (f"({fmt_num(dispersion.per_draft_token)} * ({model_drafted} / {model_drafts})\n"
              f"/ on ({by(cfg.level_labels())}) group_right\n{drafted}\n"
              f"or\n{fmt_num(dispersion.per_draft_token)} / {requests})")
    variance = f"{within}\n+ {fmt_num(cfg.statistics.request_acceptance_sd ** 2)} / {requests}"
    return Alert(
        name,
        f"{alpha} < {fmt_num(threshold)}\nand {band_on}\n{requests} >= {fmt_num(cfg.statistics.min_requests)}\n"
        f"and {band_on}\n({fmt_num(threshold)} - {alpha})\n/ sqrt(\n{variance}\n)\n> {ticket_z(cfg, w):.2f}",
        "Requests of {{ $labels.model_name }} in workload {{ $labels.workload }}, temperature "
        "{{ $labels.temperature }} accept below " f"{threshold:.0%}",
        f"Over the last {w}, the requests of {WHERE} with workload {{{{ $labels.workload }}}} and temperature band "
        f"{{{{ $labels.temperature }}}} accepted {PCT} of their drafted tokens (page threshold {threshold:.0%}, "
        "exact from the request tap's counters), and they are enough to prove it: speculative decoding slows these "
        "requests down. Route them to replicas without spec decode, or lower k.")


ROUTE_CLASS_LABELS = stage.ROUTE_CLASS_LABELS


def class_routed(cfg: MonitoringConfig) -> Alert:
    name = "SpecDecodeClassRouted"
    w = cfg.window(cfg.alert(name).window or "long")
    labels = by((*cfg.level_labels(), *ROUTE_CLASS_LABELS))
    state = selector(m.ROUTE_CLASS_STATE.name, cfg.metric_selector)
    routed_for = cfg.alert(name).for_
    return Alert(
        name,
        f"max by ({labels}) ({state}) == 1\nand on ({labels})\n"
        f"sum by ({labels}) ({stage.rate(cfg, 'route_requests', w)}) > 0",
        "Requests of {{ $labels.model_name }} in workload {{ $labels.workload }}, temperature "
        "{{ $labels.temperature }} are routed away from speculative decoding",
        f"For {routed_for} the request tap has sent the requests of {WHERE} with workload "
        "{{ $labels.workload }} and temperature band {{ $labels.temperature }}{{ with $labels.prompt_length }} "
        "(prompts of {{ . }} tokens){{ end }} to the pool without speculative decoding: a block of them showed α "
        "below the break-even, and the canary has not shown it above since. Users are not slowed down, but the "
        "draft model does not fit this traffic: it needs attention (another draft or method, a lower k, a draft "
        "trained on this workload).")


def _series_labels(cfg: MonitoringConfig) -> tuple[str, ...]:
    """One engine of one target: the alert level's labels, the target's and the engine."""
    return tuple(dict.fromkeys((*cfg.level_labels(), *cfg.target_labels, "model_name", "engine")))


def speculation_stopped(cfg: MonitoringConfig) -> Alert:
    name, settings = "SpecDecodeSpeculationStopped", cfg.speculation_stopped
    w = cfg.window(cfg.alert(name).window or "short")
    scope = Scope(cfg.metric_selector, _series_labels(cfg))
    on = f"on ({scope.by_clause})"
    generated = stage.rate(cfg, "series_generated", w)
    share = guarded_ratio(stage.rate(cfg, "series_emitted", w), generated)
    drafted = stage.rate(cfg, "series_drafted", w)
    speculated = f"max by ({scope.by_clause}) ({selector(m.DRAFT_TOKENS.exposed_name, cfg.metric_selector)}) > 0"
    args = [f"$labels.{label}" for label in scope.by]
    series_match = ", ".join(f"{label}=%q" for label in scope.by)
    rate_now = query_value(f"sum(rate({m.GENERATED_TOKENS.exposed_name}{{{series_match}}}[{w}]))",
                           'printf "%.0f"', *args)
    # A source without an emitted-token count (TensorRT-LLM) stops when it drafts nothing while it generates.
    return Alert(
        name,
        f"(\n({share}) < {fmt_num(settings.share_below)}\nor\n{drafted} == 0\n)\n"
        f"and {on}\n{generated} >= {fmt_num(settings.min_generated_tokens_per_second)}\nand {on}\n{speculated}",
        "{{ $labels.target }} stopped speculating while it still generates ({{ $labels.model_name }})",
        f"Over the last {w}, target {{{{ $labels.target }}}} (engine {{{{ $labels.engine }}}}) of {WHERE} generated "
        f"{rate_now} tokens/s, of which speculative steps produced {PCT} (threshold "
        f"{settings.share_below:.0%}), though it drafted before. Speculation stopped without an error: an acceptance "
        "gate (TensorRT-LLM switches it off for good once the mean acceptance rate over "
        "acceptance_rate_window_size iterations is below acceptance_rate_threshold), a batch-size schedule at "
        "k = 0 (vLLM's num_speculative_tokens_per_batch_size), a drafter that finds nothing (ngram), or a config "
        "change. The acceptance alerts are blind meanwhile: no drafts, no α.")


def preemptions_raised(cfg: MonitoringConfig) -> Alert:
    name, bound = "SpecDecodePreemptionsRaised", cfg.cost_vs_control.max_preemptions_per_request_increase
    w = cfg.window(cfg.alert(name).window or "long")
    record = capacity_record(cfg, "specdecode_preemptions_per_request", "ratio_rate")
    model_match, model_args = _model_query(cfg)
    control = query_value(f"{record}{{spec_decode='false', {model_match}}}", 'printf "%.3f"', *model_args)
    return Alert(
        name, f'{record}{{spec_decode="true"}}\n- ignoring (spec_decode)\n{record}{{spec_decode="false"}}\n'
              f"> {fmt_num(bound)}",
        "Speculative decoding makes {{ $labels.model_name }} preempt more requests than its control pods",
        f"Over the last {w}, the spec-decode pods of {WHERE} preempted {{{{ $value | printf \"%.3f\" }}}} more "
        f"requests per finished request than its control pods (the same model with spec decode off; they preempted "
        f"{control}; bound {bound:g}): the draft model and its KV cache take memory the batch needs. A latency "
        "win at this cost is not paying off.", guard_window=w, guard="requests")


def throughput_cut(cfg: MonitoringConfig) -> Alert:
    name, costs = "SpecDecodeThroughputCut", cfg.cost_vs_control
    w = cfg.window(cfg.alert(name).window or "long")
    record = capacity_record(cfg, "specdecode_generated_tokens_per_second", "avg_rate")
    scope = Scope(cfg.metric_selector, cfg.level_labels())
    return Alert(
        name,
        f'{record}{{spec_decode="true"}}\n/ ignoring (spec_decode)\n({record}{{spec_decode="false"}} > 0)\n'
        f"< {fmt_num(costs.min_throughput_ratio)}\nand on ({by(cfg.level_labels())})\n"
        f"{spec_pods_waiting(scope, cfg.sidecar_alert_window)} >= {fmt_num(costs.min_waiting_requests)}",
        "Speculative decoding cuts the throughput of {{ $labels.model_name }}'s pods",
        f"Over the last {w}, each spec-decode engine of {WHERE} generated {{{{ $value | humanizePercentage }}}} of "
        f"the tokens per second of a control engine (the same model with spec decode off; bound "
        f"{costs.min_throughput_ratio:.0%}) while requests waited on it (at least {costs.min_waiting_requests:g} on "
        "average): it runs at its capacity, and that capacity is lower. Faster tokens per request do not make up "
        "for fewer requests served.", guard_window=w, guard="requests")


def dispersion_above_assumed(cfg: MonitoringConfig) -> Alert:
    """The measured variance per drafted token (the tap's requests over the long window) above the configured bound
    the page assumes where it measures none: there the stated false-page rate no longer holds."""
    name, stats = "SpecDecodeDispersionAboveAssumed", cfg.statistics
    dispersion, w, level = stats.dispersion, cfg.long_window, cfg.alert_level
    drafted, drafts = (record_name(level, spec.name, f"rate{w}") for spec in (m.DRAFT_TOKENS, m.DRAFTS))
    assumed = (f"({fmt_num(dispersion.per_draft_token)} * ({drafted} / {drafts} or {drafted} * 0 + "
               f"{fmt_num(dispersion.tokens_per_request)}) + {fmt_num(dispersion.per_request)})")
    on = f"\nand on ({by(cfg.level_labels())})\n"
    return Alert(
        name, f"{variance_record(cfg, 'estimate')}\n> on ({by(cfg.level_labels())})\n{assumed}"
              f"{on}{tapped_requests_record(cfg)} >= {fmt_num(stats.min_requests)}",
        "Requests of {{ $labels.model_name }} scatter more than the page assumes",
        f"Over the last {w}, the acceptance of {WHERE}'s tapped requests varied by {{{{ $value | printf \"%.2f\" }}}} "
        f"per drafted token, above the {fmt_num(stats.draft_tokens_per_request)} drafted tokens per request and sd "
        f"{fmt_num(stats.request_acceptance_sd)} the page assumes where it measures none (statistics in the "
        "monitoring config): where the tap has too few requests, the page's stated false-page rate does not hold. "
        "Set draft_tokens_per_request and request_acceptance_sd from the measured figures (the runbook says how).")


# The alert table: one entry per alert, in the order of the rules file. A new alert is a function above,
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


def runbook_url(cfg: MonitoringConfig, alert: str) -> str:
    return f"{cfg.runbook_base_url.rstrip('/')}/alerts/runbook.md#{alert.lower()}"


def _traffic_guard(cfg: MonitoringConfig, alert: Alert) -> str:
    assert alert.guard_window is not None
    if alert.guard == "requests":
        requests = stage.rate(cfg, "tpot_count", alert.guard_window, 'spec_decode="true"')
        return f"sum by ({by(cfg.level_labels())}) ({requests}) * 3600 >= {fmt_num(cfg.min_requests_per_hour)}"
    traffic = record_name(cfg.alert_level, m.DRAFT_TOKENS.name, f"rate{alert.guard_window}")
    return f"{traffic} >= {fmt_num(cfg.min_draft_tokens_per_second)}"


def finish(alert: Alert, cfg: MonitoringConfig) -> Rule:
    """The pass over every alert: the low-traffic guard where it has one, for:, severity and extra labels, runbook
    link."""
    if not alert.name.startswith(ALERT_NAME_PREFIX):
        raise ValueError(f"alert {alert.name}: names start with {ALERT_NAME_PREFIX}")
    settings = cfg.alert(alert.name)
    expr = alert.expr
    if alert.guard_window is not None:
        expr += f"\nand on ({by(cfg.level_labels())})\n{_traffic_guard(cfg, alert)}"
    return {
        "alert": alert.name,
        "expr": expr,
        "for": settings.for_,
        "labels": {"severity": settings.severity, **dict(cfg.extra_alert_labels)},
        "annotations": {"summary": alert.summary, "description": alert.description,
                        "runbook_url": runbook_url(cfg, alert.name)},
    }


PAGE_GROUP = "specdecode.alerts"
TICKETS_GROUP = "specdecode.alerts.tickets"


def alert_groups(cfg: MonitoringConfig) -> list[dict[str, Any]]:
    """The page in a group of its own, evaluated every statistics.evaluation_interval: its false-page budget counts
    those evaluations and its delay is what it promises. Every other alert (tickets and context, `for:` of minutes to
    hours) with the window groups, every windows.evaluation_interval: at a fleet's size they are most of the alert
    groups' cost (their instant reads of the sidecars' per-pod gauges; bench.fleet_steady) and a minute more on a
    15-minute wait changes nothing. Their bars (ticket_z) still count an evaluation every
    statistics.evaluation_interval: fewer evaluations hold the same budget with room."""
    finished = [finish(make(cfg), cfg) for make in ALERTS]
    return [{"name": PAGE_GROUP, "interval": cfg.statistics.evaluation_interval,
             "rules": [r for r in finished if r["alert"] == PAGE]},
            {"name": TICKETS_GROUP, **window_interval(cfg), "rules": [r for r in finished if r["alert"] != PAGE]}]


def rule_groups(cfg: MonitoringConfig) -> dict[str, Any]:
    return {"groups": [*recording_groups(cfg), *alert_groups(cfg)]}
