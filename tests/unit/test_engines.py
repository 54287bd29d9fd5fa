"""Engine detection and decoding on real and generated expositions, V0's sum-of-sums counters included."""

from __future__ import annotations

import pytest

from specdecode_exporter.core.contract.metrics import LIFETIME_ACCEPTANCE
from specdecode_exporter.pipeline.engines import ALL_PREFIXES, DecoderOptions, FetchTiming, detect_engine
from specdecode_exporter.pipeline.engines.vllm_v0 import V0Decoder, infer_num_speculative_tokens
from specdecode_exporter.pipeline.parse import select, select_samples
from tests.helpers import fixture_text


def decode(name: str):
    selection = select(fixture_text(name), ALL_PREFIXES)
    engine = detect_engine(selection.samples())
    assert engine is not None
    return engine, engine.new_decoder(DecoderOptions()).decode(selection, FetchTiming(0.0, 0.1))


def test_real_capture_is_v1_with_created_and_k_3() -> None:
    engine, result = decode("captured_vllm_cpu_0.32.0_ngram.prom")
    assert engine.api == "vllm-v1"
    (series,) = result.series
    assert (series.model_name, series.engine) == ("tiny", "0")
    assert (series.drafts, series.draft_tokens, series.accepted_tokens) == (308, 857, 211)
    assert series.accepted_by_position == (152, 37, 22)
    assert series.num_speculative_tokens == 3
    assert series.created == pytest.approx(1.795312273572031e9)
    assert series.emitted_tokens == 211 + 308


def test_multiprocess_v1_has_two_engines_and_no_created() -> None:
    engine, result = decode("vllm_v1_spec_dp2_multiproc.prom")
    assert engine.api == "vllm-v1"
    assert sorted(s.engine for s in result.series) == ["0", "1"]
    assert all(s.created is None for s in result.series)
    engine0 = next(s for s in result.series if s.engine == "0")
    assert (engine0.drafts, engine0.draft_tokens, engine0.accepted_tokens) == (82572, 246948, 146511)


def test_v0_fixture_is_detected_but_not_decoded_from_one_fetch() -> None:
    engine, result = decode("vllm_v0_spec.prom")
    assert engine.api == "vllm-v0"
    assert result.series == []  # one fetch proves nothing about V0's sum-of-sums counters
    assert result.pending == [("meta-llama/Meta-Llama-3.1-70B-Instruct", None)]


def test_non_spec_exposition_is_detected_as_nothing() -> None:
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 3\n"
    assert detect_engine(select_samples(text, ALL_PREFIXES)) is None


def test_v1_series_with_a_nan_counter_is_pending_not_zero() -> None:
    text = ('vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} NaN\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 10\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 5\n')
    selection = select(text, ALL_PREFIXES)
    engine = detect_engine(selection.samples())
    assert engine is not None
    result = engine.new_decoder(DecoderOptions()).decode(selection, FetchTiming(0, 0))
    assert result.series == []
    assert result.pending == [("m", "0")]


def v0_exposition(accepted_counter: float, drafted_counter: float, emitted_counter: float, rate: float,
                  efficiency: float) -> str:
    labels = '{model_name="m"}'
    return "\n".join([
        f"vllm:spec_decode_num_accepted_tokens_total{labels} {accepted_counter}",
        f"vllm:spec_decode_num_draft_tokens_total{labels} {drafted_counter}",
        f"vllm:spec_decode_num_emitted_tokens_total{labels} {emitted_counter}",
        f"vllm:spec_decode_draft_acceptance_rate{labels} {rate}",
        f"vllm:spec_decode_efficiency{labels} {efficiency}",
    ]) + "\n"


class V0Engine:
    """vLLM V0's bookkeeping: each report adds the lifetime totals to the counters."""

    def __init__(self, k: int = 4) -> None:
        self.k = k
        self.accepted = self.drafted = self.emitted = 0.0
        self.c_accepted = self.c_drafted = self.c_emitted = 0.0

    def run(self, drafts: int, alpha: float) -> None:
        self.drafted += drafts * self.k
        self.accepted += drafts * self.k * alpha
        self.emitted += drafts * self.k * alpha + drafts

    def report(self) -> None:
        self.c_accepted += self.accepted
        self.c_drafted += self.drafted
        self.c_emitted += self.emitted

    def exposition(self) -> str:
        efficiency = self.emitted / (self.drafted / self.k * (self.k + 1))
        return v0_exposition(self.c_accepted, self.c_drafted, self.c_emitted, self.accepted / self.drafted, efficiency)


