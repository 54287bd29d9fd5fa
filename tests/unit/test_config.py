"""Config: YAML + flags + env → Config; every bad input is one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode_exporter.cli import build_parser, config_from_args, env_name
from specdecode_exporter.core.validation import ConfigError
from specdecode_exporter.sidecar.config import (
    config_from_mapping,
    load_config_file,
    parse_duration,
    parse_size,
)

GOOD = """
web:
  listen_address: "127.0.0.1:9999"
collect:
  interval: 2s
  timeout: 1s
windows: [5m, 1m]
cost_model: {c_draft: 0.05}
targets:
  - name: main
    url: http://127.0.0.1:8000/metrics
    labels: {cluster: eu-1}
    method: eagle3
    num_speculative_tokens: 3
  - name: draft
    url: http://127.0.0.1:8001/metrics
    timeout: 500ms
    cost_model: {draft_parameters: 1.0e9, target_parameters: 8.0e9, c_verify: 0.3}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_a_full_config_loads(tmp_path: Path) -> None:
    config = load_config_file(write(tmp_path, GOOD))
    assert config.listen_address == "127.0.0.1:9999"
    assert config.collect_interval == 2.0
    assert [w.name for w in config.windows] == ["1m", "5m"]
    main, draft = config.targets
    assert main.timeout == 1.0 and draft.timeout == 0.5
    assert main.labels == (("cluster", "eu-1"),)
    assert main.cost.c_draft == 0.05 and main.cost.c_verify == 0.4
    assert draft.cost.c_draft == pytest.approx(0.125) and draft.cost.c_verify == 0.3
    assert main.num_speculative_tokens == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("targets:\n  - url: http://x/metrics\n    timout: 3s\n",
         "targets[0].timout: unknown key (did you mean 'timeout'?)"),
        ("colect: {}\n", "colect: unknown key (did you mean 'collect'?)"),
        ("collect: {interval: soon}\n", "collect.interval: expected a duration like 5s, 1m or 500ms, got 'soon'"),
        ("collect: {interval: 0s}\n", "collect.interval: must be greater than 0"),
        ("targets:\n  - url: ftp://x\n", "targets[0].url: expected an http(s) URL"),
        ("targets:\n  - name: a\n", "targets[0].url: required"),
        ("targets:\n  - {name: a, url: 'http://x/m'}\n  - {name: a, url: 'http://y/m'}\n", "duplicate target name 'a'"),
        ("targets:\n  - {url: 'http://x/m', labels: {model_name: x}}\n", "targets[0].labels.model_name: reserved"),
        ("targets:\n  - {url: 'http://x/m', labels: {'bad-name': x}}\n", "not a valid Prometheus label name"),
        ("cost_model: {c_draft: -1}\n", "cost_model.c_draft: must be between 0 and 10"),
        ("cost_model: {c_draft: 0.1, draft_parameters: 1}\n", "not both"),
        ("windows: [1m, 1m]\n", "windows: windows must be distinct"),
        ("page_threshold: 2\n", "page_threshold: must be between 0 and 1"),
        ("targets: {url: x}\n", "targets: expected a list of targets"),
        ("web: {telemetry_path: metrics}\n", "web.telemetry_path: expected a path starting with /"),
        ("web: {telemetry_path: /healthz}\n", "is used by the exporter itself"),
        ("- 1\n- 2\n", "expected a mapping at the top level"),
        ("targets:\n  - url: 'http://x/m'\n    num_speculative_tokens: 0\n",
         "num_speculative_tokens: must be at least 1"),
        ("proxy: {listen_adress: ':8001'}\n", "proxy.listen_adress: unknown key (did you mean 'listen_address'?)"),
        ("proxy: {listen_address: nohost}\n", "proxy.listen_address: expected host:port or :port"),
        ("proxy: {listen_address: ':8001', upstream: 'https://x:1'}\n", "proxy.upstream: expected http://host:port"),
        ("proxy: {listen_address: ':8001', target: nope}\n", "proxy.target: 'nope' is not one of the targets"),
        ("proxy: {listen_address: ':8001', temperature_bands: [0.7, 0.3]}\n", "proxy.temperature_bands: must increase"),
        ("proxy: {listen_address: ':8001', workload_header: 'a b'}\n", "proxy.workload_header: expected an HTTP"),
        ("proxy: {listen_address: ':8001', max_workloads: 0}\n", "proxy.max_workloads: must be at least 1"),
        ("proxy: {listen_address: ':8001', drain_timeout: soon}\n", "proxy.drain_timeout: expected a duration"),
        ("targets:\n  - {name: a, url: 'http://x/m', baseline: {target: a}}\n",
         "targets[0].baseline.target: 'a' is not a target with spec_decode: false"),
        ("targets:\n  - {name: a, url: 'http://x/m', baseline: {}}\n",
         "targets[0].baseline: give target (a control target) or time_per_output_token_seconds"),
        ("targets:\n  - {name: a, url: 'http://x/m', spec_decode: maybe}\n",
         "targets[0].spec_decode: expected true or false"),
        ("targets:\n  - {name: a, url: 'http://x/m', spec_decode: false, baseline: {target: a}}\n",
         "targets[0].baseline: a control target (spec_decode: false) has no baseline"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config_file(write(tmp_path, text))
    assert message in str(error.value)
    assert "\n" not in str(error.value)
    assert str(error.value).startswith(str(tmp_path))


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+, column \d+: expected"):
        load_config_file(write(tmp_path, "targets:\n  - url: [unclosed\n"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config_file(str(tmp_path / "nope.yaml"))


def test_proxy_defaults_and_a_drain_of_zero() -> None:
    config = config_from_mapping({"targets": [{"name": "vllm", "url": "http://10.0.0.1:8000/metrics"}],
                                  "proxy": {"listen_address": ":8001", "drain_timeout": "0s"}}, "f")
    assert config.proxy is not None
    assert config.proxy.upstream == "http://10.0.0.1:8000" and config.proxy.target == "vllm"
    assert config.proxy.drain_timeout == 0.0 and config.proxy.connect_timeout == 3.0
    assert config.proxy.temperature_bands == (0.3, 0.7) and config.proxy.workload_header == "x-workload"
    assert config_from_mapping({}, "f").proxy is None


def test_defaults() -> None:
    config = config_from_mapping({}, "defaults")
    assert config.collect_interval == 5.0
    assert [w.name for w in config.windows] == ["1m", "5m", "15m", "1h"]
    assert config.listen_address == ":9877"
    assert config.max_body_bytes == 16 * 1024 * 1024


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5), ("1m30s", 90), ("500ms", 0.5), ("1h", 3600), ("2", 2)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == seconds


def test_sizes() -> None:
    assert parse_size("16MiB", "x") == 16 * 1024 * 1024
    assert parse_size("1000", "x") == 1000
    with pytest.raises(ConfigError):
        parse_size("lots", "x")


def test_flags_override_env_which_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, GOOD)
    monkeypatch.setenv(env_name("--collect.interval"), "7s")
    monkeypatch.setenv(env_name("--web.listen-address"), ":1234")
    args = build_parser().parse_args(["run", "--config.file", path, "--web.listen-address", "127.0.0.1:4321"])
    config = config_from_args(args)
    assert config.collect_interval == 7.0  # env beats file
    assert config.listen_address == "127.0.0.1:4321"  # flag beats env
    assert len(config.targets) == 2  # from the file


def test_env_var_names() -> None:
    assert env_name("--web.listen-address") == "SPECDECODE_WEB_LISTEN_ADDRESS"
    assert env_name("--collect.interval") == "SPECDECODE_COLLECT_INTERVAL"


def test_target_flags_replace_file_targets_and_default(tmp_path: Path) -> None:
    args = build_parser().parse_args(["run", "--target", "http://127.0.0.1:1/metrics", "--target",
                                      "second=http://127.0.0.1:2/metrics"])
    config = config_from_args(args)
    assert [(t.name, t.url) for t in config.targets] == [("vllm", "http://127.0.0.1:1/metrics"),
                                                         ("second", "http://127.0.0.1:2/metrics")]
    default = config_from_args(build_parser().parse_args(["run"]))
    assert [t.url for t in default.targets] == ["http://127.0.0.1:8000/metrics"]
