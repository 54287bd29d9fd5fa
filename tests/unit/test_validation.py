"""core.config.validation: the one duration syntax, sizes, numbers, sections and the one-line errors every config file
and flag gives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field

from specdecode_exporter.core.config.validation import (
    Bool,
    Choice,
    ConfigError,
    Duration,
    DurationOrZero,
    Int,
    Number,
    PromDuration,
    PromDurationOrZero,
    Range,
    Section,
    Text,
    fail,
    parse_duration,
    parse_size,
    read_yaml,
    seconds,
    validate,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("500ms", 0.5), ("5s", 5.0), ("1m", 60.0), ("1m30s", 90.0), ("1h", 3600.0), ("1d", 86400.0), ("1w", 604800.0),
    ("1h30m", 5400.0), ("1.5s", 1.5), (" 5s ", 5.0), ("2", 2.0), ("0.25", 0.25), (12, 12.0), (0.5, 0.5),
])
def test_every_duration_form_is_seconds(text: str | float, expected: float) -> None:
    assert seconds(text) == expected
    assert validate(Duration, text) == expected
    assert parse_duration(text, "--flag") == expected


@pytest.mark.parametrize("text", ["soon", "", "5 s", "1h 2m", "s", "5x", "-3s", "inf", "nan", True, None, [5]])
def test_what_is_not_a_duration(text: object) -> None:
    with pytest.raises(ConfigError) as error:
        validate(Duration, text, "f.yaml", at=("collect", "interval"))
    line = str(error.value)
    assert line.startswith("f.yaml: collect.interval: ") and "\n" not in line


def test_a_duration_error_says_what_was_expected_and_given() -> None:
    with pytest.raises(ConfigError, match=r"^--collect\.interval: expected a duration like 5s, 1m or 500ms, "
                                          r"got 'soon'$"):
        parse_duration("soon", "--collect.interval")


@pytest.mark.parametrize("zero", ["0s", 0, "0"])
def test_zero_only_where_allowed(zero: object) -> None:
    with pytest.raises(ConfigError, match="must be greater than 0"):
        validate(Duration, zero, "x")
    assert validate(DurationOrZero, zero) == 0.0
    assert parse_duration(str(zero), "--drain", allow_zero=True) == 0.0
    with pytest.raises(ConfigError, match="must be 0 or more, got '-1'"):
        validate(DurationOrZero, "-1", "x")


@pytest.mark.parametrize(("text", "expected"), [
    ("5m", "5m"), ("1h", "1h"), ("1d", "1d"), ("1w", "1w"), ("1h30m", "1h30m"), ("500ms", "500ms"),
    ("90", "1m30s"), (300, "5m"), ("1.5h", "1h30m"), ("30m1h", "1h30m"), ("0.25", "250ms"),
])
def test_prometheus_durations_keep_their_spelling_or_get_prometheus_one(text: object, expected: str) -> None:
    assert validate(PromDuration, text) == expected


def test_prometheus_durations_refuse_what_prometheus_cannot_say() -> None:
    with pytest.raises(ConfigError, match="whole milliseconds"):
        validate(PromDuration, "1.0005s", "x")
    with pytest.raises(ConfigError, match="must be greater than 0"):
        validate(PromDuration, "0s", "x")
    assert validate(PromDurationOrZero, "0s") == "0s"
    assert validate(PromDurationOrZero, 0) == "0s"


@pytest.mark.parametrize(("text", "expected"), [("16MiB", 16 * 1024**2), ("1000", 1000), (1000, 1000),
                                                ("1GB", 10**9), ("512 KiB", 512 * 1024), ("2kb", 2000)])
def test_sizes(text: object, expected: int) -> None:
    assert parse_size(text, "x") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "message"), [("lots", "expected a size like 16MiB, got 'lots'"),
                                               ("0", "must be greater than 0, got '0'"),
                                               (True, "expected a size like 16MiB, got True")])
def test_bad_sizes(text: object, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^--collect.max-body-size: {message}$"):
        parse_size(text, "--collect.max-body-size")  # type: ignore[arg-type]


@dataclass(frozen=True)
class Inner(Section):
    share: Annotated[Number, Range(0, 1)] = 1.0
    count: Annotated[Int, Range(1)] = 1
    above: Annotated[Number, Range(0, above=True)] = 1.0
    on: Bool = False
    mode: Annotated[str, Choice("fast", "slow")] = "fast"
    for_: Annotated[PromDurationOrZero, Field(alias="for")] = "0s"


@dataclass(frozen=True)
class Outer(Section):
    NULL_IS_EMPTY = True
    name: Text = "x"
    interval: Duration = 5.0
    inner: tuple[Inner, ...] = ()
    low: float = 0.0
    high: float = 1.0

    def cross_check(self, context: object) -> Outer:
        if self.high < self.low:
            raise fail(f"must not be below low ({self.low:g})", "high")
        return self


def test_a_section_validates_into_its_dataclass() -> None:
    outer = validate(Outer, {"interval": "1m", "inner": [{"share": "0.5", "for": "90", "count": 3, "on": True}]})
    assert outer == Outer(interval=60.0, inner=(Inner(share=0.5, count=3, on=True, for_="1m30s"),))
    assert validate(Outer, None) == Outer()  # `section:` with no value: every default
    assert Inner.file_keys() == ("share", "count", "above", "on", "mode", "for")


@pytest.mark.parametrize(("data", "message"), [
    ({"intervl": "5s"}, "intervl: unknown key (did you mean 'interval'?)"),
    ({"inner": [{"zzz": 1}]}, "inner[0].zzz: unknown key (allowed: above, count, for, mode, on, share)"),
    ({"interval": "soon"}, "interval: expected a duration like 5s, 1m or 500ms, got 'soon'"),
    ({"inner": [{"share": 2}]}, "inner[0].share: expected a number between 0 and 1, got 2"),
    ({"inner": [{"share": "lots"}]}, "inner[0].share: expected a number, got 'lots'"),
    ({"inner": [{"share": True}]}, "inner[0].share: expected a number, got True"),
    ({"inner": [{"count": 0}]}, "inner[0].count: expected an integer >= 1, got 0"),
    ({"inner": [{"count": "3"}]}, "inner[0].count: expected an integer, got '3'"),
    ({"inner": [{"count": 2.0}]}, "inner[0].count: expected an integer, got 2.0"),
    ({"inner": [{"above": 0}]}, "inner[0].above: expected a number > 0, got 0"),
    ({"inner": [{"on": "yes"}]}, "inner[0].on: expected true or false, got 'yes'"),
    ({"inner": [{"mode": "medium"}]}, "inner[0].mode: expected one of fast, slow, got 'medium'"),
    ({"inner": {"share": 1}}, "inner: expected a list, got {'share': 1}"),
    ({"inner": [3]}, "inner[0]: expected a mapping, got 3"),
    ({"name": ""}, "name: expected a non-empty string, got ''"),
    ({"low": 2, "high": 1}, "high: must not be below low (2)"),
    ([1, 2], "expected a mapping at the top level, got [1, 2]"),
])
def test_every_error_is_one_line_naming_the_file_and_key(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(Outer, data, "my.yaml", at=("section",) if isinstance(data, dict) else ())
    prefix = "my.yaml: section." if isinstance(data, dict) else "my.yaml: "
    assert str(error.value) == prefix + message


def test_reading_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read scenario: "):
        read_yaml(tmp_path / "nope.yaml", "scenario")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid YAML at line \d+, column \d+: expected"):
        read_yaml(bad, "config file")
    bad.write_bytes(b"a: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        read_yaml(bad, "config file")
