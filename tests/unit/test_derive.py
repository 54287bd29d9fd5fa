"""The math against values computed by hand (docs/architecture.md: the exported contract, the break-even model)."""

from __future__ import annotations

import math

import pytest

from specdecode_exporter.pipeline.derive import (
    CostModel,
    acceptance_ratio,
    break_even_acceptance,
    counts_stats,
    expected_speedup,
    geometric_prefix_mean,
    mean_acceptance_length,
    position_acceptance_ratios,
    recommended_num_speculative_tokens,
    solve_geometric_probability,
    speedup_by_length,
    token_acceptance_probability,
)

# The real vLLM 0.32.0 capture: drafts 308, draft tokens 857, accepted 211, per position 152, 37, 22.
DRAFTS, DRAFTED, ACCEPTED, PER_POS = 308.0, 857.0, 211.0, (152.0, 37.0, 22.0)


def test_acceptance_ratio_is_accepted_over_drafted() -> None:
    assert acceptance_ratio(ACCEPTED, DRAFTED) == pytest.approx(211 / 857)
    assert acceptance_ratio(0, 0) is None
    assert acceptance_ratio(5, 0) is None


def test_mean_acceptance_length_includes_the_bonus_token() -> None:
    assert mean_acceptance_length(ACCEPTED, DRAFTS) == pytest.approx(1 + 211 / 308)  # 1.6851
    assert mean_acceptance_length(ACCEPTED, 0) is None
    assert mean_acceptance_length(ACCEPTED, None) is None


def test_position_ratios_are_prefix_probabilities() -> None:
    assert position_acceptance_ratios(PER_POS, DRAFTS) == pytest.approx((152 / 308, 37 / 308, 22 / 308))
    # Conditional acceptance at position 1 is per_pos[1] / per_pos[0].
    assert pytest.approx(0.2434, abs=1e-4) == 37 / 152


def test_leviathan_probability_from_the_per_position_curve() -> None:
    # successes = 211; rejections = drafts not accepted in full = 308 - 22 = 286.
    assert token_acceptance_probability(ACCEPTED, DRAFTS, PER_POS) == pytest.approx(211 / (211 + 286))


def test_leviathan_probability_solved_from_mean_length_when_no_curve() -> None:
    # p = 0.5, k = 3: expected accepted prefix = 0.5 + 0.25 + 0.125 = 0.875 per draft.
    assert geometric_prefix_mean(0.5, 3) == pytest.approx(0.875)
    assert solve_geometric_probability(0.875, 3) == pytest.approx(0.5, abs=1e-9)
    assert token_acceptance_probability(875, 1000, (), 3) == pytest.approx(0.5, abs=1e-9)
    assert token_acceptance_probability(3000, 1000, (), 3) == 1.0
    assert token_acceptance_probability(0, 1000, (), 3) == 0.0


def test_leviathan_probability_is_exact_for_iid_drafts() -> None:
    p, k, drafts = 0.8, 4, 10_000.0
    per_pos = tuple(drafts * p ** (i + 1) for i in range(k))
    assert token_acceptance_probability(sum(per_pos), drafts, per_pos) == pytest.approx(p)


def test_break_even_is_the_cost_per_draft_token() -> None:
    assert CostModel().break_even_acceptance_ratio == pytest.approx(0.5)
    assert CostModel(c_draft=0.0, c_verify=0.2).break_even_acceptance_ratio == pytest.approx(0.2)


def test_break_even_is_capped_at_1_where_no_acceptance_rate_pays_off() -> None:
    """A cost above 1 per drafted token (a big draft model, a saturated batch, a calibration to a slowdown):
    even α = 1 gives S = (1 + k) / (1 + k·c) < 1, so the break-even is 1, not an impossible ratio."""
    assert CostModel(c_draft=0.8, c_verify=0.6).break_even_acceptance_ratio == 1.0
    assert break_even_acceptance(1.1) == 1.0 and break_even_acceptance(0.35) == 0.35
    k, c = 3, 1.1
    assert (1 + k * 1.0) / (1 + k * c) < 1


def test_expected_speedup() -> None:
    cost = CostModel(0.1, 0.4)
    # k̄ = 3, α = 0.75 → L = 1 + 3·0.75 = 3.25; cost = 1 + 3·0.5 = 2.5; S = 1.3.
    assert expected_speedup(3.25, 3.0, cost) == pytest.approx(1.3)
    # At break-even α = 0.5: L = 2.5 and S = 1 exactly.
    assert expected_speedup(2.5, 3.0, cost) == pytest.approx(1.0)
    assert expected_speedup(None, 3.0, cost) is None


