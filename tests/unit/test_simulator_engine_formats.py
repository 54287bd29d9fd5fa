"""The simulator's llama.cpp, SGLang, TensorRT-LLM and TGI expositions against the fixtures (a real llama-server
capture for llama.cpp; the other fixtures were written from the engines' sources)."""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import pytest

from specdecode_exporter.core.config.flags import UsageError
from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.pipeline.engines import ALL_PREFIXES, NO_SPEC_METRICS, detect_engine, no_engine_detail
from specdecode_exporter.pipeline.parse import select
from specdecode_exporter.simulator import ModelSpec, Scenario, Simulator, scenario_from_dict, sglang_responses
from specdecode_exporter.simulator.cli import add_arguments, build_scenario
from specdecode_exporter.simulator.engine_formats import WRITERS, cpp_number
from specdecode_exporter.simulator.exposition import render
from specdecode_exporter.simulator.requests import Call, generate
from specdecode_exporter.simulator.scenario import ENGINE_FORMATS
from tests.helpers import fixture_text
from tests.unit.test_simulator_exposition import label_orders, signatures

REFERENCE = {
    "llamacpp": "llamacpp_real/draft_model/metrics_after.prom",
    "sglang": "sglang_spec.prom",
    "trtllm": "trtllm_spec.prom",
    "tgi": "tgi_spec.prom",
}
ENGINES = {"sglang": 2}  # the SGLang fixture has two DP ranks; the others have no rank label


def exposition(fmt: str, seconds: float = 120.0, **spec: object) -> str:
    model = ModelSpec(engines=ENGINES.get(fmt, 1), num_speculative_tokens=4, method="mtp", **spec)  # type: ignore[arg-type]
    sim = Simulator(Scenario(models=(model,), format=fmt), clock=lambda: 0.0, wall_epoch=1.795e9)
    sim.advance(seconds)
    return render(fmt, sim.snapshot()).decode()


def family_order(text: str) -> list[str]:
    return re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE)


def test_every_engine_format_has_a_writer() -> None:
    assert set(WRITERS) == set(ENGINE_FORMATS)


@pytest.mark.parametrize("fmt", sorted(REFERENCE))
def test_engine_formats_match_reference_families(fmt: str) -> None:
    ours, ref = exposition(fmt), fixture_text(REFERENCE[fmt])
    mine, theirs = signatures(ours), signatures(ref)
    for name, sig in mine.items():
        assert name in theirs, f"{name} is not in {REFERENCE[fmt]}"
        assert sig[:2] == theirs[name][:2], name
        assert sig[2] <= theirs[name][2], name
    speculative = re.compile(r"spec|skipped_tokens")
    assert {n for n in mine if speculative.search(n)} == {n for n in theirs if speculative.search(n)}
    ref_orders = label_orders(ref)
    for sample, orders in label_orders(ours).items():
        assert orders <= ref_orders[sample], sample


def test_llamacpp_lays_out_families_as_the_real_server_does() -> None:
    assert family_order(exposition("llamacpp")) == family_order(fixture_text(REFERENCE["llamacpp"]))
    before = exposition("llamacpp", seconds=0.0)  # no draft yet: no per-position family, as metrics_before.prom
    assert family_order(before) == family_order(fixture_text("llamacpp_real/draft_model/metrics_before.prom"))
    assert "{" not in "".join(line for line in exposition("llamacpp").splitlines() if "per_pos" not in line)


def test_llamacpp_prints_six_significant_digits() -> None:
    assert [cpp_number(v) for v in (1283945, 999999, 0, 98.21143, 0.4127314)] == [
        "1.28394e+06", "999999", "0", "98.2114", "0.412731"]
    text = exposition("llamacpp", seconds=2000.0, drafts_per_second=200.0)  # 1.6e6 drafted tokens
    drafted = re.search(r"^llamacpp:spec_decode_num_draft_tokens_total (\S+)$", text, flags=re.MULTILINE)
    assert drafted is not None and drafted.group(1) == "1.6e+06"


