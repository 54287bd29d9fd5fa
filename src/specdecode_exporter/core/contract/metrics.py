"""The exported metric contract (docs/architecture.md, "What the sidecar exports") as data: the collector, the
metric reference (docs/metrics.md) and the golden-file test all read this one table."""

from __future__ import annotations

from dataclasses import dataclass

from specdecode_exporter.core.contract.buckets import (
    ACCEPTANCE_RATIO_BUCKETS as ACCEPTANCE_RATIO_BUCKETS,  # re-exported
)

# Every windowed metric's HELP says it comes from the sidecar's own collections (docs/architecture.md, "Its own
# collection timer") in this short form; the reference (docs/metrics.md) explains it with WINDOWED_NOTE.
WINDOWED_HELP = " (from the sidecar's own collections)."
WINDOWED_NOTE = ("A windowed metric is computed by the sidecar from its own collections (every --collect.interval), "
                 "not at scrape time.")
SERIES_LABELS = ("target", "model_name", "engine")
# The batch-size ranges of the schedule advice (label batch_size="1-4", …): fixed, so a dashboard and a rule can
# name them; the last one also takes every larger batch (vLLM uses its last entry's k above it as well).
BATCH_SIZE_RANGES: tuple[tuple[int, int], ...] = ((1, 4), (5, 16), (17, 64), (65, 256), (257, 1024))


def batch_size_label(low: int, high: int) -> str:
    return f"{low}-{high}"


def quantile_name(q: float) -> str:
    """0.1 -> p10, 0.5 -> p50, 0.999 -> p99_9."""
    text = f"{q * 100:.6f}".rstrip("0").rstrip(".")
    return "p" + text.replace(".", "_")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # the family name; counters are exposed with a _total suffix
    type: str  # gauge, counter, histogram, info-style gauge
    help: str  # the HELP on /metrics: one sentence, at most 120 characters
    labels: tuple[str, ...]  # labels beyond the static ones from config
    detail: str = ""  # the long description, shown in docs/metrics.md only; empty where the help says it all

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.type == "counter" else self.name


def _windowed(name: str, help_text: str, extra: tuple[str, ...] = (), detail: str = "") -> MetricSpec:
    """A gauge over each window; ``help_text`` without its full stop (WINDOWED_HELP ends the sentence)."""
    return MetricSpec(name, "gauge", help_text + WINDOWED_HELP, (*SERIES_LABELS, "window", *extra), detail)


