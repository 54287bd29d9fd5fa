"""Traffic model: what one vLLM engine produces per second for given live parameters.

Everything here is pure. The simulator integrates these rates over (simulated) time.

Semantics follow vLLM V1 (see docs/architecture.md §3):
- α (acceptance_rate) = accepted draft tokens / drafted tokens;
- per_pos[i] counts drafts whose accepted prefix is longer than i, so accepted = Σ per_pos;
- mean acceptance length = 1 + accepted / drafts (the bonus token is included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from pydantic import BeforeValidator

from specdecode_exporter.core.config.validation import (
    Bool,
    Choice,
    Context,
    Int,
    Number,
    Range,
    Section,
    Text,
    fail,
    show,
)
from specdecode_exporter.pipeline.derive import geometric_prefix_mean, solve_geometric_probability

# Deterministic spread of latency observations around their mean (multiplier, weight): gives histograms
# a believable shape without randomness. Weighted mean is 1.0.
LATENCY_SPREAD: tuple[tuple[float, float], ...] = (
    (0.8, 0.15),
    (0.9, 0.25),
    (1.0, 0.3),
    (1.15, 0.2),
    (1.25, 0.1),
)
PREFILL_SECONDS_PER_TOKEN = 0.00005
KV_CACHE_CAPACITY_TOKENS = 262144
FINISH_REASON_SHARES: tuple[tuple[str, float], ...] = (("stop", 0.85), ("length", 0.15))


Ratio = Annotated[Number, Range(0, 1)]


def _probabilities(value: object) -> object:
    if not isinstance(value, list | tuple) or not value:
        raise fail(f"expected a list of numbers between 0 and 1, got {show(value)}")
    return value


Probabilities = Annotated[tuple[Ratio, ...], BeforeValidator(_probabilities)]


@dataclass(frozen=True)
class Workload(Section):
    """A part of a model's traffic with its own acceptance (a task, a temperature band). In a scenario file, the
    fields of this class (and of ModelSpec) are the keys, their annotations what each accepts."""

    name: Text = "default"
    share: Annotated[Number, Range(0, 1e6)] = 1.0  # of the model's verification steps (background traffic) and of
    # its API requests
    acceptance_rate: Ratio | None = None  # None: the model's (phase, override) α
    temperature: Annotated[Number, Range(0, 2)] = 0.0  # what its requests carry; an API request takes the workload
    # nearest its temperature


def _schedule_entries(value: object) -> object:
    """vLLM's rules for a dynamic-SD schedule (vllm/v1/spec_decode/dynamic/utils.py), 3-item form."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not value:
        raise fail(f"expected a non-empty list of [low, high, k] entries, got {show(value)}")
    previous_high = 0
    for i, entry in enumerate(value):
        if not isinstance(entry, list | tuple) or len(entry) != 3 or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in entry):
            raise fail(f"expected [low, high, k] (integers), got {show(entry)}", i)
        low, high, k = entry
        if not 0 < low <= high or k < 0:
            raise fail(f"expected 0 < low <= high and k >= 0, got {list(entry)}", i)
        if low <= previous_high or (i == 0 and low != 1):
            raise fail("ranges must start at 1 and be sorted and non-overlapping", i)
        previous_high = high
    return [tuple(entry) for entry in value]