def test_trtllm_counters_appear_with_the_first_draft() -> None:
    before, after = exposition("trtllm", seconds=0.0), exposition("trtllm")
    assert "trtllm_speculative_config_info" in before and "spec_method=\"MTP\"" in before
    assert "trtllm_spec_decode_num_draft_tokens_total" not in before
    assert "trtllm_spec_decode_num_draft_tokens_total" in after


@pytest.mark.parametrize(("fmt", "models", "engines", "problem"), [
    ("llamacpp", 2, 1, "names no model"),
    ("tgi", 2, 1, "names no model"),
    ("llamacpp", 1, 2, "no engine label"),
    ("trtllm", 1, 2, "no engine label"),
])
def test_scenarios_respect_what_each_format_can_say(fmt: str, models: int, engines: int, problem: str) -> None:
    data = {"format": fmt, "models": [{"name": f"m{i}", "engines": engines} for i in range(models)]}
    with pytest.raises(ConfigError, match=problem):
        scenario_from_dict(data)


def test_sglang_takes_several_engines_and_models() -> None:
    data = {"format": "sglang", "models": [{"name": "a", "engines": 2}, {"name": "b"}]}
    assert scenario_from_dict(data).format == "sglang"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("fmt", ENGINE_FORMATS)
def test_simulate_format_flag_takes_every_engine_format(fmt: str) -> None:
    assert build_scenario(parse(["--format", fmt])).format == fmt  # the packaged demo: one model, one engine


def test_simulate_refuses_engines_a_format_cannot_label() -> None:
    with pytest.raises(UsageError, match="no engine label"):
        build_scenario(parse(["--format", "llamacpp", "--engines", "2"]))


@pytest.mark.parametrize("fmt", ENGINE_FORMATS)
def test_drop_spec_fault_leaves_nothing_to_detect(fmt: str) -> None:
    sim = Simulator(Scenario(models=(ModelSpec(engines=ENGINES.get(fmt, 1)),), format=fmt), clock=lambda: 0.0)
    sim.advance(30.0)
    samples = select(render(fmt, sim.snapshot(), drop_spec=True).decode(), ALL_PREFIXES).samples()
    assert detect_engine(samples) is None
    assert no_engine_detail(samples) == NO_SPEC_METRICS


def _shape(value: object) -> object:
    """The members and their order, all the way down (values replaced by their type)."""
    if isinstance(value, dict):
        return [(key, _shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_shape(item) for item in value[:1]]
    return type(value).__name__ if value is not None else None


@pytest.mark.parametrize("chat", [False, True])
def test_the_sglang_formats_answers_have_sglangs_shape(chat: bool) -> None:
    """The simulator's SGLang responses (format sglang) member for member as tests/fixtures/sglang_openai/ (which
    follow SGLang's serializers, SGLang #33518): the whole body, and a stream's events in order."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "sglang_openai"
    spec = ModelSpec()
    call = Call(chat, spec.name, 40, True, True, 1, 0.0, spec_details=True)
    generation = generate(spec, 0.7, 40, 0.02, 0.1, random.Random(0))
    name = "chat" if chat else "completion"
    body = sglang_responses.response_body(call, [generation], 17)
    assert _shape(body) == _shape(json.loads((fixtures / f"{name}_nonstream.json").read_bytes()))
    events = [json.loads(e[len(b"data: "):]) for e in sglang_responses.stream_events(call, generation, 17)
              if e.startswith(b"data: {")]
    expected = [json.loads(e[len(b"data: "):]) for e in (fixtures / f"{name}_stream_usage.sse").read_bytes()
                .split(b"\n\n") if e.startswith(b"data: {")]
    assert _shape(events[0]) == _shape(expected[0]) and _shape(events[-3:]) == _shape(expected[-3:])
    assert {str(_shape(e)) for e in events[1:-2]} <= {str(_shape(e)) for e in expected[1:-2]}
    details = body["sglext"]["spec_tokens_details"]
    assert details["spec_num_proposed_drafts"] == generation.drafted and sum(
        details["spec_correct_drafts_histogram"]) == details["spec_verify_ct"] == generation.spec_steps
