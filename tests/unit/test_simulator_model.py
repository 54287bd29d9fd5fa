"""Traffic-model math of the simulator (pure functions)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdecode_exporter.simulator.model import (
    LiveParams,
    ModelSpec,
    compute_rates,
    cumulative_fractions,
    iid_acceptance_sum,
    position_fractions,
    solve_token_probability,
)


@given(alpha=st.floats(0.0, 1.0), k=st.integers(1, 10), fill=st.floats(0.05, 1.0))
def test_position_fractions_reproduce_alpha_exactly(alpha: float, k: int, fill: float) -> None:
    fractions = position_fractions(alpha, k, fill)
    assert len(fractions) == k
    assert sum(fractions) / (k * fill) == pytest.approx(alpha, abs=1e-12)
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert all(a >= b for a, b in itertools.pairwise(fractions))


@given(p=st.floats(0.0, 1.0), k=st.integers(1, 10))
def test_solve_token_probability_inverts_the_iid_sum(p: float, k: int) -> None:
    assert iid_acceptance_sum(solve_token_probability(iid_acceptance_sum(p, k), k), k) == pytest.approx(
        iid_acceptance_sum(p, k), abs=1e-9)


def test_iid_closed_form_matches_the_brief() -> None:
    p, k = 0.8, 4
    alpha = p * (1 - p**k) / ((1 - p) * k)
    assert sum(position_fractions(alpha, k)) / k == pytest.approx(alpha)
    assert position_fractions(alpha, k)[0] == pytest.approx(p)


def test_cumulative_fractions_are_running_products() -> None:
    assert cumulative_fractions((0.8, 0.5, 0.5)) == pytest.approx((0.8, 0.4, 0.2))


def test_rates_follow_vllm_definitions_and_alpha_moves_latency() -> None:
    spec = ModelSpec(num_speculative_tokens=3, drafts_per_second=100.0)
    good = compute_rates(spec, LiveParams(0.8, 100.0), position_fractions(0.8, 3))
    bad = compute_rates(spec, LiveParams(0.3, 100.0), position_fractions(0.3, 3))
    assert good.draft_tokens == 300.0
    assert good.accepted / good.draft_tokens == pytest.approx(0.8)
    assert good.generation_tokens == pytest.approx(good.drafts + good.accepted)  # bonus token per draft
    assert good.accepted == pytest.approx(sum(good.per_pos))
    assert bad.tpot_seconds > good.tpot_seconds
    assert good.step_seconds == bad.step_seconds
    assert math.isclose(good.tpot_seconds, good.step_seconds / (1 + good.accepted / good.drafts))