UP = MetricSpec("specdecode_up", "gauge", "1 if the last collection of the target succeeded, else 0.", ("target",))
COLLECT_DURATION = MetricSpec(
    "specdecode_collect_duration_seconds", "gauge", "Duration of the last collection of the target.", ("target",)
)
COLLECT_ERRORS = MetricSpec(
    "specdecode_collect_errors", "counter",
    "Failed collections by reason: connect, timeout, http_status, too_large, parse, no_spec_metrics, "
    "no_latency_metrics.",
    ("target", "reason"),
)
INFO = MetricSpec(
    "specdecode_info", "gauge",
    "Always 1, labelled with the source's metrics dialect (api), speculative method and speculative tokens k.",
    (*SERIES_LABELS, "api", "method", "num_speculative_tokens"),
    detail="Always 1: the metrics dialect of the source (api), the speculative method (from config; vLLM does not "
    "export it) and the number of speculative tokens k (from config or inferred).",
)
DRAFTS = MetricSpec(
    "specdecode_drafts", "counter",
    "Verification steps that carried a draft (one per request per step), reset-safe across vLLM restarts.",
    SERIES_LABELS,
)
DRAFT_TOKENS = MetricSpec(
    "specdecode_draft_tokens", "counter", "Drafted tokens, reset-safe across vLLM restarts.", SERIES_LABELS
)
ACCEPTED_TOKENS = MetricSpec(
    "specdecode_accepted_tokens", "counter",
    "Accepted draft tokens (accepted prefix, bonus token excluded), reset-safe across vLLM restarts.",
    SERIES_LABELS,
)
EMITTED_TOKENS = MetricSpec(
    "specdecode_emitted_tokens", "counter",
    "Tokens emitted by verification steps (accepted prefix plus one target token per draft), reset-safe.",
    SERIES_LABELS,
)
ACCEPTED_BY_POSITION = MetricSpec(
    "specdecode_accepted_tokens_by_position", "counter",
    "Drafts whose accepted prefix is longer than position (0-based), reset-safe.",
    (*SERIES_LABELS, "position"),
)
ACCEPTANCE_RATIO = _windowed(
    "specdecode_acceptance_ratio",
    "Draft acceptance rate α over the window, accepted / drafted tokens",
    detail="Draft acceptance rate α over the window: accepted / drafted tokens. Absent when the window had no "
    "drafts.",
)
PROPOSED_TOKEN_ACCEPTANCE_RATIO = _windowed(
    "specdecode_proposed_token_acceptance_ratio",
    "Accepted per proposed draft token, a lower bound of α under adaptive verification",
    detail="Accepted per proposed draft token over the window (accepted / vLLM's drafted-token count), for a vLLM "
    "target declared with adaptive verification that exports no verified-token counter: that count is the proposed "
    "tokens (trimmed ones surface as rejections) or, in some builds, the verified ones, so this is a lower bound "
    "of α, not α; specdecode_acceptance_ratio is absent there. Never paged on.",
)
MEAN_ACCEPTANCE_LENGTH = _windowed(
    "specdecode_mean_acceptance_length",
    "Tokens per verification step over the window, 1 + accepted / drafts",
    detail="Tokens produced per verification step over the window: 1 + accepted / drafts (vLLM's definition).",
)
POSITION_ACCEPTANCE_RATIO = _windowed(
    "specdecode_position_acceptance_ratio",
    "Share of drafts whose accepted prefix is longer than position, over the window",
    ("position",),
    detail="Share of drafts whose accepted prefix is longer than position, over the window: among the drafts that "
    "reached the position where the engine counts drafted tokens per position (TensorRT-LLM), else among all "
    "drafts; absent when the draft length varies and the engine counts no drafted tokens per position.",
)
MEAN_DRAFT_LENGTH = _windowed(
    "specdecode_mean_draft_length",
    "Drafted tokens per draft k̄ over the window, measured, never assumed equal to k",
    detail="Drafted tokens per draft over the window (k̄), measured from the engine's counters (drafts, or drafted "
    "tokens per position), never assumed equal to k: below k when a batch-size schedule, adaptive verification "
    "or a short lookup drafts fewer tokens. Absent where the engine counts no drafts.",
)
TOKEN_ACCEPTANCE_PROBABILITY = _windowed(
    "specdecode_token_acceptance_probability",
    "Leviathan's i.i.d. per-token acceptance probability fitted over the window, not α",
    detail="Leviathan et al.'s per-token acceptance probability (i.i.d. model) fitted over the window; not α.",
)
DRAFT_TOKENS_PER_SECOND = _windowed(
    "specdecode_draft_tokens_per_second", "Drafted tokens per second over the window"
)
ACCEPTED_TOKENS_PER_SECOND = _windowed(
    "specdecode_accepted_tokens_per_second", "Accepted draft tokens per second over the window"
)
EXPECTED_SPEEDUP = _windowed(
    "specdecode_expected_speedup",
    "Modelled speedup over plain decoding, below 1 when spec decode does not pay off",
    detail="Modelled speedup over plain decoding: mean acceptance length / (1 + k̄_proposed·c_draft + "
    "k̄_verified·c_verify), k̄ measured (k where the engine counts no drafts); below 1 spec decode costs more "
    "than it saves.",
)
EXPECTED_SPEEDUP_BY_LENGTH = _windowed(
    "specdecode_expected_speedup_by_length",
    "Modelled speedup for each num_speculative_tokens, from the per-position curve",
    ("num_speculative_tokens",),
    detail="Modelled speedup had vLLM drafted num_speculative_tokens tokens, from the per-position curve.",
)
RECOMMENDED_K = _windowed(
    "specdecode_recommended_num_speculative_tokens",
    "Speculative tokens k with the highest modelled speedup, 0 for plain decoding",
    detail="The number of speculative tokens with the highest modelled speedup (a shorter one only if at least 2 % "
    "faster than the current); 0 means plain decoding would be faster. Under the calibrated cost where a "
    "baseline gives one, else the configured.",
)
BREAK_EVEN = MetricSpec(
    "specdecode_break_even_acceptance_ratio", "gauge",
    "α below which spec decode costs more than it saves, configured or calibrated (cost_basis), capped at 1.",
    (*SERIES_LABELS, "cost_basis"),
    detail="α below which spec decode costs more than it saves: the cost per drafted token, c_draft + c_verify, as "
    "configured (cost_basis=configured, always) and, where a baseline gives an observed speedup, calibrated "
    "to it over the verdict window (cost_basis=calibrated; the one in force where present). Capped at 1: a "
    "cost above 1 means no acceptance rate pays off.",
)
BREAK_EVEN_AT_LOAD = _windowed(
    "specdecode_break_even_acceptance_ratio_at_load",
    "Break-even α at the window's mean running batch, from a model of load",
    detail="Break-even α at the window's mean running batch: the configured cost model with c_verify grown toward "
    "c_verify_max as the batch nears saturating_batch (a model of load, not a measurement); capped at 1.",
)
SPECULATIVE_TOKEN_SHARE = _windowed(
    "specdecode_speculative_token_share",
    "Share of the generated tokens that speculative steps produced over the window",
    detail="Share of the generated tokens that speculative steps produced over the window: (drafts + accepted "
    "tokens) / generated tokens. 1 while every step speculates, 0 when speculation stopped while generation goes "
    "on (an acceptance gate, a batch-size schedule at k = 0, a drafter that finds nothing); absent without "
    "generation.",
)
RECOMMENDED_K_BY_BATCH_SIZE = _windowed(
    "specdecode_recommended_num_speculative_tokens_by_batch_size",
    "Speculative tokens k with the highest modelled speedup in each batch-size range",
    ("batch_size",),
    detail="The number of speculative tokens with the highest modelled speedup in each batch-size range (running "
    "requests of the engine): the per-position acceptance seen at that batch size (all batch sizes where it was "
    "rarely seen) under the cost model at that batch (c_verify grown toward c_verify_max, shifted by the "
    "calibration to the observed speedup where there is one). Never above the current k, never longer for a "
    "larger batch; 0: plain decoding. vLLM's num_speculative_tokens_per_batch_size, TensorRT-LLM's "
    "draft_len_schedule.",
)
EXPECTED_SPEEDUP_BY_BATCH_SIZE = _windowed(
    "specdecode_expected_speedup_by_batch_size",
    "Modelled speedup in each batch-size range with today's k or the recommended one",
    ("batch_size", "schedule"),
    detail="Modelled speedup over plain decoding in each batch-size range: schedule=fixed with today's k, "
    "schedule=recommended with the recommended k of that range.",
)
SCHEDULE_EXPECTED_GAIN = _windowed(
    "specdecode_batch_size_schedule_expected_gain",
    "Modelled throughput of the recommended batch-size schedule over today's fixed k",
    detail="Modelled tokens per unit of time of the recommended batch-size schedule over today's fixed k, each "
    "range weighted by the time the engine spent at that batch size over the window (1.05: 5 % more). Absent "
    "without running-batch data.",
)
TIME_PER_OUTPUT_TOKEN = _windowed(
    "specdecode_time_per_output_token_seconds",
    "Time per output token by statistic, from vLLM's per-request histogram",
    ("statistic",),
    detail="Time per output token over the window, from vLLM's per-request histogram (each finished request's "
    "decode time / (tokens − 1)): statistic=mean is exact (_sum/_count), p50/p90/p99 are interpolated within its "
    "buckets as histogram_quantile does. Not inter-token latency, which under spec decode is one engine step "
    "(1…k+1 tokens).",
)
TIME_PER_OUTPUT_TOKEN_TAIL = _windowed(
    "specdecode_time_per_output_token_tail_ratio",
    "P99 / P50 of time per output token over the window",
    detail="P99 / P50 of time per output token over the window: how much longer the slowest requests' tokens take.",
)
TIME_TO_FIRST_TOKEN = _windowed(
    "specdecode_time_to_first_token_seconds",
    "Time to first token over the window by statistic, from vLLM's histogram",
    ("statistic",),
    detail="Time to first token over the window (statistic p50, p99), from vLLM's histogram; spec decode does not "
    "speed it up.",
)
REQUESTS_RUNNING = _windowed(
    "specdecode_requests_running", "Mean number of requests in vLLM's running batch over the window"
)
REQUESTS_WAITING = _windowed(
    "specdecode_requests_waiting", "Mean number of requests waiting in vLLM's queue over the window"
)
OBSERVED_SPEEDUP = _windowed(
    "specdecode_observed_speedup",
    "Measured speedup, baseline TPOT / current TPOT over the window",
    ("statistic",),
    detail="Measured speedup: baseline TPOT / current TPOT over the window (statistic=mean exact from _sum/_count; "
    "p50, p99 from the histograms). Absent without a baseline (a control target or configured figures) or "
    "without requests. p99 below 1 while p50 is above 1 is a tail regression.",
)
CALIBRATED_COST = _windowed(
    "specdecode_calibrated_cost_per_draft_token",
    "Cost per drafted token that makes the modelled speedup equal the observed one",
    detail="The cost per drafted token c = c_draft + c_verify that makes the modelled speedup L / (1 + k̄·c) equal "
    "the observed mean speedup over the window: the break-even α measured rather than assumed.",
)
REQUEST_TPOT = MetricSpec(
    "specdecode_request_time_per_output_token_seconds", "histogram",
    "vLLM's per-request time-per-output-token histogram, reset-safe, marked spec_decode=true|false.",
    (*SERIES_LABELS, "spec_decode"),
    detail="vLLM's per-request time-per-output-token histogram, reset-safe across vLLM restarts, marked with "
    "spec_decode=true|false (a control target) so recording rules can compare the two across pods.",
)
GENERATED_TOKENS = MetricSpec(
    "specdecode_generated_tokens", "counter",
    "Tokens the engine generated (vLLM's generation_tokens_total), reset-safe, marked spec_decode=true|false.",
    (*SERIES_LABELS, "spec_decode"),
    detail="Tokens the engine generated (vLLM's generation_tokens_total), reset-safe, marked spec_decode=true|false "
    "(a control target): with the emitted tokens, the speculative token share; per pod, the throughput against the "
    "control pods.",
)
PREEMPTIONS = MetricSpec(
    "specdecode_preemptions", "counter",
    "Requests the engine preempted for want of KV-cache blocks, reset-safe, marked spec_decode=true|false.",
    (*SERIES_LABELS, "spec_decode"),
    detail="Requests the engine preempted for want of KV-cache blocks (vLLM's num_preemptions_total), reset-safe, "
    "marked spec_decode=true|false: spec decode's memory cost, against the control pods.",
)
KV_CACHE_USAGE = MetricSpec(
    "specdecode_kv_cache_usage_ratio", "gauge",
    "The engine's KV-cache usage at the last collection (1 = full), marked spec_decode=true|false.",
    (*SERIES_LABELS, "spec_decode"),
    detail="The engine's KV-cache usage at the last collection (vLLM's kv_cache_usage_perc, 1 = full), marked "
    "spec_decode=true|false.",
)
SCHEDULED_STEPS = MetricSpec(
    "specdecode_scheduled_steps", "counter",
    "Scheduler steps by the speculative tokens a batch-size schedule chose for them (0 included), reset-safe.",
    (*SERIES_LABELS, "num_speculative_tokens"),
    detail="Scheduler steps by the number of speculative tokens a batch-size schedule chose for them, 0 included "
    "(vLLM's proposed vllm:spec_decode_scheduled_steps, vllm#54748), reset-safe; where the engine exports it.",
)
ENGINE_REQUEST_ACCEPTANCE = MetricSpec(
    "specdecode_engine_request_acceptance_ratio", "histogram",
    "The engine's own histogram of per-request α, re-exported reset-safe with its own buckets.",
    SERIES_LABELS,
    detail="The engine's own histogram of per-request α, where it exports one (vLLM's proposed "
    "vllm:request_spec_decode_acceptance_rate), re-exported reset-safe with its own buckets: the per-request "
    "distribution without the request tap, per model and engine only (no workload or temperature).",
)
BASELINE_INFO = MetricSpec(
    "specdecode_baseline_info", "gauge",
    "Always 1 for a target in a latency comparison, role speculative (with its baseline) or control.",
    ("target", "role", "baseline"),
    detail="Always 1 for a target whose latency takes part in a comparison: role=speculative (it has a baseline: "
    "baseline=the control target's name, or measured) or role=control (spec decode off).",
)
INTERVAL_ACCEPTANCE = MetricSpec(
    "specdecode_interval_acceptance_ratio", "histogram",
    "α of each collection interval that carried drafts, one observation per interval" + WINDOWED_HELP,
    SERIES_LABELS,
)
VERDICT = MetricSpec(
    "specdecode_verdict", "gauge",
    "Always 1, for the verdict in force over the verdict window, observed or modelled (basis).",
    (*SERIES_LABELS, "window", "verdict", "basis"),
    detail="Always 1, for the verdict in force (paying off, marginal, hurting, not speculating, no traffic) over the "
    "verdict window (monitoring config windows.verdict, else the next longer one with data, else the longest with "
    "data); basis: observed (against a baseline) or modelled (the cost model). A new band verdict takes over once it "
    "has held verdict.hold, or passes a band edge by verdict.margin; absent while the target's windows are stale.",
)
TAP_LABELS = ("target", "model_name", "workload", "temperature")
# The per-request histograms are per model unless tap.class_histograms adds the class labels (series per pod).
REQUEST_HISTOGRAM_LABELS = ("target", "model_name")
FIXED_BUCKETS_NOTE = " Fixed bucket bounds, so docs/series.md counts their series."
REQUEST_ACCEPTANCE = MetricSpec(
    "specdecode_request_acceptance_ratio", "histogram",
    "Per-request α from the request tap, per model (and by class with tap.class_histograms).",
    REQUEST_HISTOGRAM_LABELS,
    detail="Per-request α from the request tap (vLLM's per-request metrics: accepted / drafted tokens of one "
    "request), per model: the distribution the aggregate counters hide. With tap.class_histograms "
    "(--tap.class-histograms) by workload and temperature band too (labels workload, temperature; the same "
    "family, so sum by model_name reads it either way)." + FIXED_BUCKETS_NOTE,
)
REQUEST_MEAN_LENGTH = MetricSpec(
    "specdecode_request_mean_acceptance_length", "histogram",
    "Per-request mean acceptance length from the request tap, per model (and by class with tap.class_histograms).",
    REQUEST_HISTOGRAM_LABELS,
    detail="Per-request mean acceptance length from the request tap (1 + accepted / verification steps), per model; "
    "by workload and temperature band too with tap.class_histograms." + FIXED_BUCKETS_NOTE,
)
REQUESTS = MetricSpec(
    "specdecode_requests", "counter",
    "Completion requests through the request tap that carried spec-decode metrics.", TAP_LABELS,
)
REQUEST_DRAFT_TOKENS = MetricSpec(
    "specdecode_request_draft_tokens", "counter",
    "Drafted tokens of the requests through the tap, by workload and temperature band.", TAP_LABELS,
    detail="Drafted tokens of the requests through the tap: with the accepted counter, α per workload and "
    "temperature band over any window is exact.",
)
REQUEST_ACCEPTED_TOKENS = MetricSpec(
    "specdecode_request_accepted_tokens", "counter", "Accepted draft tokens of the requests through the tap.",
    TAP_LABELS,
)
# The sums behind the measured variance per drafted token (core.stats.dispersion): per model, not per class (the page
# tests a model's pooled α, and three more counters per class would take the default config past its series budget).
MOMENTS_NOTE = (" Per model: with the drafted and accepted counters (summed over the classes) the variance of α per "
                "drafted token over any window and across pods, v = (ΣA² − 2α̂ΣAD + α̂²ΣD²)/ΣD.")