def decode_v0(decoder: V0Decoder, text: str, started: float, finished: float | None = None):
    return decoder.decode(select(text, ALL_PREFIXES), FetchTiming(started, finished or started + 0.01))


def test_v0_decodes_lifetime_totals_from_one_report_between_close_fetches() -> None:
    vllm, decoder = V0Engine(k=4), V0Decoder()
    vllm.run(100, 0.7)
    vllm.report()
    assert decode_v0(decoder, vllm.exposition(), 0.0).series == []  # baseline
    vllm.run(100, 0.5)
    vllm.report()
    (series,) = decode_v0(decoder, vllm.exposition(), 2.0).series
    # Lifetime totals, not the counters' sums of sums.
    assert series.draft_tokens == 800
    assert series.accepted_tokens == pytest.approx(400 * 0.7 + 400 * 0.5)
    assert series.num_speculative_tokens == 4
    assert series.drafts == 200
    assert dict(series.reported)[LIFETIME_ACCEPTANCE] == pytest.approx(0.6)


def test_v0_refuses_to_decode_when_fetches_are_5s_apart() -> None:
    vllm, decoder = V0Engine(), V0Decoder()
    vllm.run(100, 0.7)
    vllm.report()
    decode_v0(decoder, vllm.exposition(), 0.0)
    vllm.run(100, 0.5)
    vllm.report()
    vllm.run(100, 0.9)
    vllm.report()  # two reports between the fetches: the increase is a sum of two lifetime totals
    result = decode_v0(decoder, vllm.exposition(), 10.0)
    assert result.series == []
    assert any("5 s" in w for w in result.warnings)


def test_v0_holds_the_last_decoded_totals_while_no_report_comes() -> None:
    vllm, decoder = V0Engine(), V0Decoder()
    vllm.run(10, 0.7)
    vllm.report()
    decode_v0(decoder, vllm.exposition(), 0.0)
    vllm.run(10, 0.7)
    vllm.report()
    (first,) = decode_v0(decoder, vllm.exposition(), 2.0).series
    vllm.run(10, 0.7)  # tokens flow but vLLM has not reported yet
    (held,) = decode_v0(decoder, vllm.exposition(), 4.0).series
    assert held == first


def test_v0_cross_checks_against_the_lifetime_gauge() -> None:
    decoder = V0Decoder()
    decode_v0(decoder, v0_exposition(70, 100, 170, 0.7, 0.68), 0.0)
    result = decode_v0(decoder, v0_exposition(70 + 300, 100 + 400, 170 + 700, 0.9, 0.68), 2.0)
    assert result.series == []
    assert any("gauge" in w for w in result.warnings)


def test_v0_restart_resets_decoding() -> None:
    vllm, decoder = V0Engine(), V0Decoder()
    for t in (0.0, 2.0):
        vllm.run(10, 0.7)
        vllm.report()
        decode_v0(decoder, vllm.exposition(), t)
    restarted = V0Engine()
    restarted.run(5, 0.4)
    restarted.report()
    assert decode_v0(decoder, restarted.exposition(), 4.0).series == []
    restarted.run(5, 0.4)
    restarted.report()
    (series,) = decode_v0(decoder, restarted.exposition(), 6.0).series
    assert series.draft_tokens == 40


@pytest.mark.parametrize(("k", "drafts"), [(1, 100), (3, 250), (5, 1000), (8, 77)])
def test_infer_k_from_v0_efficiency(k: int, drafts: int) -> None:
    drafted = drafts * k
    emitted = drafts * k * 0.6 + drafts
    efficiency = emitted / (drafts * (k + 1))
    assert infer_num_speculative_tokens(drafted, emitted, efficiency) == k


def test_infer_k_gives_up_on_inconsistent_numbers() -> None:
    assert infer_num_speculative_tokens(100, 50, 0.0) is None
    assert infer_num_speculative_tokens(100, 50, 1.0) is None