def _named_workloads(value: object) -> object:
    """A scenario's workloads: a non-empty list; a workload without a name is called w<index>."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not value:
        raise fail(f"expected a non-empty list of workloads, got {show(value)}")
    return [{"name": f"w{i}", **w} if isinstance(w, Mapping) else w for i, w in enumerate(value)]


# TensorRT-LLM's gate keys before #12905, and what replaced them (the simulator models the gate as it is now).
GATE_KEYS_BEFORE_12905 = {"acceptance_window": "acceptance_rate_window_size",
                          "acceptance_length_threshold": "acceptance_rate_threshold"}


@dataclass(frozen=True)
class ModelSpec(Section):
    """One served model: static shape plus the base (phase-free) traffic parameters."""

    name: Text = "meta-llama/Llama-3.1-8B-Instruct"
    engines: Annotated[Int, Range(1, 1024)] = 1
    num_speculative_tokens: Annotated[Int, Range(1, 64)] = 3
    method: Text = "eagle3"
    drafts_per_second: Annotated[Number, Range(0, 1e7)] = 200.0
    acceptance_rate: Ratio = 0.75
    # Conditional acceptance per position (P(accept i | accepted 0..i-1)); overrides the iid model.
    position_acceptance: Probabilities | None = None
    # Fraction of the k slots actually drafted (< 1 for ngram lookup misses).
    draft_fill: Annotated[Number, Range(0, 1, above=True)] = 1.0
    # Relative noise on rates and acceptance, resampled every simulated second (0 = deterministic).
    noise: Ratio = 0.0
    target_step_seconds: Annotated[Number, Range(1e-6, 60)] = 0.02
    # Extra cost of one drafted token (draft + verification), in plain target steps (docs/architecture.md §5).
    cost_per_draft_token: Annotated[Number, Range(0, 10)] = 0.5
    prompt_tokens: Annotated[Int, Range(1, 10**7)] = 512
    output_tokens: Annotated[Int, Range(1, 10**7)] = 256
    max_num_seqs: Annotated[Int, Range(1, 10**6)] = 256
    spec_decode: Bool = True  # False: a control pod (same model, spec decode off): no spec families, 1 token/step
    # vllm:request_spec_decode_acceptance_rate, a per-request α histogram proposed upstream (vllm#44487): off, as
    # in every vLLM released so far; on, each served API request is one observation
    request_acceptance_histogram: Bool = False
    # A mixed workload; empty: one workload at the model's α.
    workloads: Annotated[tuple[Workload, ...], BeforeValidator(_named_workloads)] = ()
    # API requests at temperature T without a matching workload accept α·(1 − sensitivity·min(T, 1)).
    temperature_sensitivity: Ratio = 0.5
    per_request_spread: Ratio = 0.03  # per-request α ~ N(the workload's α, spread), before sampling noise
    # Load: the step time grows by batch_slowdown per running request, and the verification cost per drafted
    # token grows from cost_per_draft_token to 1 at saturating_batch running requests (0: no growth).
    batch_slowdown: Annotated[Number, Range(0, 10)] = 0.0
    saturating_batch: Annotated[Number, Range(0, 1e6)] = 0.0
    # TensorRT-LLM's acceptance gate as it works since NVIDIA/TensorRT-LLM#12905 (acceptance_rate_window_size,
    # acceptance_rate_threshold): one acceptance-rate sample (accepted / drafted tokens of the batch) per speculation
    # iteration; once the window holds acceptance_rate_window_size samples and their mean is below the threshold,
    # the engine stops speculating for good (until it restarts). 0 / null: no gate. (Older releases' gate averaged
    # the acceptance length of the last acceptance_window finished requests: GATE_KEYS_BEFORE_12905.)
    acceptance_rate_window_size: Annotated[Int, Range(0, 10**9)] = 0
    acceptance_rate_threshold: Ratio | None = None
    # vLLM's dynamic speculative decoding (num_speculative_tokens_per_batch_size, vllm#32374): [low, high, k] per
    # batch-size range of running requests, from 1, non-overlapping; above the last range its k holds; k is capped
    # at num_speculative_tokens; k = 0 steps do not speculate.
    num_speculative_tokens_per_batch_size: Annotated[tuple[tuple[Int, Int, Int], ...],
                                                     BeforeValidator(_schedule_entries)] = ()
    # vllm:spec_decode_scheduled_steps, scheduler steps by the k the schedule chose (proposed upstream, vllm#54748):
    # off, as in every vLLM released so far.
    spec_decode_scheduled_steps: Bool = False
    # vLLM's adaptive verification (enable_adaptive_verification, vllm#47808/#52228): this share of the steps has its
    # draft trimmed to verified_draft_length tokens before verification (independently of what it would accept, a
    # simplification). Which count vllm:spec_decode_num_draft_tokens then carries is not settled by vLLM's source
    # (docs/engines.md), so the simulator serves either: draft_tokens_count proposed (k per step) or verified.
    adaptive_verification_share: Ratio = 0.0
    verified_draft_length: Annotated[Int, Range(0, 64)] = 1
    draft_tokens_count: Annotated[str, Choice("proposed", "verified")] = "proposed"
    # vllm:spec_decode_num_verified_draft_tokens, the draft tokens sent to verification (proposed upstream,
    # vllm#58340): off, as in every vLLM released so far; on, the V1 page serves it beside num_draft_tokens, which
    # then counts the proposed tokens (draft_tokens_count proposed).
    verified_draft_tokens_counter: Bool = False
    # Memory: the KV cache holds this many tokens, less draft_memory_share of it on a spec-decode pod (the draft
    # model's weights and KV); a request holds its prompt, half its output on average, and k lookahead slots while
    # speculating. Requests run while they fit; beyond, they wait, and the excess demand preempts.
    kv_cache_capacity_tokens: Annotated[Int, Range(1, 10**10)] = KV_CACHE_CAPACITY_TOKENS
    draft_memory_share: Annotated[Number, Range(0, 0.99)] = 0.0

    @classmethod
    def check_keys(cls, data: object) -> object:
        if isinstance(data, Mapping):
            for old, new in GATE_KEYS_BEFORE_12905.items():
                if old in data:
                    raise fail(f"TensorRT-LLM's gate is acceptance-rate based since its #12905: use {new} (older "
                               f"releases' {old} averaged the acceptance length over finished requests)", old)
        return super().check_keys(data)

    def cross_check(self, context: Context) -> ModelSpec:
        if len({w.name for w in self.workloads}) != len(self.workloads):
            raise fail("workload names must be distinct", "workloads")
        if (self.acceptance_rate_window_size > 0) != (self.acceptance_rate_threshold is not None):
            raise fail("acceptance_rate_window_size and acceptance_rate_threshold go together (both, or neither)",
                       "acceptance_rate_window_size")
        curve = self.position_acceptance
        if curve is not None and len(curve) != self.num_speculative_tokens:
            raise fail(f"expected {self.num_speculative_tokens} values (one per position, num_speculative_tokens), "
                       f"got {len(curve)}", "position_acceptance")
        problem = curve_problem(curve, self)
        if problem:
            raise fail(problem, "position_acceptance")
        if self.verified_draft_tokens_counter and self.draft_tokens_count == "verified":
            raise fail("expected proposed with verified_draft_tokens_counter (vLLM then counts the proposed tokens "
                       "in num_draft_tokens and the verified ones apart), got verified", "draft_tokens_count")
        if self.adaptive_verification_share and self.verified_draft_length >= self.num_speculative_tokens:
            raise fail(f"expected fewer than num_speculative_tokens ({self.num_speculative_tokens}) tokens, got "
                       f"{self.verified_draft_length}", "verified_draft_length")
        return self


@dataclass(frozen=True)
class LiveParams:
    """Parameters in force right now (model base, then phase, then manual override)."""

    acceptance_rate: float
    drafts_per_second: float
    position_acceptance: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Rates:
    """Per-second production of one engine, plus the latency means that go with it."""

    drafts: float
    draft_tokens: float
    per_pos: tuple[float, ...]
    accepted: float
    generation_tokens: float
    requests: float
    prompt_tokens: float
    step_seconds: float
    tpot_seconds: float  # mean over the workloads, weighted by requests
    tpot_groups: tuple[tuple[float, float], ...]  # (requests per second, TPOT) per workload
    ttft_seconds: float
    e2e_seconds: float
    running: float
    waiting: float
    # V0 counts every accepted token (even after a rejection) and emits prefix + 1 per draft.
    v0_accepted: float
    v0_emitted: float
    steps: float = 0.0  # request-steps that ran (drafted or not): ``drafts`` counts only those with a draft
    k: int = 0  # the k the steps ran with (0: not speculating)
    kv_cache_usage: float = 0.0
    preemptions: float = 0.0  # per second
    verified_draft_tokens: float = 0.0  # per second: draft_tokens less what adaptive verification trimmed


# The simulator draws per-position acceptance from the same i.i.d. model the sidecar fits.
iid_acceptance_sum = geometric_prefix_mean
solve_token_probability = solve_geometric_probability


def cumulative_fractions(conditional: tuple[float, ...]) -> tuple[float, ...]:
    """per_pos[i]/drafts from conditional per-position acceptance: running products."""
    out: list[float] = []
    acc = 1.0
    for c in conditional:
        acc *= c
        out.append(acc)
    return tuple(out)


def curve_problem(curve: tuple[float, ...] | None, spec: ModelSpec) -> str | None:
    """Why a conditional per-position curve cannot drive ``spec`` (None: it can)."""
    if curve is None:
        return None
    if len(curve) != spec.num_speculative_tokens:
        return f"expected {spec.num_speculative_tokens} values for model {spec.name!r}, got {len(curve)}"
    if sum(cumulative_fractions(curve)) > spec.num_speculative_tokens * spec.draft_fill + 1e-9:
        return f"implies more accepted than drafted tokens with draft_fill {spec.draft_fill:g}"
    return None


def position_fractions(acceptance_rate: float, k: int, draft_fill: float = 1.0) -> tuple[float, ...]:
    """per_pos[i]/drafts under the iid model, scaled so Σ equals α·k·fill exactly (α is exact, not ≈)."""
    target = acceptance_rate * k * draft_fill
    p = solve_token_probability(target, k)
    raw = [p ** (i + 1) for i in range(k)]
    total = sum(raw)
    if total <= 0.0:
        return tuple(0.0 for _ in range(k))
    scale = target / total
    return tuple(min(1.0, f * scale) for f in raw)


def effective_acceptance_rate(spec: ModelSpec, fractions: tuple[float, ...]) -> float:
    """α implied by a per-position curve: Σ per_pos / draft tokens per draft."""
    drafted = spec.num_speculative_tokens * spec.draft_fill
    return sum(fractions) / drafted if drafted > 0 else 0.0


def scheduled_k(spec: ModelSpec, running: float) -> int:
    """The k a step runs with: the batch-size schedule's at this batch (vLLM's dense lookup), else the configured."""
    k = spec.num_speculative_tokens
    schedule = spec.num_speculative_tokens_per_batch_size
    if not spec.spec_decode or not schedule:
        return k if spec.spec_decode else 0
    batch = max(1, round(running))
    chosen = next((entry_k for low, high, entry_k in reversed(schedule) if batch >= low), schedule[0][2])
    return min(k, chosen)


def kv_tokens_per_request(spec: ModelSpec, k: int) -> float:
    return spec.prompt_tokens + spec.output_tokens / 2.0 + k


def kv_capacity(spec: ModelSpec) -> float:
    """Tokens the KV cache holds: less on a spec-decode pod, whose draft model takes draft_memory_share of it."""
    return spec.kv_cache_capacity_tokens * (1.0 - spec.draft_memory_share if spec.spec_decode else 1.0)


def running_limit(spec: ModelSpec, k: int) -> float:
    """Requests that can run at once: max_num_seqs, or as many as the KV cache holds."""
    return min(float(spec.max_num_seqs), kv_capacity(spec) / kv_tokens_per_request(spec, k))


def verify_cost(spec: ModelSpec, running: float) -> float:
    """Cost of one drafted token in target steps at a batch of ``running``: the verification pass turns
    compute-bound as the batch grows."""
    if spec.saturating_batch <= 0:
        return spec.cost_per_draft_token
    share = min(1.0, running / spec.saturating_batch)
    return spec.cost_per_draft_token + (max(1.0, spec.cost_per_draft_token) - spec.cost_per_draft_token) * share


def step_seconds(spec: ModelSpec, running: float, k: int | None = None) -> float:
    """One engine step at a batch of ``running``: longer under load, and longer with a draft to verify (of ``k``
    tokens: the configured k unless a schedule chose another)."""
    base = spec.target_step_seconds * (1.0 + spec.batch_slowdown * running)
    k = spec.num_speculative_tokens if k is None else k
    if not spec.spec_decode or k == 0:
        return base
    return base * (1.0 + k * spec.draft_fill * verify_cost(spec, running))


def loaded_step(spec: ModelSpec, steps_per_second: float, k: int | None = None) -> tuple[float, float]:
    """(step seconds, running requests) where they agree: Little's law (one step per running request per step
    time) and the load-dependent step time, by fixed-point iteration; running at most what fits (running_limit)."""
    k = spec.num_speculative_tokens if k is None else k
    limit = running_limit(spec, k)
    running = 0.0
    step = step_seconds(spec, running, k)
    for _ in range(12):
        running = min(steps_per_second * step, limit)
        step = step_seconds(spec, running, k)
    return step, running


def workload_mix(spec: ModelSpec, fractions: tuple[float, ...],
                 k: int | None = None) -> tuple[tuple[float, tuple[float, ...]], ...]:
    """(share of steps, per-position fractions) per workload; the model's own when it has no workloads."""
    if not spec.workloads:
        return ((1.0, fractions),)
    k = spec.num_speculative_tokens if k is None else k
    total = sum(w.share for w in spec.workloads) or 1.0
    return tuple((w.share / total, fractions if w.acceptance_rate is None
                  else position_fractions(w.acceptance_rate, k, spec.draft_fill))
                 for w in spec.workloads)


