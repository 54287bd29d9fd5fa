"""vLLM's counting, stated per feature: a verified-draft-tokens counter (vllm#58340, proposed) is what α divides by,
adaptive verification included; without it a target declared adaptive has α withheld and accepted per proposed
token, a lower bound, kept as what it is. Fixtures: tests/fixtures/vllm_v1_verified_draft_tokens.prom (its header
works the figures out) and vllm_v1_spec.prom."""

from __future__ import annotations

import re

import pytest

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.pipeline.derive import CostModel, lower_bound_ratio, span_stats
from specdecode_exporter.pipeline.engines import ALL_PREFIXES, DecoderOptions, FetchTiming, detect_engine
from specdecode_exporter.pipeline.engines.base import SeriesReading
from specdecode_exporter.pipeline.parse import select
from specdecode_exporter.pipeline.store import Store
from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.exposition import render
from specdecode_exporter.simulator.scenario import parse_scenario_text
from tests.helpers import fixture_text

VERIFIED = "vllm_v1_verified_draft_tokens.prom"


def read(text: str, adaptive: bool) -> SeriesReading:
    selection = select(text, ALL_PREFIXES)
    engine = detect_engine(selection.samples())
    assert engine is not None and engine.api == "vllm-v1"
    result = engine.new_decoder(DecoderOptions(adaptive_verification=adaptive)).decode(selection, FetchTiming(0, 1))
    (series,) = result.series
    return series


def halved(text: str) -> str:
    """The exposition with every counter at half its value: the same server earlier."""
    return re.sub(r"^(vllm:[a-z_]+_total\{[^}]*\}) (\S+)$", lambda m: f"{m.group(1)} {float(m.group(2)) / 2}", text,
                  flags=re.MULTILINE)


def span(text: str, adaptive: bool):  # type: ignore[no-untyped-def]
    store = Store(keep_seconds=3600, stale_after=600)
    store.update("t", [read(halved(text), adaptive)], [], 0.0)
    (state,) = store.update("t", [read(text, adaptive)], [], 60.0)
    found = state.window_span(60.0, 60.0, 1.0)
    assert found is not None
    return found


@pytest.mark.parametrize("adaptive", [False, True])
def test_alpha_is_over_the_verified_tokens_where_vllm_counts_them(adaptive: bool) -> None:
    """Declared adaptive or not: accepted / verified (0.688), the proposed count kept apart; nothing withheld."""
    series = read(fixture_text(VERIFIED), adaptive)
    assert (series.draft_tokens, series.proposed_draft_tokens, series.accepted_tokens) == (2000, 3000, 1376)
    window = span(fixture_text(VERIFIED), adaptive)
    stats = span_stats(window, CostModel(), None)
    assert stats is not None
    assert stats.acceptance_ratio == pytest.approx(0.688)
    assert stats.mean_draft_length == pytest.approx(2.0)
    assert stats.mean_acceptance_length == pytest.approx(2.376)
    cost = CostModel()  # drafting paid for the 3 proposed tokens per draft, verification for the 2 verified
    assert stats.expected_speedup == pytest.approx(2.376 / (1 + 3 * cost.c_draft + 2 * cost.c_verify))


def test_without_the_counter_adaptive_verification_withholds_alpha_and_keeps_the_lower_bound() -> None:
    text = fixture_text(VERIFIED).replace("vllm:spec_decode_num_verified_draft_tokens", "vllm:unrelated_counter")
    series = read(text, adaptive=True)
    assert (series.draft_tokens, series.proposed_draft_tokens) == (None, 3000)
    window = span(text, adaptive=True)
    assert span_stats(window, CostModel(), None) is None
    assert lower_bound_ratio(window) == pytest.approx(1376 / 3000)  # ≤ α 0.688: trimmed tokens count as rejected


def test_an_undeclared_target_without_the_counter_reads_as_before() -> None:
    series = read(fixture_text("vllm_v1_spec.prom"), adaptive=False)
    assert (series.draft_tokens, series.proposed_draft_tokens) == (509007, None)


def test_the_simulators_v1_page_serves_the_verified_counter_on_request() -> None:
    """ModelSpec.verified_draft_tokens_counter: the counter beside num_draft_tokens (the proposed tokens), as the
    fixture shows it; the sidecar's decoder reads α over it."""
    spec = ModelSpec(num_speculative_tokens=3, position_acceptance=(0.8, 0.8, 0.8), adaptive_verification_share=0.5,
                     verified_draft_length=1, verified_draft_tokens_counter=True)
    sim = Simulator(steady_scenario(spec), clock=lambda: 0.0, wall_epoch=1.7e9)
    sim.advance(100)
    text = render("v1", sim.snapshot()).decode()
    series = read(text, adaptive=True)
    assert series.draft_tokens is not None and series.proposed_draft_tokens is not None
    assert series.proposed_draft_tokens == pytest.approx(3 * series.drafts)  # every draft counts its k proposed
    assert series.draft_tokens == pytest.approx(2 * series.drafts, rel=1e-3)  # half of them verify 1
    assert series.accepted_tokens / series.draft_tokens == pytest.approx(0.688, rel=2e-3)
    plain = render("v1", Simulator(steady_scenario(ModelSpec()), clock=lambda: 0.0).snapshot()).decode()
    assert "verified_draft_tokens" not in plain  # off by default, as in every vLLM released so far


def test_the_verified_counter_goes_with_proposed_counting() -> None:
    with pytest.raises(ConfigError, match="draft_tokens_count: expected proposed with verified_draft_tokens_counter"):
        parse_scenario_text("models: [{name: m, verified_draft_tokens_counter: true, draft_tokens_count: verified}]\n",
                            "s.yaml")
