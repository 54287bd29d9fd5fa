"""Pure functions: counts over a window → α, mean acceptance length, per-position curve, Leviathan's
per-token acceptance probability, the break-even cost model and the recommended number of draft tokens.

Every function returns None when its inputs cannot support an answer (no drafts, unknown counts).
The cost model is described in docs/architecture.md ("Break-even model").
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import NamedTuple

from specdecode_exporter.pipeline.store import WindowSpan, optional_minus, positions_minus


@dataclass(frozen=True, slots=True)
class CostModel:
    """Cost of one verification step, in units of one plain target decode step: 1 + k·(c_draft + c_verify)."""

    c_draft: float = 0.1  # one draft token (≈ draft/target parameter ratio; ≈ 0 for ngram)
    c_verify: float = 0.4  # extra verification work per drafted token (0 idle … 1 compute-bound)
    # Under load: c_verify grows linearly with the running batch, to c_verify_max at saturating_batch requests.
    c_verify_max: float = 1.0
    saturating_batch: float = 64.0

    @property
    def per_draft_token(self) -> float:
        return self.c_draft + self.c_verify

    def per_draft_token_at(self, running: float) -> float:
        """Cost per drafted token with ``running`` requests in the batch: the verification pass turns
        compute-bound as the batch grows, so each drafted token's verification costs more."""
        # Conditionals, not min()/max() (this runs per series × window): the same results, NaN included, as
        # max(a, b) is b only when b > a and min(a, b) is b only when b < a.
        saturating, c_verify, c_verify_max = self.saturating_batch, self.c_verify, self.c_verify_max
        if saturating > 0:
            load = (running if running > 0.0 else 0.0) / saturating
            share = load if load < 1.0 else 1.0
        else:
            share = 1.0
        return self.c_draft + c_verify + ((c_verify_max if c_verify_max > c_verify else c_verify) - c_verify) * share

    @property
    def break_even_acceptance_ratio(self) -> float:
        return break_even_acceptance(self.per_draft_token)


def break_even_acceptance(cost_per_draft_token: float) -> float:
    """S = (1 + k·α) / (1 + k·c) ≥ 1 ⇔ α ≥ c: the break-even α is the cost per drafted token, capped at 1 (a cost
    above 1, e.g. a big draft model under load, means no acceptance rate pays off)."""
    return min(1.0, cost_per_draft_token)


def _unit(x: float) -> float:
    """x clamped to [0, 1] (NaN to 0, as min(1, max(0, x)) does); conditionals are ~6× faster than the builtins."""
    return x if 0.0 <= x <= 1.0 else (1.0 if x > 1.0 else 0.0)


def acceptance_ratio(accepted_tokens: float, draft_tokens: float) -> float | None:
    """α: accepted draft tokens / drafted tokens."""
    if draft_tokens <= 0:
        return None
    return _unit(accepted_tokens / draft_tokens)


def per_draft(tokens: float, drafts: float | None) -> float | None:
    """Tokens per draft; None without drafts, and None where the quotient overflows (a nonsense count of drafts,
    e.g. 1e-300 from a broken exposition, must not become an infinite length or a NaN speedup)."""
    if drafts is None or drafts <= 0:
        return None
    quotient = tokens / drafts
    return quotient if math.isfinite(quotient) else None


def speculative_token_share(emitted_tokens: float | None, generated_tokens: float | None) -> float | None:
    """Tokens that speculative steps produced (drafts + accepted: each step emits its accepted prefix and one token
    of the target) over every generated token: 1 while every step speculates, 0 once speculation stopped while
    generation goes on; None without generation (or where the source does not count one of them)."""
    if emitted_tokens is None or generated_tokens is None or generated_tokens <= 0:
        return None
    return _unit(emitted_tokens / generated_tokens)


def mean_acceptance_length(accepted_tokens: float, drafts: float | None) -> float | None:
    """Tokens produced per verification step, bonus token included (vLLM's definition): 1 + accepted/drafts."""
    accepted_per_draft = per_draft(accepted_tokens, drafts)
    if accepted_per_draft is None:
        return None
    return 1.0 + accepted_per_draft if accepted_per_draft > 0.0 else 1.0


def mean_draft_length(draft_tokens: float, drafts: float | None) -> float | None:
    """k̄: drafted tokens per draft (below k when e.g. ngram lookups come up short)."""
    return per_draft(draft_tokens, drafts)


def position_acceptance_ratios(accepted_by_position: tuple[float, ...], drafts: float | None) -> tuple[float, ...]:
    """P(accepted prefix is longer than i) for each position i."""
    if drafts is None or drafts <= 0:
        return ()
    ratios = tuple(map(operator.truediv, accepted_by_position, repeat(drafts, len(accepted_by_position))))
    # Counts come from monotonic totals, so they are ≥ 0; only the upper bound needs a clamp.
    if ratios and max(ratios) > 1.0:
        return tuple([min(1.0, ratio) for ratio in ratios])
    return ratios


