"""The one verdict definition (src/specdecode_exporter/core/contract/verdict.py) against cases worked out by hand."""

from __future__ import annotations

import itertools

import pytest

from specdecode_exporter.core.contract.verdict import Evidence, HeldVerdict, Verdict, VerdictBands, hold, judge
from specdecode_exporter.pipeline.derive import CostModel, counts_stats

BANDS = VerdictBands(page_acceptance_ratio=0.5, hurting_below=1.0, paying_off_from=1.1)


def modelled(alpha: float, k: int, cost: CostModel) -> Evidence:
    """The evidence the sidecar has for a window of 100 drafts of k tokens each accepting α."""
    stats = counts_stats(60.0, 100.0 * k, 100.0 * k * alpha, 100.0, (), cost, k)
    assert stats is not None
    return Evidence(stats.acceptance_ratio, stats.expected_speedup)


@pytest.mark.parametrize(
    ("alpha", "k", "cost", "expected"),
    [
        # S = (1 + kα) / (1 + k·c)
        (0.75, 3, CostModel(), Verdict.PAYING_OFF),  # (1 + 2.25) / 2.5 = 1.30
        (0.55, 3, CostModel(), Verdict.MARGINAL),  # (1 + 1.65) / 2.5 = 1.06: the case, both places agree
        (0.45, 3, CostModel(), Verdict.HURTING),  # (1 + 1.35) / 2.5 = 0.94
        (0.45, 3, CostModel(0.0, 0.1), Verdict.MARGINAL),  # ngram: S = 2.35 / 1.3 = 1.81, but α < page threshold
        (0.62, 4, CostModel(0.0, 0.5), Verdict.PAYING_OFF),  # S = 3.48 / 3 = 1.16
    ],
)
def test_modelled_verdicts(alpha: float, k: int, cost: CostModel, expected: Verdict) -> None:
    judgement = judge(modelled(alpha, k, cost), BANDS)
    assert judgement.verdict is expected
    assert judgement.basis == "modelled"
    assert "modelled" in judgement.reason


def test_no_traffic() -> None:
    judgement = judge(Evidence(None, None), BANDS)
    assert judgement.verdict is Verdict.NO_TRAFFIC and judgement.verdict.code is None


def test_observed_speedup_wins_over_the_model() -> None:
    # The model says hurting (0.94), the measurement says it pays off.
    evidence = Evidence(0.55, 0.94, observed_speedup=1.31, observed_speedup_p50=1.35, observed_speedup_p99=1.2,
                        baseline='the control target "vllm-nospec"')
    judgement = judge(evidence, BANDS)
    assert judgement.verdict is Verdict.PAYING_OFF and judgement.basis == "observed"
    assert judgement.reason == 'observed 1.31× against the control target "vllm-nospec"'


def test_tail_regression_is_marginal_with_the_reason_in_words() -> None:
    evidence = Evidence(0.7, 1.3, observed_speedup=1.31, observed_speedup_p50=1.4, observed_speedup_p99=0.92,
                        baseline="control")
    judgement = judge(evidence, BANDS)
    assert judgement.verdict is Verdict.MARGINAL
    assert judgement.reason == "observed 1.31× against control, P99 0.92×: tail regression"


def test_bands_are_the_configs() -> None:
    strict = VerdictBands(page_acceptance_ratio=0.6, hurting_below=1.0, paying_off_from=1.25)
    evidence = modelled(0.75, 3, CostModel())  # 1.30
    assert judge(evidence, BANDS).verdict is Verdict.PAYING_OFF
    assert judge(evidence, VerdictBands(0.5, 1.0, 1.35)).verdict is Verdict.MARGINAL
    assert judge(modelled(0.58, 3, CostModel(0.0, 0.1)), strict).verdict is Verdict.MARGINAL


def test_codes_are_ordered_worst_first() -> None:
    assert [v.code for v in (Verdict.HURTING, Verdict.MARGINAL, Verdict.PAYING_OFF)] == [0, 1, 2]


def observed(speedup: float, p99: float = 1.2, alpha: float = 0.7) -> Evidence:
    return Evidence(alpha, 1.3, observed_speedup=speedup, observed_speedup_p50=speedup, observed_speedup_p99=p99,
                    baseline="control")


def held_sequence(sequence: list[Evidence], step: float = 5.0) -> list[tuple[float, Verdict]]:
    """The verdict in force after each evaluation, ``step`` seconds apart."""
    held: HeldVerdict | None = None
    out = []
    for i, evidence in enumerate(sequence):
        held = hold(held, evidence, BANDS, i * step)
        out.append((i * step, held.judgement.verdict))
    return out


def test_a_verdict_that_wavers_at_a_band_edge_does_not_flip() -> None:
    """The speedup and the P99 wander across the edges (1.08 ↔ 1.12, P99 0.99 ↔ 1.01): judged alone the verdict
    flips at every other collection; held, it stays what it was."""
    wavering = [observed(1.08 if i % 3 else 1.12, 0.99 if i % 2 else 1.01) for i in range(60)]
    assert len({judge(e, BANDS).verdict for e in wavering}) == 2
    assert {verdict for _, verdict in held_sequence(wavering)} == {judge(wavering[0], BANDS).verdict}


def test_a_new_verdict_takes_over_once_it_has_held_a_minute() -> None:
    sequence = [observed(1.3)] * 4 + [observed(1.08)] * 20  # just below paying off: not decisive
    held = held_sequence(sequence)
    changed = [t for (_, before), (t, after) in itertools.pairwise(held) if before is not after]
    assert changed == [20.0 + 60.0]  # the first marginal judgement at 20 s, in force from 80 s
    assert held[-1][1] is Verdict.MARGINAL
    pending = hold(hold(None, observed(1.3), BANDS, 0.0), observed(1.08), BANDS, 5.0)
    assert pending.judgement.verdict is Verdict.PAYING_OFF and pending.pending is Verdict.MARGINAL
    assert pending.judgement.reason == ("held: observed 1.08× against control: below 1.1× (marginal for 0 s; that "
                                        "takes over once it has held 60 s, or at once 0.05 past the band edge)")


def test_a_verdict_past_a_band_edge_by_the_margin_takes_over_at_once() -> None:
    assert held_sequence([observed(1.3), observed(0.94)])[-1][1] is Verdict.HURTING  # 1.0 − 0.05 passed
    assert held_sequence([observed(1.3), observed(0.96)])[-1][1] is Verdict.PAYING_OFF  # not yet
    assert held_sequence([observed(1.3), observed(1.3, p99=0.9)])[-1][1] is Verdict.MARGINAL  # P99 0.95 passed
    assert held_sequence([observed(0.9), observed(1.16)])[-1][1] is Verdict.PAYING_OFF  # 1.1 + 0.05 passed


def test_stopping_speculating_and_no_data_take_over_at_once_both_ways() -> None:
    stopped = Evidence(None, None, not_speculating="since 12:00:00 UTC")
    down = Evidence(None, None, no_data="since 12:00:00 UTC")
    held = held_sequence([observed(1.3), stopped, observed(1.08), down, observed(0.98)])
    assert [verdict for _, verdict in held] == [Verdict.PAYING_OFF, Verdict.NOT_SPECULATING, Verdict.MARGINAL,
                                                Verdict.NO_DATA, Verdict.HURTING]
    assert judge(down, BANDS).sample is None and judge(stopped, BANDS).sample == 1.0
