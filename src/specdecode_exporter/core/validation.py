"""The one way to validate config: the sidecar's config file and flags, the web config, the monitoring config and
the simulator's scenarios are all read through ``validate`` (pydantic v2) into frozen dataclasses, and every
problem is one ConfigError line: ``<file>: <key path>: expected <what>, got <value>``.

A config file's section is a frozen dataclass that inherits ``Section``: its fields are the keys (a key that is
not a Python name gets ``Field(alias=...)``), their annotations say what each accepts (``Duration``, ``Number``
with a ``Range``, ``Choice``, ...), and ``cross_check`` holds the rules between keys. Adding a key is adding a field.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self, TypeVar

import yaml
from pydantic import BeforeValidator, GetCoreSchemaHandler, Strict, TypeAdapter, ValidationError, ValidationInfo
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

__all__ = [
    "Bool",
    "Choice",
    "ConfigError",
    "Context",
    "Duration",
    "DurationOrZero",
    "Int",
    "Named",
    "Number",
    "PromDuration",
    "PromDurationOrZero",
    "Range",
    "Section",
    "Size",
    "SourcedError",
    "Text",
    "duration_seconds",
    "fail",
    "load_yaml",
    "parse_duration",
    "parse_size",
    "read_yaml",
    "seconds",
    "show",
    "suggest",
    "validate",
    "words",
]


class ConfigError(ValueError):
    """A bad configuration value (a file, a flag, an environment variable); str() is the one line shown."""


class SourcedError(ConfigError):
    """A bad value that a flag or an environment variable gave: the line names it, not a file's key (and no file's
    path goes before it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Named:
    """In an ``Annotated`` type: what the type is called in --help and the configuration reference, and how a value
    of it is written there (``Duration``'s 600.0 as 10m). Pydantic leaves it alone."""

    name: str
    text: Callable[[Any], str] = str


Context = Mapping[str, Any]
T = TypeVar("T")


def fail(message: str, *at: str | int) -> PydanticCustomError:
    """The error to raise inside a validator; ``at`` is the key path below the value being validated."""
    return PydanticCustomError("config", "{message}", {"message": message, "at": at})


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------- durations: one syntax, one parser ----------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_PROMETHEUS_DURATION = re.compile(r"(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?")
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
    """``value`` in seconds, for a validator; the error to raise (at ``at`` below the value) when it is not a
    duration, or not above 0 (not 0 or more with ``allow_zero``)."""
    result = seconds(value)
    if result is None:
        raise fail(f"expected {DURATION_EXAMPLE}, got {show(value)}", *at)
    if result < 0 or (result == 0 and not allow_zero):
        raise fail(f"must be {'0 or more' if allow_zero else 'greater than 0'}, got {show(value)}", *at)
    return result


def _duration(allow_zero: bool) -> Callable[[object], float]:
    return lambda value: duration_seconds(value, allow_zero=allow_zero)


def _prometheus_text(allow_zero: bool) -> Callable[[object], str]:
    """The duration as written when Prometheus reads it so (rule names and window labels keep the user's
    spelling), else the same length spelled as Prometheus does ('90' → '1m30s')."""
    check = _duration(allow_zero)

    def text(value: object) -> str:
        length = check(value)
        written = str(value).strip()
        if written and _PROMETHEUS_DURATION.fullmatch(written):
            return written
        if abs(round(length * 1000) - length * 1000) > 1e-6:
            raise fail(f"expected whole milliseconds (Prometheus' finest unit), got {show(value)}")
        return duration_text(length)

    return text


def duration_text(value: float) -> str:
    """Seconds as a duration is written: 600.0 → 10m, 0.5 → 500ms."""
    millis, out = round(value * 1000), ""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, millis = divmod(millis, size)
        out += f"{count}{unit}" if count else ""
    return out or "0s"


_DURATION = Named("duration", duration_text)
Duration = Annotated[float, BeforeValidator(_duration(allow_zero=False)), _DURATION]
"""Seconds (> 0), from '500ms', '5s', '1m30s', '1h', '1d' or a plain number of seconds."""
DurationOrZero = Annotated[float, BeforeValidator(_duration(allow_zero=True)), _DURATION]
PromDuration = Annotated[str, BeforeValidator(_prometheus_text(allow_zero=False))]
"""The same syntax as Duration, kept as text for PromQL and label values (the monitoring config)."""
PromDurationOrZero = Annotated[str, BeforeValidator(_prometheus_text(allow_zero=True))]


