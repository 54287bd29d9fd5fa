"""The one way to validate config: the sidecar's config file and flags, the web config, the monitoring config and
the simulator's scenarios are all read through ``validate`` (pydantic v2) into frozen dataclasses, and every
problem is one ConfigError line: ``<file>: <key path>: expected <what>, got <value>``.

A config file's section is a frozen dataclass that inherits ``Section`` (core/config/settings.py): its fields are the
keys (a key that is not a Python name gets ``Field(alias=...)``), their annotations say what each accepts (``Duration``,
``Number`` with a ``Range``, ``Choice``, ...: core/config/kinds.py, which imports no pydantic, or pydantic's
validators), and ``cross_check`` holds the rules between keys. Adding a key is adding a field. This module tells
pydantic how to run the plain rules and sections (``_Pydantic``) when it is imported.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BeforeValidator, GetCoreSchemaHandler, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

from specdecode_exporter.core.config.kinds import (
    Bool,
    Choice,
    ConfigError,
    Duration,
    DurationOrZero,
    Int,
    Invalid,
    Named,
    Number,
    Range,
    Rule,
    SourcedError,
    Text,
    duration_reader,
    duration_seconds,
    duration_text,
    seconds,
    show,
    use_validator,
    words,
)
from specdecode_exporter.core.config.settings import Context, Section, suggest

__all__ = [
    "Bool",
    "Choice",
    "ConfigError",
    "Context",
    "Duration",
    "DurationOrZero",
    "Int",
    "Invalid",
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
    "duration_text",
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


T = TypeVar("T")


def fail(message: str, *at: str | int) -> PydanticCustomError:
    """The error to raise inside a validator; ``at`` is the key path below the value being validated."""
    return PydanticCustomError("config", "{message}", {"message": message, "at": at})


# ---------- durations: one syntax, one parser ----------

_PROMETHEUS_DURATION = re.compile(r"(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?")


def _prometheus_text(allow_zero: bool) -> Callable[[object], str]:
    """The duration as written when Prometheus reads it so (rule names and window labels keep the user's
    spelling), else the same length spelled as Prometheus does ('90' → '1m30s')."""
    check = duration_reader(allow_zero)

    def text(value: object) -> str:
        length = check(value)
        written = str(value).strip()
        if written and _PROMETHEUS_DURATION.fullmatch(written):
            return written
        if abs(round(length * 1000) - length * 1000) > 1e-6:
            raise fail(f"expected whole milliseconds (Prometheus' finest unit), got {show(value)}")
        return duration_text(length)

    return text


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


def size_text(size: int) -> str:
    """Bytes as a size is written: 16777216 → 16MiB."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


Size = Annotated[int, BeforeValidator(_size), Named("size", size_text)]
"""Bytes (> 0), from '16MiB', '1GB', '512KiB' or a plain number of bytes."""


# ---------- how pydantic runs the plain rules (core/config/kinds.py) and sections (core/config/settings.py) ----------

class _Pydantic:
    """The rules and sections declared without pydantic, run by it (registered below: kinds.use_validator)."""

    def __init__(self) -> None:
        self._keys: dict[type, tuple[str, ...]] = {}

    def rule_schema(self, rule: Rule, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        if rule.TYPED:
            return core_schema.no_info_after_validator_function(rule.read, handler(source))
        return core_schema.no_info_before_validator_function(rule.read, handler(source))

    def section_schema(self, section: type, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def cross_check(value: Section, info: core_schema.ValidationInfo) -> Section:
            return value.cross_check(info.context or {})

        checked = core_schema.with_info_after_validator_function(cross_check, handler(source))
        return core_schema.no_info_before_validator_function(typing.cast(type[Section], section).check_keys, checked)

    def file_keys(self, section: type) -> tuple[str, ...]:
        """The keys a section accepts: its init fields not marked ``metadata={"key": False}``, by alias."""
        if section not in self._keys:
            hints = typing.get_type_hints(section, include_extras=True)
            keys = []
            for field in dataclasses.fields(section):
                if not field.init or not field.metadata.get("key", True):
                    continue
                infos = [m for m in getattr(hints[field.name], "__metadata__", ()) if isinstance(m, FieldInfo)]
                keys.append(next((i.alias for i in infos if i.alias), field.name))
            self._keys[section] = tuple(keys)
        return self._keys[section]


use_validator(_Pydantic())


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
    raised = ctx.get("error")
    loc = (*at, *error["loc"], *ctx.get("at", ()), *(raised.at if isinstance(raised, Invalid) else ()))
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