def test_speedup_by_length_and_recommendation() -> None:
    cost = CostModel(0.1, 0.4)
    # k'=1: 1.9/1.5; k'=2: 2.5/2.0; k'=3: 2.8/2.5
    speedups = speedup_by_length((0.9, 0.6, 0.3), cost)
    assert speedups == pytest.approx((1.9 / 1.5, 1.25, 1.12))
    assert recommended_num_speculative_tokens(speedups) == 1


def test_recommendation_is_zero_when_no_length_beats_plain_decoding() -> None:
    speedups = speedup_by_length((0.2, 0.1), CostModel(0.1, 0.4))
    assert speedups == pytest.approx((0.8, 0.65))
    assert recommended_num_speculative_tokens(speedups) == 0
    assert recommended_num_speculative_tokens(()) is None


def test_recommendation_prefers_the_shorter_draft_on_a_tie() -> None:
    assert recommended_num_speculative_tokens((1.2, 1.2, 1.1)) == 1


def test_recommendation_keeps_the_current_k_unless_a_shorter_one_gains_2_percent() -> None:
    # α = 0.75, k = 3, c = 0.5: S(2) = 1.318 is only 1.4 % above S(3) = 1.30 — not worth a change.
    assert recommended_num_speculative_tokens((1.24, 1.318, 1.30)) == 3
    assert recommended_num_speculative_tokens((1.24, 1.33, 1.30)) == 2
    # Turning spec decode off is recommended whenever it is modelled to be faster at all.
    assert recommended_num_speculative_tokens((0.95, 0.99, 0.99)) == 0


def test_window_stats_from_the_window_counts() -> None:
    # The capture's ngram drafts averaged 857/308 = 2.78 of k = 3 tokens: the per-position curve over all drafts is
    # then not the curve a 3-token draft would show, and vLLM counts no drafted tokens per position (absent).
    stats = counts_stats(60.0, DRAFTED, ACCEPTED, DRAFTS, PER_POS, CostModel(0.0, 0.2), None)
    assert stats is not None
    assert stats.acceptance_ratio == pytest.approx(211 / 857)
    assert stats.mean_acceptance_length == pytest.approx(1 + 211 / 308)
    assert stats.mean_draft_length == pytest.approx(857 / 308)
    assert stats.draft_tokens_per_second == pytest.approx(857 / 60)
    assert stats.accepted_tokens_per_second == pytest.approx(211 / 60)
    assert stats.expected_speedup == pytest.approx((1 + 211 / 308) / (1 + 857 / 308 * 0.2))
    assert stats.position_acceptance_ratios == () and stats.speedup_by_length == ()
    assert stats.recommended_num_speculative_tokens is None
    assert stats.unproven is not None and "2.78 of k = 3" in stats.unproven


def test_window_stats_with_every_draft_k_tokens_long() -> None:
    # The same drafts and acceptance, every draft 3 tokens long: the per-position curve holds.
    stats = counts_stats(60.0, 3 * DRAFTS, ACCEPTED, DRAFTS, PER_POS, CostModel(0.0, 0.2), None)
    assert stats is not None and stats.unproven is None and stats.mean_draft_length == pytest.approx(3.0)
    # c = 0.2: S(1) = (1 + 152/308)/1.2 = 1.2446; S(2) = (1 + 189/308)/1.4 = 1.1527; S(3) = (1 + 211/308)/1.6 = 1.0532
    assert stats.speedup_by_length == pytest.approx((1.24459, 1.15260, 1.05317), abs=1e-4)
    assert stats.recommended_num_speculative_tokens == 1


def test_window_without_drafts_has_no_stats() -> None:
    assert counts_stats(60.0, 0.0, 0.0, 0.0, (), CostModel(), None) is None


def test_v0_window_uses_k_to_count_drafts() -> None:
    stats = counts_stats(10.0, 500.0, 350.0, None, (), CostModel(), 5)
    assert stats is not None
    assert stats.mean_acceptance_length == pytest.approx(1 + 350 / 100)


def test_a_nonsense_count_of_drafts_gives_no_length_and_no_speedup_rather_than_inf_or_nan() -> None:
    """Hypothesis found it: 51828 drafted tokens over 2.9e-304 drafts (a broken exposition) overflowed the
    tokens per draft to inf, so the mean lengths were inf and the modelled speedup inf / inf = NaN."""
    stats = counts_stats(60.0, 51828.0, 51828.0, 2.8830091738816112e-304, (), CostModel(0.1, 0.4), None)
    assert stats is not None and stats.acceptance_ratio == 1.0
    assert stats.mean_acceptance_length is None and stats.mean_draft_length is None
    assert stats.expected_speedup is None
    floats = [v for v in stats if isinstance(v, float)]
    assert floats and all(math.isfinite(v) for v in floats), stats
