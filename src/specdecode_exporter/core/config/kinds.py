"""What a setting's value may be, in plain Python: the value types and markers the config tree (core/config/settings.py)
declares its settings with. This module imports no validation library, so that the tap's own process can read its
settings' declarations (tap/settings.py) without loading pydantic.

    Duration = Annotated[float, Check(_duration(allow_zero=False)), Named("duration", duration_text)]

A ``Check`` reads a value as it was given and returns what the setting holds, or raises ``Invalid`` (one line); a
``CheckTyped`` reads it once its type accepted it; ``Range`` and ``Choice`` are such rules. ``Named`` says what the
type is called in --help and the reference, and how a value of it is written there.

The rules are run by pydantic, in the sidecar: core/config/validation.py, the one module that validates, registers how
(``use_validator``) when it is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Protocol


class ConfigError(ValueError):
    """A bad configuration value (a file, a flag, an environment variable); str() is the one line shown."""


class SourcedError(ConfigError):
    """A bad value that a flag or an environment variable gave: the line names it, not a file's key (and no file's
    path goes before it)."""


class Invalid(ValueError):
    """A value a setting does not take: ``message`` is the one line said about it, ``at`` the key path below the
    value where the problem is (an item of a list, a key of a mapping)."""

    def __init__(self, message: str, *at: str | int) -> None:
        super().__init__(message)
        self.message = message
        self.at = at


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Validator(Protocol):
    """How a validation library runs this module's rules and the sections of core/config/settings.py (``section``: a
    subclass of Section)."""

    def rule_schema(self, rule: Rule, source: Any, handler: Any) -> Any: ...

    def section_schema(self, section: type, source: Any, handler: Any) -> Any: ...

    def file_keys(self, section: type) -> tuple[str, ...]: ...


_VALIDATOR: list[Validator] = []


def use_validator(validator: Validator) -> None:
    """Called by core/config/validation.py when it is imported: the validator the rules and sections are run by."""
    _VALIDATOR[:] = [validator]


def validator() -> Validator:
    if not _VALIDATOR:
        raise RuntimeError("settings are validated through specdecode_exporter.core.config.validation")
    return _VALIDATOR[0]


class Rule:
    """A marker in an Annotated type: what the value must be. ``read`` gets the value as given (a parse), or with
    ``TYPED`` once its type accepted it (a bound), and returns what the setting holds or raises Invalid."""

    __slots__ = ()
    TYPED: ClassVar[bool] = False

    def read(self, value: Any) -> Any:
        raise NotImplementedError

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return validator().rule_schema(self, source, handler)


@dataclasses.dataclass(frozen=True, slots=True)
class Check(Rule):
    """``function`` reads the value as given: ``Annotated[str, Check(header_name)]``."""

    function: Callable[[Any], Any]

    def read(self, value: Any) -> Any:
        return self.function(value)


@dataclasses.dataclass(frozen=True, slots=True)
class CheckTyped(Rule):
    """``function`` reads the value once its type accepted it (a list of numbers that must increase)."""

    TYPED: ClassVar[bool] = True
    function: Callable[[Any], Any]

    def read(self, value: Any) -> Any:
        return self.function(value)


def _plain(number: float) -> str:
    """1e7 as 10000000 and 2.0 as 2, but 1e-06 and 0.5 as such."""
    if isinstance(number, int) or (float(number).is_integer() and abs(number) < 1e16):
        return str(int(number))
    return f"{number:g}"


@dataclasses.dataclass(frozen=True, slots=True)
class Range(Rule):
    """Bounds of a Number or Int field: ``Annotated[Number, Range(0, 1)]``; ``above=True``: strictly above low."""

    TYPED: ClassVar[bool] = True
    low: float = -math.inf
    high: float = math.inf
    above: bool = False

    def describe(self, integer: bool) -> str:
        kind = "an integer" if integer else "a number"
        low, high = _plain(self.low), _plain(self.high)
        if self.high == math.inf:
            return f"{kind} {'>' if self.above else '>='} {low}"
        if self.above:
            return f"{kind} above {low} and at most {high}"
        return f"{kind} between {low} and {high}"

    def read(self, value: Any) -> Any:
        if value < self.low or value > self.high or (self.above and value == self.low):
            raise Invalid(f"expected {self.describe(isinstance(value, int))}, got {_plain(value)}")
        return value


@dataclasses.dataclass(frozen=True, slots=True)
class Choice(Rule):
    """One of some words: ``Annotated[str, Choice("debug", "info")]``."""

    options: tuple[str, ...]

    def __init__(self, *options: str) -> None:
        object.__setattr__(self, "options", options)

    def read(self, value: Any) -> Any:
        if not isinstance(value, str) or value not in self.options:
            raise Invalid(f"expected one of {', '.join(self.options)}, got {show(value)}")
        return value


@dataclasses.dataclass(frozen=True, slots=True)
class Named:
    """In an ``Annotated`` type: what the type is called in --help and the configuration reference, and how a value
    of it is written there (``Duration``'s 600.0 as 10m). Validation leaves it alone."""

    name: str
    text: Callable[[Any], str] = str


# ---------- durations: one syntax, one parser ----------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
DURATION_EXAMPLE = "a duration like 5s, 1m or 500ms"


def seconds(value: object) -> float | None:
    """'500ms', '5s', '1m30s', '1h', '1d', '1w' or a plain number of seconds → seconds; None when it is none of
    those (or not finite). The sign is the caller's to judge."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip()
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        try:
            number = float(text)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def duration_seconds(value: object, *at: str | int, allow_zero: bool = False) -> float:
    """``value`` in seconds; Invalid (at ``at`` below the value) when it is not a duration, or not above 0 (not 0
    or more with ``allow_zero``)."""
    result = seconds(value)
    if result is None:
        raise Invalid(f"expected {DURATION_EXAMPLE}, got {show(value)}", *at)
    if result < 0 or (result == 0 and not allow_zero):
        raise Invalid(f"must be {'0 or more' if allow_zero else 'greater than 0'}, got {show(value)}", *at)
    return result


def duration_reader(allow_zero: bool) -> Callable[[object], float]:
    return lambda value: duration_seconds(value, allow_zero=allow_zero)


def duration_text(value: float) -> str:
    """Seconds as a duration is written: 600.0 → 10m, 0.5 → 500ms."""
    millis, out = round(value * 1000), ""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, millis = divmod(millis, size)
        out += f"{count}{unit}" if count else ""
    return out or "0s"


_DURATION = Named("duration", duration_text)
Duration = Annotated[float, Check(duration_reader(allow_zero=False)), _DURATION]
"""Seconds (> 0), from '500ms', '5s', '1m30s', '1h', '1d' or a plain number of seconds."""
DurationOrZero = Annotated[float, Check(duration_reader(allow_zero=True)), _DURATION]


# ---------- numbers, switches, words, addresses ----------

def _number(value: object) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 8e9 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Invalid(f"expected a number, got {show(value)}")
    return float(value)


def _integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"expected an integer, got {show(value)}")
    return value


def _switch(value: object) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"expected true or false, got {show(value)}")
    return value


def words(what: str) -> Check:
    """A non-empty string, described as ``what`` when it is not: ``Annotated[str, words("a path")]``."""

    def check(value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise Invalid(f"expected {what}, got {show(value)}")
        return value

    return Check(check)


def _listen_address(value: object) -> str:
    _, sep, port = str(value).rpartition(":")
    if not isinstance(value, str) or not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise Invalid(f"expected host:port or :port, got {show(value)}")
    return value


Number = Annotated[float, Check(_number)]
"""A finite number; add a Range to bound it."""
Int = Annotated[int, Check(_integer)]
"""An integer (not a bool, not 3.0, not '3'); add a Range to bound it."""
Bool = Annotated[bool, Check(_switch)]
Text = Annotated[str, words("a non-empty string")]
"""A non-empty string."""
ListenAddress = Annotated[str, Check(_listen_address), Named("address")]
"""host:port or :port, a port from 0 to 65535."""