def token_acceptance_probability(
    accepted_tokens: float,
    drafts: float | None,
    accepted_by_position: tuple[float, ...] = (),
    num_speculative_tokens: float | None = None,
) -> float | None:
    """Leviathan et al.'s per-token acceptance probability p (i.i.d. model), not α.

    With the per-position curve: each draft is a run of Bernoulli trials that ends at the first rejection
    or after k acceptances, so the maximum-likelihood p is successes / (successes + rejections), where
    rejections = drafts − drafts accepted in full. Without it, solve accepted/drafts = Σ_{i=1..k} p^i.
    """
    if drafts is None or drafts <= 0:
        return None
    if accepted_by_position:
        full = accepted_by_position[-1]
        trials = accepted_tokens + (drafts - full if drafts > full else 0.0)  # + rejections
        return None if trials <= 0 else _unit(accepted_tokens / trials)
    if not num_speculative_tokens or num_speculative_tokens <= 0:
        return None
    return solve_geometric_probability(accepted_tokens / drafts, num_speculative_tokens)


def geometric_prefix_mean(p: float, k: float) -> float:
    """Expected accepted prefix length for per-token probability p and draft length k: Σ_{i=1..k} p^i.

    Written with expm1/log so that it neither cancels near p = 1 nor needs an integer k (k̄ is often not one).
    """
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return k
    return p * -math.expm1(k * math.log(p)) / (1.0 - p)


def solve_geometric_probability(mean_accepted: float, k: float, iterations: int = 60) -> float:
    """Invert geometric_prefix_mean by bisection (it is increasing in p)."""
    if mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(iterations):
        mid = (low + high) / 2
        if geometric_prefix_mean(mid, k) < mean_accepted:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def expected_speedup(mean_length: float | None, draft_length: float | None, cost: CostModel) -> float | None:
    """S = L / (1 + k̄·(c_draft + c_verify)); below 1 spec decode costs more than it saves."""
    if mean_length is None or draft_length is None:
        return None
    return mean_length / (1.0 + draft_length * cost.per_draft_token)


def expected_speedup_split(mean_length: float | None, proposed_per_draft: float | None,
                           verified_per_draft: float | None, cost: CostModel) -> float | None:
    """S = L / (1 + k̄_p·c_draft + k̄_v·c_verify): drafting is paid per proposed token, verification per verified
    token (they differ where the engine trims a draft before verifying it: vLLM's adaptive verification). None when
    either length is unknown: a proposed length standing in for an unknown verified one is a guess."""
    if mean_length is None or proposed_per_draft is None or verified_per_draft is None:
        return None
    return mean_length / (1.0 + proposed_per_draft * cost.c_draft + verified_per_draft * cost.c_verify)


@functools.lru_cache(maxsize=64)
def _step_costs(per_draft_token: float, k: int) -> tuple[float, ...]:
    """1 + k'·c for k' = 1..k: the cost of one verification step at each draft length."""
    return tuple([1.0 + k_prime * per_draft_token for k_prime in range(1, k + 1)])


def speedup_by_length(position_ratios: tuple[float, ...], cost: CostModel) -> tuple[float, ...]:
    """S(k') for k' = 1..k from the per-position curve: (1 + Σ_{i<k'} r_i) / (1 + k'·c)."""
    expected_tokens = accumulate(position_ratios, initial=1.0)
    next(expected_tokens)  # k' = 0: plain decoding
    return tuple(map(operator.truediv, expected_tokens, _step_costs(cost.per_draft_token, len(position_ratios))))


MIN_RECOMMENDATION_GAIN = 0.02


def recommended_num_speculative_tokens(speedups: tuple[float, ...],
                                       min_gain: float = MIN_RECOMMENDATION_GAIN) -> int | None:
    """The k' with the highest modelled speedup; 0 (turn spec decode off) when no k' beats plain decoding.

    ``speedups[-1]`` is the current k. A shorter k' must beat it by ``min_gain`` (2 %) to be recommended:
    a model this coarse should not send anyone to change k for a 1 % difference, nor flap between two
    near-equal lengths. Ties go to the smaller k'.
    """
    if not speedups:
        return None
    best = max(speedups)
    best_k = speedups.index(best) + 1 if best > 1.0 + 1e-12 else 0  # index(): the first, i.e. smallest, k'
    current_k, current = len(speedups), speedups[-1]
    if best_k not in (0, current_k) and best < current * (1.0 + min_gain):
        return current_k
    return best_k