def step_k(spec: ModelSpec, steps_per_second: float, speculating: bool = True) -> int:
    """The k the engine's steps run with at this load: 0 when it does not speculate (spec decode off, the gate
    closed), else the schedule's at the batch the load makes (taken twice: the step time moves with k)."""
    if not spec.spec_decode or not speculating:
        return 0
    k = spec.num_speculative_tokens
    for _ in range(2):
        k = scheduled_k(spec, loaded_step(spec, steps_per_second, k)[1])
    return k


class Memory(NamedTuple):
    kv_cache_usage: float  # 1 = full
    preemptions_per_request: float
    served_share: float  # of the offered steps that run; the rest wait


def memory(spec: ModelSpec, offered_running: float, k: int) -> Memory:
    """What the offered concurrency (requests that want to run) does to the KV cache: usage, the excess demand's
    preemptions (each 1 % of demand above capacity preempts 0.01 of the requests: a model), and the share that
    runs."""
    per_request = kv_tokens_per_request(spec, k)
    capacity = kv_capacity(spec)
    limit = running_limit(spec, k)
    running = min(offered_running, limit)
    demand = offered_running * per_request / capacity
    return Memory(min(1.0, running * per_request / capacity), min(1.0, max(0.0, demand - 1.0)),
                  running / offered_running if offered_running > 0 else 1.0)


