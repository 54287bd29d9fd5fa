"""Config: YAML + flags + env → Config; every bad input is one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode_exporter.cli import build_parser, config_from_args, env_name
from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.sidecar.config import config_from_mapping, load_config_file, parse_windows

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
    assert config.web.listen_address == "127.0.0.1:9999"
    assert config.collect.interval == 2.0
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
        ("cost_model: {c_draft: -1}\n", "cost_model.c_draft: expected a number between 0 and 10, got -1"),
        ("cost_model: {c_draft: 0.1, draft_parameters: 1}\n", "not both"),
        ("windows: [1m, 1m]\n", "windows: windows must be distinct"),
        ("page_threshold: 2\n", "page_threshold: expected a number between 0 and 1, got 2"),
        ("targets: {url: x}\n", "targets: expected a list of targets, got {'url': 'x'}"),
        ("web: {telemetry_path: metrics}\n", "web.telemetry_path: expected a path starting with /"),
        ("web: {telemetry_path: /healthz}\n", "is used by the exporter itself"),
        ("- 1\n- 2\n", "expected a mapping at the top level"),
        ("targets:\n  - url: 'http://x/m'\n    num_speculative_tokens: 0\n",
         "targets[0].num_speculative_tokens: expected an integer >= 1, got 0"),
        ("tap: {listen_adress: ':8001'}\n", "tap.listen_adress: unknown key (did you mean 'listen_address'?)"),
        ("tap: {listen_address: nohost}\n", "tap.listen_address: expected host:port or :port"),
        ("tap: {listen_address: ':8001', upstream: 'https://x:1'}\n", "tap.upstream: expected http://host:port"),
        ("tap: {listen_address: ':8001', target: nope}\n", "tap.target: 'nope' is not one of the targets"),
        ("tap: {listen_address: ':8001', temperature_bands: [0.7, 0.3]}\n", "tap.temperature_bands: must increase"),
        ("tap: {listen_address: ':8001', workload_header: 'a b'}\n", "tap.workload_header: expected an HTTP"),
        ("tap: {listen_address: ':8001', max_workloads: 0}\n",
         "tap.max_workloads: expected an integer >= 1, got 0"),
        ("tap: {listen_address: ':8001', drain_timeout: soon}\n", "tap.drain_timeout: expected a duration"),
        ("tap: {listen_address: ':8001', route: {mode: enforce}}\n", "tap.route.fallback_upstream: required"),
        ("tap: {listen_address: ':8001', route: {fallback_upstream: 'http://f:1', mdoe: enforce}}\n",
         "tap.route.mdoe: unknown key (did you mean 'mode'?)"),
        ("tap: {listen_address: ':8001', route: {fallback_upstream: 'http://f:1', mode: route}}\n",
         "tap.route.mode: expected one of observe, enforce, got 'route'"),
        ("tap: {listen_address: ':8001', route: {fallback_upstream: 'https://f:1'}}\n",
         "tap.route.fallback_upstream: expected http://host:port"),
        ("tap: {listen_address: ':8001', route: {fallback_upstream: 'http://f:1', min_requests: 1}}\n",
         "tap.route.min_requests: expected an integer >= 2, got 1"),
        ("tap: {listen_address: ':8001', route: {fallback_upstream: 'http://f:1', canary_share: 1.5}}\n",
         "tap.route.canary_share: expected a number above 0 and at most 1, got 1.5"),
        ("tap: {listen_address: ':8001', route: {fallback_upstream: 'http://f:1', prompt_length_bands: [9, 3]}}\n",
         "tap.route.prompt_length_bands: expected increasing prompt lengths in tokens"),
        ("tap: {route: {fallback_upstream: 'http://f:1'}}\n", "tap.route: routing needs the request tap"),
        ("tap: {listen_address: ':8001', class_histograms: 'yes'}\n",
         "tap.class_histograms: expected true or false"),
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


def test_tap_defaults_and_a_drain_of_zero() -> None:
    config = config_from_mapping({"targets": [{"name": "vllm", "url": "http://10.0.0.1:8000/metrics"}],
                                  "tap": {"listen_address": ":8001", "drain_timeout": "0s"}}, "f")
    assert config.tap is not None
    assert config.tap.upstream == "http://10.0.0.1:8000" and config.tap.target == "vllm"
    assert config.tap.drain_timeout == 0.0 and config.tap.connect_timeout == 3.0
    assert config.tap.temperature_bands == (0.3, 0.7) and config.tap.workload_header == "x-workload"
    assert config_from_mapping({}, "f").tap is None


def test_route_keys_defaults_flags_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = {"targets": [{"name": "vllm", "url": "http://10.0.0.1:8000/metrics"}],
            "tap": {"listen_address": ":8001", "route": {"fallback_upstream": "http://10.0.0.2:8000/"}}}
    config = config_from_mapping(data, "f")
    assert config.tap is not None and config.tap.route is not None
    route = config.tap.route
    assert (route.fallback_upstream, route.mode, route.min_requests, route.canary_share, route.prompt_length_bands) \
        == ("http://10.0.0.2:8000", "observe", 50, 0.05, ())
    without = config_from_mapping({"tap": {"listen_address": ":8001"}}, "f").tap
    assert without is not None and without.route is None  # routing off without a fallback
    path = tmp_path / "c.yaml"
    path.write_text("tap:\n  listen_address: ':8001'\n  route: {fallback_upstream: 'http://f:1', mode: observe}\n")
    monkeypatch.setenv(env_name("--tap.route.canary-share"), "0.2")
    args = build_parser().parse_args([
        "run", "--config.file", str(path), "--tap.route.mode", "enforce", "--tap.route.min-requests", "20",
        "--tap.route.prompt-length-bands", "1024,4096"])
    flagged = config_from_args(args).tap
    assert flagged is not None and flagged.route is not None
    assert (flagged.route.fallback_upstream, flagged.route.mode, flagged.route.min_requests,
            flagged.route.canary_share, flagged.route.prompt_length_bands) == ("http://f:1", "enforce", 20, 0.2,
                                                                               (1024, 4096))
    assert env_name("--tap.route.fallback-upstream") == "SPECDECODE_TAP_ROUTE_FALLBACK_UPSTREAM"
    monkeypatch.setenv(env_name("--tap.route.fallback-upstream"), "http://g:2")
    monkeypatch.setenv(env_name("--tap.listen-address"), ":8002")
    from_env = config_from_args(build_parser().parse_args(["run"])).tap
    assert from_env is not None and from_env.route is not None and from_env.route.fallback_upstream == "http://g:2"


def test_class_histograms_off_by_default_on_by_key_flag_or_env(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    tapped = {"targets": [{"name": "vllm", "url": "http://10.0.0.1:8000/metrics"}], "tap": {"listen_address": ":1"}}
    default = config_from_mapping(tapped, "f").tap
    assert default is not None and default.class_histograms is False
    keyed = config_from_mapping({**tapped, "tap": {"listen_address": ":1", "class_histograms": True}}, "f").tap
    assert keyed is not None and keyed.class_histograms is True
    path = tmp_path / "c.yaml"
    path.write_text("tap: {listen_address: ':8001', class_histograms: false}\n")
    flagged = config_from_args(build_parser().parse_args(
        ["run", "--config.file", str(path), "--tap.class-histograms"])).tap
    assert flagged is not None and flagged.class_histograms is True
    monkeypatch.setenv(env_name("--tap.class-histograms"), "true")
    from_env = config_from_args(build_parser().parse_args(["run", "--config.file", str(path)])).tap
    assert from_env is not None and from_env.class_histograms is True
    monkeypatch.setenv(env_name("--tap.class-histograms"), "maybe")
    with pytest.raises(ConfigError) as error:
        config_from_args(build_parser().parse_args(["run", "--config.file", str(path)]))
    # the variable that gave the value, not the file's key
    assert str(error.value) == "SPECDECODE_TAP_CLASS_HISTOGRAMS: expected true or false, got 'maybe'"


def test_defaults() -> None:
    config = config_from_mapping({}, "defaults")
    assert config.collect.interval == 5.0
    assert [w.name for w in config.windows] == ["1m", "5m", "15m", "1h"]
    assert config.web.listen_address == ":9877"
    assert config.collect.max_body_size == 16 * 1024 * 1024


def test_windows_keep_their_spelling_shortest_first() -> None:
    assert [(w.name, w.seconds) for w in parse_windows("5m, 90,1m", "--collect.windows")] == [
        ("1m", 60.0), ("90", 90.0), ("5m", 300.0)]
    with pytest.raises(ConfigError, match=r"^--collect\.windows\[1\]: expected a duration like 5s, 1m or 500ms, "
                                          r"got 'soon'$"):
        parse_windows("1m,soon", "--collect.windows")


def test_flags_override_env_which_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, GOOD)
    monkeypatch.setenv(env_name("--collect.interval"), "7s")
    monkeypatch.setenv(env_name("--web.listen-address"), ":1234")
    args = build_parser().parse_args(["run", "--config.file", path, "--web.listen-address", "127.0.0.1:4321"])
    config = config_from_args(args)
    assert config.collect.interval == 7.0  # env beats file
    assert config.web.listen_address == "127.0.0.1:4321"  # flag beats env
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


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # unknown keys, at every depth
        ("web: {listen_adress: ':1'}\n", "web.listen_adress: unknown key (did you mean 'listen_address'?)"),
        ("targets:\n  - url: http://x/m\n    cost_model: {c_drat: 0.1}\n",
         "targets[0].cost_model.c_drat: unknown key (did you mean 'c_draft'?)"),
        ("targets:\n  - url: http://x/m\n    tls_config: {ca_fil: x}\n",
         "targets[0].tls_config.ca_fil: unknown key (did you mean 'ca_file'?)"),
        ("targets:\n  - url: http://x/m\n    baseline: {targt: c}\n",
         "targets[0].baseline.targt: unknown key (did you mean 'target'?)"),
        # wrong types
        ("collect: {concurrency: many}\n", "collect.concurrency: expected an integer, got 'many'"),
        ("collect: {max_body_size: lots}\n", "collect.max_body_size: expected a size like 16MiB, got 'lots'"),
        ("log: {level: loud}\n", "log.level: expected one of debug, info, warn, error, got 'loud'"),
        ("web: []\n", "web: expected a mapping, got []"),
        ("targets:\n  - url: http://x/m\n    labels: [a]\n",
         "targets[0].labels: expected a mapping of label name to value, got ['a']"),
        ("targets:\n  - url: http://x/m\n    labels: {team: [a]}\n",
         "targets[0].labels.team: expected a string value, got ['a']"),
        ("targets:\n  - url: http://x/m\n    method: 3\n",
         "targets[0].method: expected a string like eagle3 or ngram, got 3"),
        ("targets:\n  - url: http://x/m\n    timeout: soon\n",
         "targets[0].timeout: expected a duration like 5s, 1m or 500ms, got 'soon'"),
        ("windows: [1m, soon]\n", "windows[1]: expected a duration like 5s, 1m or 500ms, got 'soon'"),
        # out of range
        ("targets:\n  - url: http://x/m\n    cost_model: {c_verify: 11}\n",
         "targets[0].cost_model.c_verify: expected a number between 0 and 10, got 11"),
        ("targets:\n  - url: http://x/m\n    baseline: {time_per_output_token_seconds: 0}\n",
         "targets[0].baseline.time_per_output_token_seconds: expected a number > 0, got 0"),
        ("tap: {listen_address: ':8001', temperature_bands: [0.3, 11]}\n",
         "tap.temperature_bands[1]: expected a number between 0 and 10, got 11"),
        ("tap: {listen_address: ':8001', connect_timeout: 0s}\n",
         "tap.connect_timeout: must be greater than 0, got '0s'"),
        # missing required keys
        ("targets:\n  - name: a\n", "targets[0].url: required"),
        # the rules between keys, with the messages they always had
        ("targets:\n  - {url: 'http://x/m', cost_model: {draft_parameters: 1}}\n",
         "targets[0].cost_model: draft_parameters and target_parameters go together"),
        ("cost_model: {c_draft: 0.1, target_parameters: 8}\n",
         "cost_model: give c_draft or draft_parameters/target_parameters, not both"),
        ("targets:\n  - {url: 'http://x/m', baseline: {target: c, p99: 0.1}}\n",
         "targets[0].baseline: p50 and p99 go with time_per_output_token_seconds, not with a target"),
        ("targets:\n  - {url: 'http://x/m', tls_config: {key_file: k}}\n",
         "targets[0].tls_config: cert_file and key_file go together"),
        ("targets:\n  - {url: 'http://u:p@x/m'}\n",
         "targets[0].url: credentials in the URL are not allowed; use bearer_token_file"),
        ("targets:\n  - {name: a, url: 'http://x/m'}\n  - {name: a, url: 'http://y/m'}\n",
         "targets: duplicate target name 'a'; every target needs its own name"),
        ("targets:\n  - {url: 'http://x/m', labels: {job: x}}\n",
         "targets[0].labels.job: reserved by the exporter; choose another label name"),
        ("web: {telemetry_path: /-/reload}\n", "web.telemetry_path: /-/reload is used by the exporter itself"),
        ("tap: {listen_address: ':8001', target: nope}\n", "tap.target: 'nope' is not one of the targets (vllm)"),
        # the tap relaying to itself: every request would loop until the sockets run out
        ("tap: {listen_address: '127.0.0.1:8001', upstream: 'http://127.0.0.1:8001'}\n",
         "tap.upstream: http://127.0.0.1:8001 is the tap's own address (tap.listen_address 127.0.0.1:8001): the "
         "tap would relay every request to itself; point it at vLLM"),
        ("targets:\n  - url: http://127.0.0.1:8001/metrics\ntap: {listen_address: ':8001'}\n",
         "tap.upstream: http://127.0.0.1:8001 (the default: the host and port of target 'vllm') is the tap's own "
         "address (tap.listen_address :8001): the tap would relay every request to itself; point it at vLLM"),
        ("tap: {listen_address: '[::]:8001', upstream: 'http://[::1]:8001/'}\n",
         "tap.upstream: http://[::1]:8001 is the tap's own address (tap.listen_address [::]:8001): the tap would "
         "relay every request to itself; point it at vLLM"),
        ("tap: {listen_address: 'localhost:80', route: {fallback_upstream: 'http://LOCALHOST'}}\n",
         "tap.route.fallback_upstream: http://LOCALHOST is the tap's own address (tap.listen_address "
         "localhost:80): the tap would relay every request to itself; point it at vLLM"),
        # no target: an explicit empty list is not the default target; unnamed targets are all called vllm
        ("targets: []\n", "targets: no target configured: list at least one, or leave the key out for the default "
                          "(vllm at http://127.0.0.1:8000/metrics)"),
        ("targets:\n", "targets: no target configured: list at least one, or leave the key out for the default "
                       "(vllm at http://127.0.0.1:8000/metrics)"),
        ("targets:\n  - url: http://x/m\n  - url: http://y/m\n",
         "targets[0]: a target without a name is called 'vllm', as is targets[1]; give each target its own name "
         "(its target label)"),
        ("targets:\n  - {name: vllm, url: 'http://x/m'}\n  - url: http://y/m\n",
         "targets[1]: a target without a name is called 'vllm', as is targets[0]; give each target its own name "
         "(its target label)"),
        ("monitoring: {config_file: /nonexistent.yaml}\n",
         "monitoring.config_file: /nonexistent.yaml: cannot read monitoring config: No such file or directory"),
    ],
)
def test_each_message_in_full(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config_file(write(tmp_path, text))
    assert str(error.value) == f"{tmp_path / 'config.yaml'}: {message}"


@pytest.mark.parametrize(("listen", "upstream"), [
    ("127.0.0.1:8001", "http://127.0.0.1:8000"),  # another port
    ("127.0.0.1:8001", "http://localhost:8001"),  # localhost may be ::1, another socket: left alone
    ("[::]:8001", "http://127.0.0.1:8001"),  # :: is bound v6-only
    ("127.0.0.1:0", "http://127.0.0.1:80"),  # a port the kernel picks
])
def test_a_tap_beside_its_upstream_is_not_taken_for_itself(listen: str, upstream: str) -> None:
    config = config_from_mapping({"tap": {"listen_address": listen, "upstream": upstream}}, "test")
    assert config.tap is not None and config.tap.upstream == upstream


def test_no_targets_key_is_the_default_target() -> None:
    """The documented default (docs/configuration.md): a file without targets collects the vLLM beside it."""
    config = config_from_mapping({"collect": {"timeout": "2s"}}, "test")
    assert [(t.name, t.url, t.timeout) for t in config.targets] == [("vllm", "http://127.0.0.1:8000/metrics", 2.0)]


def test_a_targets_missing_keys_come_from_the_files_sections(tmp_path: Path) -> None:
    config = load_config_file(write(tmp_path, "collect: {timeout: 2s}\ncost_model: {c_verify: 0.2}\n"
                                              "targets:\n  - url: http://x/m\n"
                                              "  - {name: b, url: 'http://y/m', cost_model: {c_draft: 0.3}}\n"))
    first, second = config.targets
    assert first.name == "vllm" and first.timeout == 2.0 and (first.cost.c_draft, first.cost.c_verify) == (0.1, 0.2)
    assert (second.cost.c_draft, second.cost.c_verify) == (0.3, 0.2)


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--collect.interval", "soon"], {}, "--collect.interval: expected a duration like 5s, 1m or 500ms, got 'soon'"),
    (["--collect.interval", "0"], {}, "--collect.interval: must be greater than 0, got '0'"),
    ([], {"--collect.stale-after": "never"}, "SPECDECODE_COLLECT_STALE_AFTER: expected a duration like 5s, 1m or "
                                             "500ms, got 'never'"),  # the variable that gave it
    (["--collect.max-body-size", "huge"], {}, "--collect.max-body-size: expected a size like 16MiB, got 'huge'"),
    (["--collect.windows", "1m,1m"], {}, "--collect.windows: windows must be distinct, got 1m, 1m"),
    (["--log.level", "loud"], {}, "--log.level: expected one of debug, info, warn, error, got 'loud'"),
    (["--web.telemetry-path", "metrics"], {}, "--web.telemetry-path: expected a path starting with /, got 'metrics'"),
    (["--web.telemetry-path", "/healthz"], {}, "web.telemetry_path: /healthz is used by the exporter itself"),
    (["--web.listen-address", "nowhere"], {}, "--web.listen-address: expected host:port or :port, got 'nowhere'"),
    (["--collect.timeout", "1 s"], {}, "--collect.timeout: expected a duration like 5s, 1m or 500ms, got '1 s'"),
    (["--target", "ftp://x"], {}, "--target: expected an http(s) URL like http://127.0.0.1:8000/metrics, "
                                  "got 'ftp://x'"),
])
def test_flags_and_env_are_checked_as_the_keys_are(argv: list[str], env: dict[str, str], message: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for flag, value in env.items():
        monkeypatch.setenv(env_name(flag), value)
    with pytest.raises(ConfigError) as error:
        config_from_args(build_parser().parse_args(["run", *argv]))
    assert str(error.value) == message