class WindowStats(NamedTuple):
    acceptance_ratio: float | None
    mean_acceptance_length: float | None
    position_acceptance_ratios: tuple[float, ...]
    token_acceptance_probability: float | None
    draft_tokens_per_second: float
    accepted_tokens_per_second: float
    expected_speedup: float | None
    speedup_by_length: tuple[float, ...]
    recommended_num_speculative_tokens: int | None
    mean_draft_length: float | None  # k̄: drafted tokens per draft, measured (None where drafts are not counted)
    unproven: str | None = None  # why the per-position curve (and what builds on it) is absent, when it is


def has_acceptance(span: WindowSpan) -> bool:
    """Whether span_stats has statistics for the span (both token counters, drafted tokens, time), without
    working them out: counts_stats' conditions, NaN included."""
    start, end = span.start, span.end
    drafted = optional_minus(end.draft_tokens, start.draft_tokens)
    return (drafted is not None and not drafted <= 0 and end.accepted_tokens is not None
            and start.accepted_tokens is not None and not span.seconds <= 0)


def lower_bound_ratio(span: WindowSpan) -> float | None:
    """Accepted over the proposed draft tokens of the span, where the engine counts them apart from the ones α
    divides by (SeriesReading.proposed_draft_tokens); None without any proposed in it. Trimmed tokens are proposed
    but never verified, so this is at most α."""
    proposed = optional_minus(span.end.proposed_draft_tokens, span.start.proposed_draft_tokens)
    accepted = optional_minus(span.end.accepted_tokens, span.start.accepted_tokens)
    if proposed is None or accepted is None or not proposed > 0:
        return None
    return acceptance_ratio(accepted, proposed)


def span_stats(span: WindowSpan, cost: CostModel, num_speculative_tokens: int | None) -> WindowStats | None:
    """Everything the sidecar reports for the window between two cumulative snapshots; None when it carried no
    drafted tokens. Computed from the snapshots directly, without building a delta (this runs for every
    series × window on every collection)."""
    if not has_acceptance(span):
        return None
    start, end = span.start, span.end
    drafted = optional_minus(end.draft_tokens, start.draft_tokens)
    accepted = optional_minus(end.accepted_tokens, start.accepted_tokens)
    assert drafted is not None and accepted is not None
    return counts_stats(span.seconds, drafted, accepted, optional_minus(end.drafts, start.drafts),
                        positions_minus(end.accepted_by_position, start.accepted_by_position), cost,
                        num_speculative_tokens,
                        positions_minus(end.drafted_by_position, start.drafted_by_position),
                        optional_minus(end.proposed_draft_tokens, start.proposed_draft_tokens))


# A mean draft length this far below k (relative) means the drafts were not all k tokens long.
DRAFT_LENGTH_TOLERANCE = 1e-6


def draft_length_varies(mean_draft: float | None, k: int) -> bool:
    """Whether drafts of mean length ``mean_draft`` cannot all have been ``k`` tokens long."""
    return mean_draft is not None and mean_draft < k * (1.0 - DRAFT_LENGTH_TOLERANCE)


def per_position_over_drafted(accepted_by_position: tuple[float, ...],
                              drafted_by_position: tuple[float, ...]) -> tuple[float, ...]:
    """accepted[i] / drafted[i]: among the drafts that reached position i, the share whose accepted prefix is
    longer than i. Where the draft length is cut independently of acceptance (a batch-size schedule), that is the
    curve a full-length draft would show; it stops at the first position no draft reached."""
    ratios: list[float] = []
    for accepted, drafted in zip(accepted_by_position, drafted_by_position, strict=False):
        if not drafted > 0:
            break
        ratios.append(_unit(accepted / drafted))
    return tuple(ratios)


def token_probability_over_drafted(accepted_by_position: tuple[float, ...],
                                   drafted_by_position: tuple[float, ...]) -> float | None:
    """Leviathan's p from per-position drafted counts: successes Σ a_i over trials Σ d_i·r_(i−1) (the drafts that
    reached position i with every earlier token accepted; r_(−1) = 1, r_i = a_i / d_i). With every draft k tokens
    long this is token_acceptance_probability's successes / (successes + rejections)."""
    ratios = per_position_over_drafted(accepted_by_position, drafted_by_position)
    if not ratios:
        return None
    trials = sum(map(operator.mul, drafted_by_position, (1.0, *ratios[:-1])))
    return None if trials <= 0 else _unit(sum(accepted_by_position[:len(ratios)]) / trials)


class DraftCounts(NamedTuple):
    """What a window's counts say about its drafts: how many (None: not counted), of what mean length (None: not
    measured), accepted tokens per draft on the same clock as the drafts, the per-position curve, and why that
    curve is absent when it is."""

    drafts: float | None
    mean_draft_length: float | None
    accepted_per_draft: float | None
    positions: tuple[float, ...]
    unproven: str | None


