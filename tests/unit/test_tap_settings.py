"""The tap's settings (tap/settings.py): declared once, named tap.* (keys, flags, variables), the old proxy.* names
working for one more release with one warning line each, and one setting given by both names refused in one line
naming both. Config from files, real argv and environments; the tap's own process checked in a fresh interpreter."""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from specdecode_exporter.cli import DEPRECATED_FLAGS, RUN_FLAGS, build_parser, check_environment, config_from_args
from specdecode_exporter.cli import main as cli_main
from specdecode_exporter.core.config.validation import ConfigError, SourcedError
from specdecode_exporter.sidecar.config import SETTINGS, Config, load_config_file
from specdecode_exporter.sidecar.reload import describe_changes
from specdecode_exporter.tap.process import TapProcessSettings
from specdecode_exporter.tap.settings import RouteSettings, TapSettings

TARGET = "targets: [{name: vllm, url: 'http://10.0.0.1:8000/metrics'}]\n"
NEW_FILE = TARGET + "tap: {listen_address: ':8001', workload_header: x-team, route: {fallback_upstream: 'http://f:1'}}\n"
OLD_FILE = NEW_FILE.replace("tap:", "proxy:")


def load(tmp_path: Path, text: str, argv: Sequence[str] = (), env: dict[str, str] | None = None,
         monkeypatch: pytest.MonkeyPatch | None = None) -> Config:
    """The config `run --config.file FILE ARGV` reads with ``env`` set (nothing else of SPECDECODE_*)."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    if monkeypatch is not None:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
    return config_from_args(build_parser().parse_args(["run", "--config.file", str(path), *argv]))


@pytest.fixture(autouse=True)
def no_exporter_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("SPECDECODE_")]:
        monkeypatch.delenv(name)


def test_every_tap_setting_is_one_declaration_of_the_tree() -> None:
    """The tree's tap.* settings are tap/settings.py's fields, in order, each with its flag and variable from its
    key unless file-only: declaring a field is all it takes."""
    declared = [f"tap.{f.name}" for f in dataclasses.fields(TapSettings) if f.name != "route"]
    declared += [f"tap.route.{f.name}" for f in dataclasses.fields(RouteSettings)]
    tap = [s for s in SETTINGS if s.key.startswith("tap.")]
    assert [s.key for s in tap] == declared
    for item in tap:
        if item.flag:
            assert item.flag == "--" + item.key.replace("_", "-") and item.env == "SPECDECODE_" + item.key.replace(
                ".", "_").upper()
    assert {s.key for s in SETTINGS if s.key.startswith("proxy")} == set()  # the old names are not settings


def test_the_new_names_set_the_tap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load(tmp_path, NEW_FILE, ["--tap.route.mode", "enforce"], {"SPECDECODE_TAP_CLASS_HISTOGRAMS": "true"},
                  monkeypatch)
    assert config.tap is not None and config.tap.route is not None
    assert (config.tap.listen_address, config.tap.upstream, config.tap.workload_header) == (
        ":8001", "http://10.0.0.1:8000", "x-team")
    assert config.tap.class_histograms is True and config.tap.route.mode == "enforce"
    assert config.deprecated == ()


@pytest.mark.parametrize(("text", "argv", "env", "warning"), [
    (OLD_FILE, [], {}, "the config file's section proxy is deprecated and goes in the next release: call it tap "
                       "(the keys in it stay the same)"),
    (NEW_FILE, ["--proxy.route.mode", "enforce"], {},
     "--proxy.route.mode is deprecated and goes in the next release: use --tap.route.mode"),
    (NEW_FILE, [], {"SPECDECODE_PROXY_ROUTE_MODE": "enforce"},
     "SPECDECODE_PROXY_ROUTE_MODE is deprecated and goes in the next release: use SPECDECODE_TAP_ROUTE_MODE"),
])
def test_an_old_name_sets_what_the_new_one_does_with_one_warning_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, argv: list[str], env: dict[str, str],
        warning: str) -> None:
    new = load(tmp_path, NEW_FILE, ["--tap.route.mode", "enforce"] if argv or env else [])
    old = load(tmp_path, text, argv, env, monkeypatch)
    assert old.tap == new.tap
    assert old.deprecated == (warning,)


def test_every_old_name_used_is_named_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load(tmp_path, OLD_FILE, ["--proxy.class-histograms", "--proxy.upstream", "http://u:2"],
                  {"SPECDECODE_PROXY_ROUTE_MIN_REQUESTS": "9", "SPECDECODE_PROXY_UPSTREAM": "http://v:3"}, monkeypatch)
    assert config.tap is not None and config.tap.route is not None
    assert (config.tap.class_histograms, config.tap.upstream, config.tap.route.min_requests) == (True, "http://u:2", 9)
    assert [line.split()[0] for line in config.deprecated] == [
        "the", "--proxy.upstream", "--proxy.class-histograms", "SPECDECODE_PROXY_ROUTE_MIN_REQUESTS"]
    assert all("\n" not in line for line in config.deprecated)


@pytest.mark.parametrize(("text", "argv", "env", "message", "sourced"), [
    (TARGET + "proxy: {upstream: 'http://u:1'}\ntap: {listen_address: ':1', upstream: 'http://u:2'}\n", [], {},
     "{path}: proxy.upstream and tap.upstream both set tap.upstream: proxy.upstream is its deprecated name; give it "
     "once, as tap.upstream", False),
    (OLD_FILE, ["--tap.listen-address", ":9"], {},
     "{path}: proxy.listen_address and --tap.listen-address both set tap.listen_address: proxy.listen_address is its "
     "deprecated name; give it once, as --tap.listen-address", False),
    (NEW_FILE, ["--proxy.listen-address", ":9"], {},
     "{path}: --proxy.listen-address and tap.listen_address both set tap.listen_address: --proxy.listen-address is "
     "its deprecated name; give it once, as tap.listen_address", False),
    (TARGET, ["--tap.route.mode", "enforce"], {"SPECDECODE_PROXY_ROUTE_MODE": "observe"},
     "SPECDECODE_PROXY_ROUTE_MODE and --tap.route.mode both set tap.route.mode: SPECDECODE_PROXY_ROUTE_MODE is its "
     "deprecated name; give it once, as --tap.route.mode", True),
    (TARGET, [], {"SPECDECODE_PROXY_LISTEN_ADDRESS": ":1", "SPECDECODE_TAP_LISTEN_ADDRESS": ":2"},
     "SPECDECODE_PROXY_LISTEN_ADDRESS and SPECDECODE_TAP_LISTEN_ADDRESS both set tap.listen_address: "
     "SPECDECODE_PROXY_LISTEN_ADDRESS is its deprecated name; give it once, as SPECDECODE_TAP_LISTEN_ADDRESS", True),
    # a setting of the old route section against the same setting by its new flag
    (TARGET + "proxy: {route: {mode: enforce, fallback_upstream: 'http://f:1'}}\n", ["--tap.route.mode", "observe"],
     {}, "{path}: proxy.route.mode and --tap.route.mode both set tap.route.mode: proxy.route.mode is its deprecated "
         "name; give it once, as --tap.route.mode", False),
])
def test_one_setting_given_by_both_names_is_one_line_naming_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, argv: list[str], env: dict[str, str],
        message: str, sourced: bool) -> None:
    with pytest.raises(ConfigError) as error:
        load(tmp_path, text, argv, env, monkeypatch)
    assert str(error.value) == message.format(path=tmp_path / "config.yaml")
    assert isinstance(error.value, SourcedError) == sourced  # a flag's or variable's error has no file path


def test_old_and_new_names_of_different_settings_go_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load(tmp_path, TARGET + "proxy: {listen_address: ':8001'}\ntap: {route: {fallback_upstream: 'http://f:1'}}\n",
                  ["--proxy.route.min-requests", "7"], {"SPECDECODE_TAP_ROUTE_MODE": "enforce"}, monkeypatch)
    assert config.tap is not None and config.tap.route is not None
    assert (config.tap.listen_address, config.tap.route.min_requests, config.tap.route.mode) == (":8001", 7, "enforce")


@pytest.mark.parametrize(("text", "message"), [
    ("proxy: {listen_adress: ':8001'}\n", "proxy.listen_adress: unknown key (did you mean 'listen_address'?)"),
    ("proxy: {listen_address: ':8001', route: {fallback_upstream: 'http://f:1', mode: route}}\n",
     "proxy.route.mode: expected one of observe, enforce, got 'route'"),
    ("proxy: {listen_address: '127.0.0.1:8001', upstream: 'http://127.0.0.1:8001'}\n",
     "proxy.upstream: http://127.0.0.1:8001 is the tap's own address (proxy.listen_address 127.0.0.1:8001): the tap "
     "would relay every request to itself; point it at vLLM"),
    ("proxy: {route: {fallback_upstream: 'http://f:1'}}\n",
     "proxy.route: routing needs the request tap: set proxy.listen_address (--tap.listen-address)"),
    ("proxy: 5\n", "proxy: expected a mapping, got 5"),
])
def test_an_error_in_the_old_section_names_it_as_the_file_does(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config_file(str(path))
    assert str(error.value) == f"{path}: {message}"


def test_a_bad_value_in_an_old_flag_or_variable_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SourcedError, match=r"^--proxy\.route\.mode: expected one of observe, enforce, got 'x'$"):
        load(tmp_path, NEW_FILE, ["--proxy.route.mode", "x"])
    with pytest.raises(SourcedError, match=r"^SPECDECODE_PROXY_LISTEN_ADDRESS: expected host:port or :port"):
        load(tmp_path, TARGET, [], {"SPECDECODE_PROXY_LISTEN_ADDRESS": "nowhere"}, monkeypatch)


def test_help_shows_the_tap_names_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["run", "--help"])
    text = capsys.readouterr().out
    assert "--tap.listen-address" in text and "SPECDECODE_TAP_ROUTE_MODE" in text
    assert "proxy" not in text
    assert {s.flag for s in DEPRECATED_FLAGS} == {s.flag.replace("--tap.", "--proxy.") for s in RUN_FLAGS
                                                  if s.flag and s.flag.startswith("--tap.")}


def test_the_old_variables_are_known_and_a_misspelt_one_is_not() -> None:
    (commands,) = [a for a in build_parser(["run"])._actions if isinstance(a, argparse._SubParsersAction)]
    run = commands.choices["run"]
    check_environment(run, {"SPECDECODE_PROXY_ROUTE_MODE": "enforce", "SPECDECODE_TAP_ROUTE_MODE": "enforce"})
    with pytest.raises(ConfigError, match="SPECDECODE_PROXY_ROUTE_MDOE: not a variable of specdecode-exporter run; "
                                          "did you mean SPECDECODE_PROXY_ROUTE_MODE"):
        check_environment(run, {"SPECDECODE_PROXY_ROUTE_MDOE": "enforce"})


def test_the_tap_process_is_handed_the_validated_settings_as_they_are(tmp_path: Path) -> None:
    """What crosses to the tap's process is the config's TapSettings object (pickled), nothing copied field by field;
    its declarations load in a fresh interpreter without pydantic, yaml or the exposition library."""
    config = load(tmp_path, NEW_FILE)
    assert config.tap is not None
    handed = pickle.loads(pickle.dumps(TapProcessSettings(config.tap, None, "info", "logfmt")))
    assert handed.tap == config.tap and type(handed.tap) is TapSettings
    code = ("import sys, pickle; from specdecode_exporter.tap import process; "
            "settings = pickle.loads(sys.stdin.buffer.read()); "
            "print(settings.tap.route.fallback_upstream, settings.tap.workload_header, "
            "sorted(m for m in ('pydantic', 'pydantic_core', 'yaml', 'prometheus_client') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(handed), capture_output=True,
                            timeout=60, check=True)
    assert result.stdout.decode().split() == ["http://f:1", "x-team", "[]"]


def test_a_reload_that_only_renames_changes_nothing_and_a_changed_tap_setting_waits_for_a_restart(
        tmp_path: Path) -> None:
    old, new = load(tmp_path, OLD_FILE), load(tmp_path, NEW_FILE)
    assert describe_changes(old, new) == []
    changed = load(tmp_path, NEW_FILE.replace("x-team", "x-tenant"))
    assert describe_changes(new, changed) == ["tap changed; it applies after a restart"]