# ---------- sizes, numbers, strings, choices ----------

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?", re.IGNORECASE)
_SIZE_FACTORS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3}


def _size(value: object) -> int:
    match = None if isinstance(value, bool) else _SIZE.fullmatch(str(value).strip())
    if match is None:
        raise fail(f"expected a size like 16MiB, got {show(value)}")
    size = int(float(match.group(1)) * _SIZE_FACTORS[(match.group(2) or "b").lower()])
    if size <= 0:
        raise fail(f"must be greater than 0, got {show(value)}")
    return size


def _number(value: object) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 8e9 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise fail(f"expected a number, got {show(value)}")
    return float(value)


def words(what: str) -> BeforeValidator:
    """A non-empty string, described as ``what`` when it is not: ``Annotated[str, words("a path")]``."""

    def check(value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise fail(f"expected {what}, got {show(value)}")
        return value

    return BeforeValidator(check)


def size_text(size: int) -> str:
    """Bytes as a size is written: 16777216 → 16MiB."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


Size = Annotated[int, BeforeValidator(_size), Named("size", size_text)]
"""Bytes (> 0), from '16MiB', '1GB', '512KiB' or a plain number of bytes."""
Number = Annotated[float, BeforeValidator(_number)]
"""A finite number; add a Range to bound it."""
Int = Annotated[int, Strict()]
"""An integer (not a bool, not 3.0, not '3'); add a Range to bound it."""
Bool = Annotated[bool, Strict()]
Text = Annotated[str, words("a non-empty string")]
"""A non-empty string."""


def _plain(number: float) -> str:
    """1e7 as 10000000 and 2.0 as 2, but 1e-06 and 0.5 as such."""
    if isinstance(number, int) or (float(number).is_integer() and abs(number) < 1e16):
        return str(int(number))
    return f"{number:g}"


@dataclasses.dataclass(frozen=True, slots=True)
class Range:
    """Bounds of a Number or Int field: ``Annotated[Number, Range(0, 1)]``; ``above=True``: strictly above low."""

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

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def check(value: float) -> float:
            if value < self.low or value > self.high or (self.above and value == self.low):
                raise fail(f"expected {self.describe(isinstance(value, int))}, got {_plain(value)}")
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """One of some words: ``Annotated[str, Choice("debug", "info")]``."""

    options: tuple[str, ...]

    def __init__(self, *options: str) -> None:
        object.__setattr__(self, "options", options)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def check(value: object) -> object:
            if not isinstance(value, str) or value not in self.options:
                raise fail(f"expected one of {', '.join(self.options)}, got {show(value)}")
            return value

        return core_schema.no_info_before_validator_function(check, handler(source))


# ---------- sections: frozen dataclasses whose fields are the keys ----------

class Section:
    """Base of a frozen dataclass read from a config file: unknown keys are refused with "did you mean",
    ``cross_check`` runs after its fields are valid (and may return a completed copy)."""

    __slots__ = ()
    NULL_IS_EMPTY: ClassVar[bool] = False  # `key:` with no value means an empty section (all defaults)
    UNSUPPORTED: ClassVar[frozenset[str]] = frozenset()  # keys of the upstream format this project refuses

    def cross_check(self, context: Context) -> Self:
        return self

    @classmethod
    def file_keys(cls) -> tuple[str, ...]:
        if cls not in _KEYS:
            _KEYS[cls] = _keys(cls)
        return _KEYS[cls]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def cross_check(value: Section, info: ValidationInfo) -> Section:
            return value.cross_check(info.context or {})

        checked = core_schema.with_info_after_validator_function(cross_check, handler(source))
        return core_schema.no_info_before_validator_function(cls.check_keys, checked)

    @classmethod
    def check_keys(cls, data: object) -> object:
        """``data`` (``{}`` for a null NULL_IS_EMPTY section); the error to raise at its first unknown key."""
        if data is None and cls.NULL_IS_EMPTY:
            return {}
        if isinstance(data, Mapping):
            allowed = cls.file_keys()
            for key in data:
                if key in cls.UNSUPPORTED:
                    raise fail("not supported by specdecode-exporter; remove it", str(key))
                if key not in allowed:
                    raise fail(f"unknown key{suggest(str(key), allowed)}", str(key))
        return data


def suggest(key: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(sorted(allowed))})"


_KEYS: dict[type, tuple[str, ...]] = {}


def _keys(cls: type) -> tuple[str, ...]:
    """The keys a section accepts: its init fields not marked ``metadata={"key": False}``, by alias."""
    hints = typing.get_type_hints(cls, include_extras=True)
    keys = []
    for field in dataclasses.fields(cls):
        if not field.init or not field.metadata.get("key", True):
            continue
        infos = [m for m in getattr(hints[field.name], "__metadata__", ()) if isinstance(m, FieldInfo)]
        keys.append(next((i.alias for i in infos if i.alias), field.name))
    return tuple(keys)


# ---------- validation and its one-line errors ----------

_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(kind: Any) -> TypeAdapter[Any]:
    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


def validate(kind: type[T] | Any, data: object, source: str | None = None, context: Context | None = None,
             at: tuple[str | int, ...] = (), origins: Mapping[str, str] | None = None) -> T:
    """``data`` validated as ``kind``; a ConfigError line (``<source>: <at + key path>: ...``) when it is not.
    ``origins``: the dotted keys whose values a flag or an environment variable gave, and which: an error at one
    of them names that flag or variable instead of the key (a SourcedError)."""
    try:
        return typing.cast(T, _adapter(kind).validate_python(data, context=dict(context or {})))
    except ValidationError as exc:
        line = one_line(exc, at)
        for key, origin in (origins or {}).items():
            if line.startswith(key) and line[len(key):len(key) + 1] in (":", "[", "."):
                raise SourcedError(origin + line[len(key):]) from None
        if source:  # a flag's list item reads --flag[1]: ...
            line = f"{source}{line}" if line.startswith("[") else f"{source}: {line}"
        raise ConfigError(line) from None


def one_line(exc: ValidationError, at: tuple[str | int, ...] = ()) -> str:
    """The first of pydantic's errors, in this project's words: ``key.path[0].key: expected ..., got ...``."""
    error = exc.errors(include_url=False)[0]
    ctx = error.get("ctx") or {}
    loc = (*at, *error["loc"], *ctx.get("at", ()))
    path = key_path(loc)
    message = _MESSAGES.get(error["type"], _pydantic_message)(error)
    if not path and error["type"] in _MAPPING_ERRORS:
        message = f"expected a mapping at the top level, got {show(error['input'])}"
    line = f"{path}: {message}" if path else message
    return " ".join(line.splitlines())


def key_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "[key]":
            path += f".{part}" if path else str(part)
    return path


def _pydantic_message(error: Any) -> str:
    return f"{error['msg'][:1].lower()}{error['msg'][1:]}, got {show(error['input'])}"


def _expected(what: str) -> Callable[[Any], str]:
    return lambda error: f"expected {what}, got {show(error['input'])}"


_MAPPING_ERRORS = frozenset({"dataclass_type", "model_type", "dict_type", "mapping_type"})
_MESSAGES: dict[str, Callable[[Any], str]] = {
    "config": lambda error: str(error["ctx"]["message"]),
    "missing": lambda error: "required",
    "value_error": lambda error: str(error["ctx"]["error"]),
    **{kind: _expected("a mapping") for kind in _MAPPING_ERRORS},
    **{kind: _expected("a list") for kind in ("list_type", "tuple_type", "iterable_type")},
    **{kind: _expected("an integer") for kind in ("int_type", "int_parsing", "int_from_float")},
    **{kind: _expected("true or false") for kind in ("bool_type", "bool_parsing")},
    "string_type": _expected("a string"),
    "too_short": _expected("a non-empty list"),
}


# ---------- reading YAML ----------

def read_yaml(path: str | Path, what: str) -> object:
    """The YAML document in ``path``; a ConfigError line when it cannot be read or parsed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot read {what}: not UTF-8 text") from None
    return load_yaml(text, str(path))


def load_yaml(text: str, source: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}: invalid YAML{at}: {problem}") from None


# ---------- flags ----------

def parse_duration(text: str | float, where: str, allow_zero: bool = False) -> float:
    """A flag's (or environment variable's) duration, in seconds: the same syntax as the config files'."""
    return validate(DurationOrZero if allow_zero else Duration, text, where)


def parse_size(text: str | int, where: str) -> int:
    return validate(Size, text, where)
