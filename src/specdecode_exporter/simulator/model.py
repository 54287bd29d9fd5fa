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
from typing import Annotated

from pydantic import BeforeValidator

from specdecode_exporter.core.validation import Bool, Context, Int, Number, Range, Section, Text, fail, show
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


def _named_workloads(value: object) -> object:
    """A scenario's workloads: a non-empty list; a workload without a name is called w<index>."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not value:
        raise fail(f"expected a non-empty list of workloads, got {show(value)}")
    return [{"name": f"w{i}", **w} if isinstance(w, Mapping) else w for i, w in enumerate(value)]


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

    def cross_check(self, context: Context) -> ModelSpec:
        if len({w.name for w in self.workloads}) != len(self.workloads):
            raise fail("workload names must be distinct", "workloads")
        curve = self.position_acceptance
        if curve is not None and len(curve) != self.num_speculative_tokens:
            raise fail(f"expected {self.num_speculative_tokens} values (one per position, num_speculative_tokens), "
                       f"got {len(curve)}", "position_acceptance")
        problem = curve_problem(curve, self)
        if problem:
            raise fail(problem, "position_acceptance")
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


def live_fractions(spec: ModelSpec, live: LiveParams) -> tuple[float, ...]:
    if live.position_acceptance is not None:
        return cumulative_fractions(live.position_acceptance)
    return position_fractions(live.acceptance_rate, spec.num_speculative_tokens, spec.draft_fill)


def effective_acceptance_rate(spec: ModelSpec, fractions: tuple[float, ...]) -> float:
    """α implied by a per-position curve: Σ per_pos / draft tokens per draft."""
    drafted = spec.num_speculative_tokens * spec.draft_fill
    return sum(fractions) / drafted if drafted > 0 else 0.0


def verify_cost(spec: ModelSpec, running: float) -> float:
    """Cost of one drafted token in target steps at a batch of ``running``: the verification pass turns
    compute-bound as the batch grows."""
    if spec.saturating_batch <= 0:
        return spec.cost_per_draft_token
    share = min(1.0, running / spec.saturating_batch)
    return spec.cost_per_draft_token + (max(1.0, spec.cost_per_draft_token) - spec.cost_per_draft_token) * share


def step_seconds(spec: ModelSpec, running: float) -> float:
    """One engine step at a batch of ``running``: longer under load, and longer with a draft to verify."""
    base = spec.target_step_seconds * (1.0 + spec.batch_slowdown * running)
    if not spec.spec_decode:
        return base
    return base * (1.0 + spec.num_speculative_tokens * spec.draft_fill * verify_cost(spec, running))


def loaded_step(spec: ModelSpec, steps_per_second: float) -> tuple[float, float]:
    """(step seconds, running requests) where they agree: Little's law (one step per running request per step
    time) and the load-dependent step time, by fixed-point iteration."""
    running = 0.0
    step = step_seconds(spec, running)
    for _ in range(12):
        running = min(steps_per_second * step, float(spec.max_num_seqs))
        step = step_seconds(spec, running)
    return step, running


def workload_mix(spec: ModelSpec, fractions: tuple[float, ...]) -> tuple[tuple[float, tuple[float, ...]], ...]:
    """(share of steps, per-position fractions) per workload; the model's own when it has no workloads."""
    if not spec.workloads:
        return ((1.0, fractions),)
    total = sum(w.share for w in spec.workloads) or 1.0
    return tuple((w.share / total, fractions if w.acceptance_rate is None
                  else position_fractions(w.acceptance_rate, spec.num_speculative_tokens, spec.draft_fill))
                 for w in spec.workloads)


def compute_rates(spec: ModelSpec, live: LiveParams, fractions: tuple[float, ...]) -> Rates:
    k = spec.num_speculative_tokens
    drafts = max(0.0, live.drafts_per_second)  # verification steps per second (engine steps: control pods)
    mix = workload_mix(spec, fractions) if spec.spec_decode else ((1.0, (0.0,) * k),)
    mixed = tuple(sum(share * f[i] for share, f in mix) for i in range(k))
    fractions = mixed if spec.workloads else fractions
    per_pos = tuple(drafts * f for f in fractions) if spec.spec_decode else (0.0,) * k
    accepted = sum(per_pos)
    mean_length = 1.0 + sum(fractions) if spec.spec_decode else 1.0
    step, running = loaded_step(spec, drafts)
    groups = tuple((drafts * share * (1.0 + sum(f)) / spec.output_tokens, step / (1.0 + sum(f))) for share, f in mix)
    generation = drafts * mean_length
    requests = generation / spec.output_tokens
    tpot = sum(n * t for n, t in groups) / requests if requests > 0 else step / mean_length
    ttft = spec.prompt_tokens * PREFILL_SECONDS_PER_TOKEN + step
    in_flight = drafts * step
    alpha_v0 = effective_acceptance_rate(spec, fractions)
    return Rates(
        drafts=drafts,
        draft_tokens=drafts * k * spec.draft_fill if spec.spec_decode else 0.0,
        per_pos=per_pos,
        accepted=accepted,
        generation_tokens=generation,
        requests=requests,
        prompt_tokens=requests * spec.prompt_tokens,
        step_seconds=step,
        tpot_seconds=tpot,
        tpot_groups=groups,
        ttft_seconds=ttft,
        e2e_seconds=ttft + (spec.output_tokens - 1) * tpot,
        running=running,
        waiting=max(0.0, in_flight - running),
        v0_accepted=drafts * k * alpha_v0,
        v0_emitted=drafts * (1.0 + iid_acceptance_sum(alpha_v0, k)),
    )


def kv_cache_usage(spec: ModelSpec, running: float) -> float:
    tokens = running * (spec.prompt_tokens + spec.output_tokens / 2.0)
    return min(1.0, tokens / KV_CACHE_CAPACITY_TOKENS)


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
