"""The config tree is the one declaration: run's flag table, `run --help`, the environment variables, the reload's
keys and docs/configuration.md's reference all agree with it."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdecode_exporter.cli import (
    DEPRECATED_FLAGS,
    RUN_FLAGS,
    build_parser,
    check_environment,
    config_from_args,
    flag_help,
    main,
)
from specdecode_exporter.core.config.settings import get, setting, tree
from specdecode_exporter.core.config.validation import ConfigError, Duration, Int, Section, validate
from specdecode_exporter.sidecar.config import OUTER_FLAGS, SETTINGS, reference_table
from specdecode_exporter.sidecar.reload import APPLIED, RESTART_ONLY

ROOT = Path(__file__).resolve().parents[2]


def run_parser() -> argparse.ArgumentParser:
    (commands,) = [a for a in build_parser(["run"])._actions if isinstance(a, argparse._SubParsersAction)]
    parser: argparse.ArgumentParser = commands.choices["run"]
    return parser


def test_the_flag_table_is_the_trees_settings_with_a_flag() -> None:
    assert [s.key for s in RUN_FLAGS] == [s.key for s in SETTINGS if s.flag]
    options = {name: action for action in run_parser()._actions for name in action.option_strings}
    for item in RUN_FLAGS:
        assert item.flag in options, item.key
        assert options[item.flag].help == flag_help(item)
    flags = {name for name in options if name.startswith("--")}
    hidden = {s.flag for s in DEPRECATED_FLAGS}  # the tap's --proxy.* names, for one more release
    assert flags - {s.flag for s in RUN_FLAGS} == {"--help", *(outer.flag for outer in OUTER_FLAGS), *hidden}
    assert all(options[flag].help == argparse.SUPPRESS for flag in hidden)
    assert {outer.flag for outer in OUTER_FLAGS} == {"--config.file", "--target", "--control-target"}


def test_the_file_and_the_targets_flags_are_declared_once() -> None:
    """--config.file and --target are not settings of the tree (a file, a list), but their help, their variables
    and their rows in the reference come from one declaration each."""
    options = {name: action for action in run_parser()._actions for name in action.option_strings}
    rows = reference_table().splitlines()[2:]
    assert [outer.env for outer in OUTER_FLAGS] == [  # the contract
        "SPECDECODE_CONFIG_FILE", "SPECDECODE_TARGET", "SPECDECODE_CONTROL_TARGET"]
    for outer, row in zip(OUTER_FLAGS, rows, strict=False):
        assert options[outer.flag].help == outer.flag_help
        assert f"| `{outer.flag}` | `{outer.env}` |" in row and outer.help in row


def test_help_names_each_flag_its_default_and_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for item in RUN_FLAGS:
        assert item.flag in text and f"env {item.env}" in text
        assert " ".join(f"(default {item.shown};".split()) in text


def test_each_variable_is_known_and_sets_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    check_environment(run_parser(), {s.env: "x" for s in RUN_FLAGS if s.env})  # none is refused as unknown
    monkeypatch.setenv("SPECDECODE_COLLECT_INTERVAL", "7s")
    assert get(config_from_args(build_parser().parse_args(["run"])), "collect.interval") == 7.0
    with pytest.raises(ConfigError, match=r"^SPECDECODE_COLLECT_MAX_BODY_SIZE: expected a size"):
        monkeypatch.setenv("SPECDECODE_COLLECT_MAX_BODY_SIZE", "lots")
        config_from_args(build_parser().parse_args(["run"]))


def test_the_docs_reference_is_the_tree() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", doc, re.DOTALL)
    assert block is not None and block.group(1) == reference_table()
    rows = block.group(1).splitlines()[2 + len(OUTER_FLAGS):]
    assert [row.split("|")[1].strip().strip("`") for row in rows] == [s.key for s in SETTINGS]
    for row, item in zip(rows, SETTINGS, strict=True):
        assert (f"`{item.flag}`" in row) == bool(item.flag)
        assert ("| applied |" in row) == item.reload


def test_the_reload_applies_what_the_tree_says() -> None:
    runtime = [s for s in SETTINGS if s.key.partition(".")[0] in ("web", "collect", "log", "monitoring", "windows")]
    assert {s.key for s in runtime if s.reload} <= set(APPLIED)
    assert {s.key for s in runtime if not s.reload} | {"tap"} == set(RESTART_ONLY)
    assert all(not s.reload for s in SETTINGS if s.key.startswith("tap."))  # the tap restarts as a whole



@dataclass(frozen=True, slots=True)
class Inner(Section):
    pause: Duration = setting(90.0, "how long to wait")
    tries: Int = setting(3, "how often to try", flag="--retry.count", reload=False)
    secret: str = setting("x", "file only", flag=False)


@dataclass(frozen=True, slots=True)
class Outer(Section):
    retry: Inner = Inner()


def test_a_setting_is_one_declaration() -> None:
    """What one `setting` line gives: the key, flag, variable, type, default text and whether a reload applies it."""
    pause, tries, secret = tree(Outer)
    assert (pause.key, pause.flag, pause.env, pause.type_name, pause.shown, pause.reload) == (
        "retry.pause", "--retry.pause", "SPECDECODE_RETRY_PAUSE", "duration", "1m30s", True)
    assert (tries.key, tries.flag, tries.env, tries.type_name, tries.reload) == (
        "retry.tries", "--retry.count", "SPECDECODE_RETRY_COUNT", "integer", False)
    assert secret.flag is None and secret.env is None
    # A flag's text becomes the file's value: the number an integer key wants, the text a duration parses.
    assert tries.from_text("5") == 5 and pause.from_text("2m") == "2m"
    assert validate(Outer, {"retry": {"pause": pause.from_text("2m"), "tries": tries.from_text("5")}}) == Outer(
        Inner(pause=120.0, tries=5))