def draft_counts(draft_tokens: float, accepted_tokens: float, drafts: float | None,
                 accepted_by_position: tuple[float, ...], drafted_by_position: tuple[float, ...]) -> DraftCounts:
    """Drafts and their length from the counters that count them, never from k. Per-position drafted counts
    (TensorRT-LLM) give the drafts (position 0), the length and the accepted tokens per draft from one family, so
    on one clock (they move at request completion, the token counters every iteration)."""
    if drafted_by_position and drafted_by_position[0] > 0:
        first = drafted_by_position[0]
        accepted = sum(accepted_by_position) if accepted_by_position else None
        return DraftCounts(first, per_draft(sum(drafted_by_position), first),
                           None if accepted is None else per_draft(accepted, first),
                           per_position_over_drafted(accepted_by_position, drafted_by_position), None)
    mean_draft = mean_draft_length(draft_tokens, drafts)
    accepted_per_draft = per_draft(accepted_tokens, drafts)
    k = len(accepted_by_position)
    if k and draft_length_varies(mean_draft, k):
        assert mean_draft is not None
        return DraftCounts(drafts, mean_draft, accepted_per_draft, (),
                           f"the draft length varies (drafts averaged {mean_draft:.2f} of k = {k} tokens) and the "
                           "engine counts no drafted tokens per position: per-position acceptance unproven")
    return DraftCounts(drafts, mean_draft, accepted_per_draft, position_acceptance_ratios(accepted_by_position, drafts),
                       None)


def _proposed_length(proposed_tokens: float | None, drafts: float | None, verified_length: float | None
                     ) -> float | None:
    """k̄_p: proposed tokens per draft where they are counted apart from the verified ones (never fewer), else the
    verified length k̄_v."""
    proposed = per_draft(proposed_tokens, drafts) if proposed_tokens is not None else None
    if proposed is None or verified_length is None:
        return verified_length
    return max(proposed, verified_length)


def counts_stats(seconds: float, draft_tokens: float, accepted_tokens: float, drafts: float | None,
                 accepted_by_position: tuple[float, ...], cost: CostModel,
                 num_speculative_tokens: int | None,
                 drafted_by_position: tuple[float, ...] = (), proposed_tokens: float | None = None
                 ) -> WindowStats | None:
    """The window's statistics from its counts (increases over ``seconds``). α is over the drafted (= verified:
    every engine's drafted-token counter counts the tokens sent to verification, docs/engines.md, or vLLM's
    verified-token counter where it has one) tokens; ``proposed_tokens``, where the engine counts them apart (that
    vLLM's drafted-token counter), is what drafting is charged for."""
    alpha = acceptance_ratio(accepted_tokens, draft_tokens)
    if alpha is None or seconds <= 0:
        return None
    counts = draft_counts(draft_tokens, accepted_tokens, drafts, accepted_by_position, drafted_by_position)
    draft_length, accepted_per_draft = counts.mean_draft_length, counts.accepted_per_draft
    if counts.drafts is None and num_speculative_tokens:
        # No drafts counter (TensorRT-LLM before its per-position family): drafts = drafted tokens / k, exact only
        # when every draft is k tokens long. The length is assumed, so it is used but not reported as measured.
        assumed = draft_tokens / num_speculative_tokens
        length_for_model: float | None = float(num_speculative_tokens)
        accepted_per_draft = per_draft(accepted_tokens, assumed)
        drafts_for_fit: float | None = assumed
    else:
        length_for_model, drafts_for_fit = draft_length, counts.drafts
    length = None if accepted_per_draft is None else 1.0 + (accepted_per_draft if accepted_per_draft > 0 else 0.0)
    positions = counts.positions
    by_length = speedup_by_length(positions, cost)
    probability = (token_probability_over_drafted(accepted_by_position, drafted_by_position)
                   if drafted_by_position and positions else
                   token_acceptance_probability(accepted_tokens, drafts_for_fit,
                                                accepted_by_position if positions else (), length_for_model))
    return WindowStats(
        alpha,
        length,
        positions,
        probability,
        draft_tokens / seconds,
        accepted_tokens / seconds,
        # The proposed length where the engine counts proposed tokens apart (vLLM's verified-token counter), else
        # the one measured: every other drafted-token counter counts the tokens verified (docs/engines.md).
        expected_speedup_split(length, _proposed_length(proposed_tokens, drafts_for_fit, length_for_model),
                               length_for_model, cost),
        by_length,
        recommended_num_speculative_tokens(by_length),
        draft_length,
        counts.unproven,
    )
