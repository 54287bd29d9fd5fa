"""Scenario loading/validation and the `simulate` CLI's flag handling."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.simulator import default_scenario, load_scenario
from specdecode_exporter.simulator.cli import add_arguments, build_scenario, env_name, main


def test_packaged_scenarios_load() -> None:
    demo = default_scenario()
    assert demo.loop and [p.name for p in demo.phases] == ["healthy", "degraded", "restart", "recovered", "busy"]
    assert [p.restart for p in demo.phases] == [False, False, True, False, False]
    assert 120 <= sum(p.duration for p in demo.phases) <= 600
    steady = default_scenario("steady")
    assert steady.phases == () and steady.models[0].acceptance_rate == 0.75
    with pytest.raises(ConfigError, match="not packaged"):
        default_scenario("nope")


BAD = [
    ("models: [{name: m}]\nphases: [{name: a, duration: 5s}, {name: b, duration: soon}]\n",
     "scenario.yaml: phases[1].duration: expected a duration like 5s, 1m or 500ms, got 'soon'"),
    ("models: [{name: m}]\nphases: [{name: a}]\n", "scenario.yaml: phases[0].duration: required"),
    ("models: [{name: m, acceptance_rate: 1.5}]\n", "scenario.yaml: models[0].acceptance_rate: expected a number"),
    ("models: [{name: m, acceptence_rate: 0.5}]\n", "scenario.yaml: models[0].acceptence_rate: unknown key"),
    ("format: v2\nmodels: [{name: m}]\n", "scenario.yaml: format: expected one of v1, v1-multiproc"),
    ("models: []\n", "scenario.yaml: models: expected a non-empty list"),
    ("models: [{name: m, num_speculative_tokens: 2, position_acceptance: [0.5]}]\n",
     "scenario.yaml: models[0].position_acceptance: expected 2 values"),
    ("models: [{name: m}]\nphases: [{duration: 5s, model: other}]\n",
     "scenario.yaml: phases[0].model: expected one of m"),
    ("models: [{name: m}]\nphases: [{duration: 5s, fault: boom}]\n", "scenario.yaml: phases[0].fault: expected one of"),
    ("models: [{name: m}]\nloop: maybe\n", "scenario.yaml: loop: expected true or false"),
    ("models: [{name: m}, {name: m}]\n", "scenario.yaml: models[1].name: duplicate"),
    ("- just\n- a list\n", "scenario.yaml: expected a mapping at the top level, got ['just', 'a list']"),
    ("models: [{name: m}\n", "scenario.yaml: invalid YAML at line 2, column 1"),
    ("models: [{name: m, engines: 0}]\n", "scenario.yaml: models[0].engines: expected an integer between 1"),
    # every message whole: unknown keys, types, ranges, required keys, the rules between keys
    ("models: [{name: m, acceptence_rate: 0.5}]\n",
     "scenario.yaml: models[0].acceptence_rate: unknown key (did you mean 'acceptance_rate'?)"),
    ("modls: [{name: m}]\nmodels: [{name: m}]\n", "scenario.yaml: modls: unknown key (did you mean 'models'?)"),
    ("models: [{name: m, workloads: [{name: a, shar: 1}]}]\n",
     "scenario.yaml: models[0].workloads[0].shar: unknown key (did you mean 'share'?)"),
    ("models: [{name: m, engines: two}]\n", "scenario.yaml: models[0].engines: expected an integer, got 'two'"),
    ("models: [{name: m, acceptance_rate: 1.5}]\n",
     "scenario.yaml: models[0].acceptance_rate: expected a number between 0 and 1, got 1.5"),
    ("models: [{name: m, draft_fill: 0}]\n",
     "scenario.yaml: models[0].draft_fill: expected a number above 0 and at most 1, got 0"),
    ("models: [{name: m}]\nseed: -1\n",
     "scenario.yaml: seed: expected an integer between 0 and 9223372036854775807, got -1"),
    ("models: [{name: m}]\nphases: [{duration: 0s}]\n",
     "scenario.yaml: phases[0].duration: must be greater than 0, got '0s'"),
    ("models: [{name: m}]\nphases: {a: 1}\n", "scenario.yaml: phases: expected a list of phases, got {'a': 1}"),
    ("phases: []\n", "scenario.yaml: models: required (a non-empty list of models)"),
    ("models: [{name: m, workloads: [{name: a}, {name: a}]}]\n",
     "scenario.yaml: models[0].workloads: workload names must be distinct"),
    ("models: [{name: m, workloads: []}]\n",
     "scenario.yaml: models[0].workloads: expected a non-empty list of workloads, got []"),
    ("format: llamacpp\nmodels: [{name: a}, {name: b}]\n",
     "scenario.yaml: models: format llamacpp names no model; expected one model"),
    ("format: v0\nmodels: [{name: m, engines: 2}]\n",
     "scenario.yaml: models[0].engines: format v0 has no engine label; expected 1"),
    ("models: [{name: m, num_speculative_tokens: 2}]\nphases: [{duration: 5s, position_acceptance: [0.5]}]\n",
     "scenario.yaml: phases[0].position_acceptance: expected 2 values for model 'm', got 1"),
    ("models: [{name: m, num_speculative_tokens: 2, draft_fill: 0.5, position_acceptance: [1, 1]}]\n",
     "scenario.yaml: models[0].position_acceptance: implies more accepted than drafted tokens with draft_fill 0.5"),
]


def test_unnamed_workloads_and_phases_are_named_by_their_place(tmp_path: Path) -> None:
    path = tmp_path / "named.yaml"
    path.write_text("models: [{name: m, workloads: [{share: 1}, {name: b}]}]\nphases: [{duration: 1m30s}]\n")
    scenario = load_scenario(path)
    assert [w.name for w in scenario.models[0].workloads] == ["w0", "b"]
    assert [(p.name, p.duration) for p in scenario.phases] == [("phases[0]", 90.0)]
    assert scenario.name == "named"


@pytest.mark.parametrize(("text", "message"), BAD)
def test_scenario_errors_are_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(str(tmp_path) + "/")
    assert line.removeprefix(str(tmp_path) + "/").startswith(message), line


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read scenario"):
        load_scenario(tmp_path / "missing.yaml")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_build_a_steady_scenario() -> None:
    s = build_scenario(parse(["--acceptance-rate", "0.4", "--model-name", "tiny", "--engines", "2",
                              "--num-speculative-tokens", "5", "--drafts-per-second", "10", "--format",
                              "v1-multiproc", "--seed", "7"]))
    assert s.format == "v1-multiproc" and s.seed == 7 and s.phases == ()
    m = s.models[0]
    assert (m.name, m.engines, m.num_speculative_tokens, m.drafts_per_second, m.acceptance_rate) == (
        "tiny", 2, 5, 10.0, 0.4)
    assert not m.request_acceptance_histogram  # as every released vLLM
    proposed = build_scenario(parse(["--request-acceptance-histogram", "true"]))
    assert proposed.models[0].request_acceptance_histogram


def test_env_vars_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_name("--web.listen-address") == "SPECDECODE_SIMULATE_WEB_LISTEN_ADDRESS"
    monkeypatch.setenv("SPECDECODE_SIMULATE_FORMAT", "v0")
    monkeypatch.setenv("SPECDECODE_SIMULATE_ACCEPTANCE_RATE", "0.6")
    s = build_scenario(parse([]))
    assert s.format == "v0" and s.models[0].acceptance_rate == 0.6


@pytest.mark.parametrize(("argv", "needle"), [
    (["--time-scale", "fast"], "--time-scale: expected a positive number, got 'fast'"),
    (["--format", "v9"], "--format: expected one of"),
    (["--acceptance-rate", "2"], "--acceptance-rate: expected a number between 0 and 1"),
    (["--web.listen-address", "nowhere"], "--web.listen-address: expected host:port"),
    (["--engines", "2", "--format", "v0"], "--engines: format v0"),
    (["--request-acceptance-histogram", "maybe"], "--request-acceptance-histogram: expected true or false"),
    (["--scenario", "/nonexistent/x.yaml"], "/nonexistent/x.yaml: cannot read scenario"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(parse(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
