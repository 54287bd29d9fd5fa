"""Traffic model: what one vLLM engine produces per second for given live parameters.

Everything here is pure. The simulator integrates these rates over (simulated) time.

Semantics follow vLLM V1 (see docs/architecture.md §3):
- α (acceptance_rate) = accepted draft tokens / drafted tokens;
- per_pos[i] counts drafts whose accepted prefix is longer than i, so accepted = Σ per_pos;
- mean acceptance length = 1 + accepted / drafts (the bonus token is included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exporter.derive import geometric_prefix_mean, solve_geometric_probability

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


@dataclass(frozen=True)
class ModelSpec:
    """One served model: static shape plus the base (phase-free) traffic parameters."""

    name: str = "meta-llama/Llama-3.1-8B-Instruct"
    engines: int = 1
    num_speculative_tokens: int = 3
    method: str = "eagle3"
    drafts_per_second: float = 200.0
    acceptance_rate: float = 0.75
    # Conditional acceptance per position (P(accept i | accepted 0..i-1)); overrides the iid model.
    position_acceptance: tuple[float, ...] | None = None
    # Fraction of the k slots actually drafted (< 1 for ngram lookup misses).
    draft_fill: float = 1.0
    # Relative noise on rates and acceptance, resampled every simulated second (0 = deterministic).
    noise: float = 0.0
    target_step_seconds: float = 0.02
    # Extra cost of one drafted token (draft + verification), in plain target steps (docs/architecture.md §5).
    cost_per_draft_token: float = 0.5
    prompt_tokens: int = 512
    output_tokens: int = 256
    max_num_seqs: int = 256


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
    tpot_seconds: float
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


def compute_rates(spec: ModelSpec, live: LiveParams, fractions: tuple[float, ...]) -> Rates:
    k = spec.num_speculative_tokens
    drafts = max(0.0, live.drafts_per_second)
    per_pos = tuple(drafts * f for f in fractions)
    accepted = sum(per_pos)
    mean_length = 1.0 + sum(fractions)
    step = spec.target_step_seconds * (1.0 + k * spec.draft_fill * spec.cost_per_draft_token)
    tpot = step / mean_length
    generation = drafts * mean_length
    requests = generation / spec.output_tokens
    ttft = spec.prompt_tokens * PREFILL_SECONDS_PER_TOKEN + step
    in_flight = drafts * step  # Little's law: one draft per running request per step
    running = min(in_flight, float(spec.max_num_seqs))
    alpha_v0 = effective_acceptance_rate(spec, fractions)
    return Rates(
        drafts=drafts,
        draft_tokens=drafts * k * spec.draft_fill,
        per_pos=per_pos,
        accepted=accepted,
        generation_tokens=generation,
        requests=requests,
        prompt_tokens=requests * spec.prompt_tokens,
        step_seconds=step,
        tpot_seconds=tpot,
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