REQUEST_DRAFT_TOKENS_SQUARED = MetricSpec(
    "specdecode_request_draft_tokens_squared", "counter",
    "Σ D² over the requests through the tap (D: a request's drafted tokens), per model.",
    REQUEST_HISTOGRAM_LABELS,
    detail="Σ D² over the requests through the tap (D: a request's drafted tokens)." + MOMENTS_NOTE,
)
REQUEST_ACCEPTED_TOKENS_SQUARED = MetricSpec(
    "specdecode_request_accepted_tokens_squared", "counter",
    "Σ A² over the requests through the tap (A: a request's accepted draft tokens), per model.",
    REQUEST_HISTOGRAM_LABELS,
    detail="Σ A² over the requests through the tap (A: a request's accepted draft tokens)." + MOMENTS_NOTE,
)
REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT = MetricSpec(
    "specdecode_request_accepted_draft_tokens_product", "counter",
    "Σ A·D over the requests through the tap, per model.", REQUEST_HISTOGRAM_LABELS,
    detail="Σ A·D over the requests through the tap." + MOMENTS_NOTE,
)
ACCEPTANCE_VARIANCE = MetricSpec(
    "specdecode_acceptance_variance_per_draft_token", "gauge",
    "Variance of α per drafted token that the page's test divides by, per window, measured or assumed (source).",
    (*REQUEST_HISTOGRAM_LABELS, "window", "source"),
    detail="The variance of α per drafted token the page's test divides by, over each window of the sidecar: source="
    "measured, the upper confidence bound of the tap's requests' v (never below α(1 − α)) once the window holds "
    "statistics.min_requests requests; else source=assumed, the monitoring config's bound k̄(¼ − s²) + m·s² (k̄ "
    "from the requests' verification steps, else m). Computed when scraped, from the tap's sums sampled every 5 s "
    "and at each scrape.",
)
REQUESTS_WITHOUT_SPEC = MetricSpec(
    "specdecode_requests_without_spec_metrics", "counter",
    "Completion requests through the tap without per-request spec-decode metrics, by reason.",
    ("target", "model_name", "reason"),
    detail="Completion requests through the tap without per-request spec-decode metrics, by reason: not_enabled "
    "(start vLLM with --per-request-spec-decode-metrics summary), n_gt_1, multi_prompt, no_usage, http_error, "
    "client_disconnected, upstream_failed, unparsable, withheld (the target declares adaptive_verification), "
    "spec_tokens_details_not_requested (SGLang: the request did not set return_spec_tokens_details: true).",
)
REQUEST_SPEED = MetricSpec(
    "specdecode_request_output_tokens_per_second", "histogram",
    "Per-request generation speed in output tokens per second, by the request's acceptance band.",
    ("target", "model_name", "acceptance"),
    detail="Per-request generation speed (vLLM's tokens_per_second, else output tokens over the streamed "
    "generation) by the request's acceptance band: are the low-α requests the slow ones?",
)
TAP_CONNECTIONS = MetricSpec(
    "specdecode_tap_connections", "gauge", "Client connections the request tap holds open.", ("target",)
)
TAP_BUFFERED_BYTES = MetricSpec(
    "specdecode_tap_buffered_bytes", "gauge",
    "Bytes the request tap holds for slow clients (bounded per stream by backpressure).", ("target",),
)
ROUTE_LABELS = ("target", "model_name", "workload", "temperature")  # and prompt_length, where its bands are set
ROUTE_REQUESTS = MetricSpec(
    "specdecode_route_requests", "counter",
    "Completion requests through a routing tap (tap.route) by where they went (upstream) and why (reason).",
    (*ROUTE_LABELS, "upstream", "reason"),
    detail="Completion requests through a routing tap (tap.route) by where they went (upstream: speculative, "
    "fallback) and why (reason: benefit, the class is routed; canary, the random share of a routed class kept on "
    "speculative decoding; unrouted; fallback_down, meant for the fallback, which refused, did not answer the "
    "connect, closed before answering or failed its health check). In observe mode upstream is where enforce mode "
    "would have sent the request; every request goes to the speculative pool (the x-specdecode-route response "
    "header says where each went). With tap.route.prompt_length_bands a prompt_length label is added to the route "
    "families.",
)
ROUTE_CLASS_STATE = MetricSpec(
    "specdecode_route_class_state", "gauge",
    "1 while the class is routed to the pool without speculative decoding, else 0.",
    ROUTE_LABELS,
    detail="1 while the class is routed to the pool without speculative decoding (a block of its requests showed α "
    "below the break-even in force, one-sided test over requests), 0 once a block of its canary showed α above it.",
)
ROUTE_MEASURED_SPEEDUP = MetricSpec(
    "specdecode_route_measured_speedup", "gauge",
    "A routed class's measured speedup, its latency on the fallback / its canary's, since it was routed.",
    (*ROUTE_LABELS, "latency"),
    detail="A routed class's measured speedup from speculative decoding: mean latency of its requests on the "
    "fallback / mean latency of its canary, a randomized split of the same traffic, since the class was routed "
    "(latency=time_per_output_token: decode time / (tokens − 1), from the responses' timings where both pools "
    "report them, else the tap's clock on streams; latency=end_to_end: request to last byte, the tap's clock). "
    "Below 1 the fallback is faster, as routing assumed. Absent in observe mode and before each side has two "
    "completed requests.",
)
LIFETIME_ACCEPTANCE = MetricSpec(
    "specdecode_lifetime_acceptance_ratio", "gauge",
    "vLLM V0 only: the engine's own lifetime acceptance rate gauge, passed through (since vLLM start, not windowed).",
    SERIES_LABELS,
)
REPORTED_ACCEPTANCE_LENGTH = MetricSpec(
    "specdecode_reported_acceptance_length", "gauge",
    "The engine's own mean acceptance length over its own last reporting window, passed through.",
    SERIES_LABELS,
    detail="The engine's own mean acceptance length over its own last reporting window or iteration (SGLang "
    "spec_accept_length, TensorRT-LLM spec_decode_acceptance_length), passed through: not a window of this "
    "sidecar, never averaged.",
)
REPORTED_ACCEPTANCE_RATIO = MetricSpec(
    "specdecode_reported_acceptance_ratio", "gauge",
    "The engine's own acceptance rate over its own last reporting window, passed through.",
    SERIES_LABELS,
    detail="The engine's own acceptance rate over its own last reporting window (SGLang spec_accept_rate), passed "
    "through: not a window of this sidecar, never averaged, and defined by the engine.",
)
SOURCE_RESTARTS = MetricSpec(
    "specdecode_source_restarts", "counter",
    "vLLM restarts detected from counters that went down or a changed _created.", SERIES_LABELS,
)
DROPPED_SERIES = MetricSpec(
    "specdecode_dropped_series", "counter",
    "Series not tracked because the target exceeded collect.max_series_per_target.", ("target",),
)
BUILD_INFO = MetricSpec(
    "specdecode_exporter_build_info", "gauge", "Always 1: the exporter's version.", ("version", "python_version")
)