def adaptive_trim(spec: ModelSpec, k: int) -> tuple[float, int]:
    """(share of steps trimmed, tokens they verify) under adaptive verification at a step drafting k; (0, k) without
    it, or when the trim would not shorten the draft."""
    share, verified = spec.adaptive_verification_share, spec.verified_draft_length
    return (share, verified) if share > 0 and verified < k else (0.0, k)


def verified_draft_length(spec: ModelSpec, k: int) -> float:
    """The draft tokens per step sent to verification: k, less what adaptive verification trims."""
    trimmed, verified = adaptive_trim(spec, k)
    return (1.0 - trimmed) * k + trimmed * verified


def counted_draft_length(spec: ModelSpec, k: int) -> float:
    """The draft tokens per step vllm:spec_decode_num_draft_tokens counts: k proposed, or the mean verified."""
    return float(k) if spec.draft_tokens_count == "proposed" else verified_draft_length(spec, k)


def compute_rates(spec: ModelSpec, live: LiveParams, fractions: tuple[float, ...], k: int | None = None) -> Rates:
    """One engine's production per second; ``k``: the k its steps run with (0: not speculating), else the
    configured. Steps beyond what fits in the batch (running_limit) wait instead of running."""
    k_max = spec.num_speculative_tokens
    k = (k_max if spec.spec_decode else 0) if k is None else k
    offered = max(0.0, live.drafts_per_second)  # request-steps per second (verification steps while speculating)
    step, running = loaded_step(spec, offered, k)
    mem = memory(spec, offered * step, k)
    steps = offered * mem.served_share
    speculating = spec.spec_decode and k > 0
    mix = workload_mix(spec, fractions[:k], k) if speculating else ((1.0, (0.0,) * k_max),)
    mixed = tuple(sum(share * f[i] for share, f in mix) for i in range(min(k, k_max)))
    fractions = (mixed if spec.workloads else fractions[:k]) if speculating else ()
    trimmed, verified = adaptive_trim(spec, k)
    fractions = tuple(f * (1.0 - trimmed) if i >= verified else f for i, f in enumerate(fractions))
    per_pos = tuple(steps * f for f in fractions)
    mean_length = 1.0 + sum(fractions)
    groups = tuple((steps * share * (1.0 + sum(f)) / spec.output_tokens, step / (1.0 + sum(f))) for share, f in mix)
    generation = steps * mean_length
    requests = generation / spec.output_tokens
    tpot = sum(n * t for n, t in groups) / requests if requests > 0 else step / mean_length
    ttft = spec.prompt_tokens * PREFILL_SECONDS_PER_TOKEN + step
    alpha_v0 = effective_acceptance_rate(spec, fractions) if speculating else 0.0
    return Rates(
        drafts=steps if speculating or not spec.spec_decode else 0.0,
        draft_tokens=steps * counted_draft_length(spec, k) * spec.draft_fill if speculating else 0.0,
        verified_draft_tokens=steps * verified_draft_length(spec, k) * spec.draft_fill if speculating else 0.0,
        per_pos=per_pos,
        accepted=sum(per_pos),
        generation_tokens=generation,
        requests=requests,
        prompt_tokens=requests * spec.prompt_tokens,
        step_seconds=step,
        tpot_seconds=tpot,
        tpot_groups=groups,
        ttft_seconds=ttft,
        e2e_seconds=ttft + (spec.output_tokens - 1) * tpot,
        running=running,
        waiting=max(0.0, offered * step - running),
        v0_accepted=steps * k_max * alpha_v0,
        v0_emitted=steps * (1.0 + iid_acceptance_sum(alpha_v0, k_max)),
        steps=steps,
        k=k,
        kv_cache_usage=mem.kv_cache_usage,
        preemptions=requests * mem.preemptions_per_request,
    )


def noise_factor(noise: float, gauss: float) -> float:
    """1 + noise·N(0,1), kept positive so rates never turn negative."""
    return max(0.0, 1.0 + noise * gauss) if noise > 0 else 1.0


def scale_fractions(fractions: tuple[float, ...], factor: float) -> tuple[float, ...]:
    """Scale acceptance by a noise factor without letting any position exceed 1 (keeps monotonicity)."""
    if not fractions or factor == 1.0:
        return fractions
    cap = 1.0 / fractions[0] if fractions[0] > 0 else math.inf
    f = min(factor, cap)
    return tuple(min(1.0, x * f) for x in fractions)
