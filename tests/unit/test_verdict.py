"""The one verdict definition (src/specdecode_exporter/core/verdict.py) against cases worked out by hand."""

from __future__ import annotations

import pytest

from specdecode_exporter.core.verdict import Evidence, Verdict, VerdictBands, judge
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