CONFIG_RELOAD_SUCCESSFUL = MetricSpec(
    "specdecode_config_last_reload_successful", "gauge",
    "1 if the last configuration reload (SIGHUP or POST /-/reload) succeeded, else 0.", (),
)
CONFIG_RELOAD_TIME = MetricSpec(
    "specdecode_config_last_reload_success_timestamp_seconds", "gauge",
    "Unix time of the last successful configuration load (start or reload).", (),
)

# The tap's families change with every request: they are rendered live on each scrape, not per collection.
TAP: tuple[MetricSpec, ...] = (
    REQUEST_ACCEPTANCE, REQUEST_MEAN_LENGTH, REQUESTS, REQUEST_DRAFT_TOKENS, REQUEST_ACCEPTED_TOKENS,
    REQUEST_DRAFT_TOKENS_SQUARED, REQUEST_ACCEPTED_TOKENS_SQUARED, REQUEST_ACCEPTED_DRAFT_TOKENS_PRODUCT,
    ACCEPTANCE_VARIANCE, REQUESTS_WITHOUT_SPEC, REQUEST_SPEED, TAP_CONNECTIONS, TAP_BUFFERED_BYTES,
)

COLLECTED: tuple[MetricSpec, ...] = (
    UP, COLLECT_DURATION, COLLECT_ERRORS, INFO,
    DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, EMITTED_TOKENS, ACCEPTED_BY_POSITION,
    ACCEPTANCE_RATIO, PROPOSED_TOKEN_ACCEPTANCE_RATIO, MEAN_ACCEPTANCE_LENGTH, MEAN_DRAFT_LENGTH,
    POSITION_ACCEPTANCE_RATIO,
    TOKEN_ACCEPTANCE_PROBABILITY,
    DRAFT_TOKENS_PER_SECOND, ACCEPTED_TOKENS_PER_SECOND, INTERVAL_ACCEPTANCE,
    BREAK_EVEN, EXPECTED_SPEEDUP, EXPECTED_SPEEDUP_BY_LENGTH, RECOMMENDED_K, VERDICT,
    TIME_PER_OUTPUT_TOKEN, TIME_PER_OUTPUT_TOKEN_TAIL, TIME_TO_FIRST_TOKEN, REQUESTS_RUNNING, REQUESTS_WAITING,
    REQUEST_TPOT, ENGINE_REQUEST_ACCEPTANCE, OBSERVED_SPEEDUP, CALIBRATED_COST, BREAK_EVEN_AT_LOAD, BASELINE_INFO,
    SPECULATIVE_TOKEN_SHARE, GENERATED_TOKENS, SCHEDULED_STEPS, PREEMPTIONS, KV_CACHE_USAGE,
    RECOMMENDED_K_BY_BATCH_SIZE, EXPECTED_SPEEDUP_BY_BATCH_SIZE, SCHEDULE_EXPECTED_GAIN,
    LIFETIME_ACCEPTANCE, REPORTED_ACCEPTANCE_LENGTH, REPORTED_ACCEPTANCE_RATIO, SOURCE_RESTARTS, DROPPED_SERIES,
    BUILD_INFO,
)
# Routing's families: rendered live like the tap's, and only by a routing tap (absent, not empty, without one).
ROUTE: tuple[MetricSpec, ...] = (ROUTE_REQUESTS, ROUTE_CLASS_STATE, ROUTE_MEASURED_SPEEDUP)

# Named after Prometheus' own prometheus_config_last_reload_*, so the same alert pattern works.
RELOAD: tuple[MetricSpec, ...] = (CONFIG_RELOAD_SUCCESSFUL, CONFIG_RELOAD_TIME)
CONTRACT: tuple[MetricSpec, ...] = (*COLLECTED, *TAP, *ROUTE, *RELOAD)


def _table_cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_table() -> str:
    """The metric reference of docs/metrics.md, generated from CONTRACT: each family's HELP as /metrics shows it,
    and beside it the detail that only this reference carries."""
    rows = [f"**Windowed metrics.** {WINDOWED_NOTE} Their HELP ends with `{WINDOWED_HELP.strip(' .')}`.", "",
            "| metric | type | labels | help (on /metrics) | detail |", "|---|---|---|---|---|"]
    for spec in CONTRACT:
        labels = ", ".join(f"`{label}`" for label in spec.labels)
        rows.append(f"| `{spec.exposed_name}` | {spec.type} | {labels} | {_table_cell(spec.help)} | "
                    f"{_table_cell(spec.detail)} |")
    return "\n".join(rows)
