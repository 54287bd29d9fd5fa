"""One declared config tree: a setting is one field of the section it configures, declared once with ``setting``.

    interval: Duration = setting(5.0, "how often to collect vLLM's metrics")

The field's dotted key (``collect.interval``), its type (the annotation), its default and help, its flag
(``--collect.interval``, from the key unless named), its environment variable (``SPECDECODE_COLLECT_INTERVAL``, from
the flag) and whether a reload applies it are all read from there by ``tree``: the command's flags and ``--help``,
the merge of flags and variables into the config mapping (before the one validation), the reload's notes and the
configuration reference (docs/configuration.md) are built from it. Adding a setting is adding such a field.

A section is a frozen dataclass that inherits ``Section``. Like the value types it is declared with
(core/config/kinds.py), this module imports no validation library: the tap's process reads its own settings'
declarations (tap/settings.py). core/config/validation.py validates them, in the sidecar. ``Renamed`` keeps a section's
old name working for a release.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Self, Union

from specdecode_exporter.core.config.kinds import ConfigError, Invalid, Named, SourcedError, validator

Context = Mapping[str, Any]
ENV_PREFIX = "SPECDECODE_"


class Section:
    """Base of a frozen dataclass read from a config file: its fields are the keys (a key that is not a Python name
    gets an alias: pydantic's ``Field(alias=...)``), their annotations say what each accepts. Unknown keys are
    refused with "did you mean"; ``cross_check`` holds the rules between keys: it runs once the fields are valid,
    may return a completed copy, and raises Invalid."""

    __slots__ = ()
    NULL_IS_EMPTY: ClassVar[bool] = False  # `key:` with no value means an empty section (all defaults)
    UNSUPPORTED: ClassVar[frozenset[str]] = frozenset()  # keys of the upstream format this project refuses

    def cross_check(self, context: Context) -> Self:
        return self

    @classmethod
    def file_keys(cls) -> tuple[str, ...]:
        return validator().file_keys(cls)

    @classmethod
    def check_keys(cls, data: object) -> object:
        """``data`` (``{}`` for a null NULL_IS_EMPTY section); Invalid at its first unknown key."""
        if data is None and cls.NULL_IS_EMPTY:
            return {}
        if isinstance(data, Mapping):
            allowed = cls.file_keys()
            for key in data:
                if key in cls.UNSUPPORTED:
                    raise Invalid("not supported by specdecode-exporter; remove it", str(key))
                if key not in allowed:
                    raise Invalid(f"unknown key{suggest(str(key), allowed)}", str(key))
        return data

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return validator().section_schema(cls, source, handler)


def suggest(key: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(sorted(allowed))})"


@dataclasses.dataclass(frozen=True, slots=True)
class Declared:
    """What ``setting`` stores in a field's metadata."""

    help: str
    flag: str | bool  # True: from the key; a string: this flag; False: the file only
    reload: bool
    shown: str | None  # the default as the reference writes it, where the value alone would not say it


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One setting of the tree, as ``tree`` reads it from its field."""

    key: str  # dotted: collect.interval
    kind: Any  # the field's annotation
    default: Any  # dataclasses.MISSING: required (within its section)
    help: str
    flag: str | None
    reload: bool
    shown: str

    @property
    def env(self) -> str | None:
        return env_name(self.flag) if self.flag else None

    @property
    def type_name(self) -> str:
        return type_name(self.kind)

    @property
    def switch(self) -> bool:
        """A flag without a value (the key is true or false)."""
        return _base(self.kind) is bool

    def from_text(self, text: object) -> object:
        """A flag's or variable's text as the config file's value would be (a number, true or false, where the
        type wants one); the validation of the key judges it, as it judges the file's."""
        if not isinstance(text, str) or _named(self.kind) is not None:
            return text
        base = _base(self.kind)
        if base is bool:
            return {"true": True, "false": False}.get(text.strip().lower(), text)
        if base in (int, float):
            for number in (int, float):
                try:
                    return number(text)
                except ValueError:
                    continue
        return text


def setting(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | bool = True, reload: bool = True,
            shown: str | None = None) -> Any:
    """A field of a config section that is a setting (see the module's docstring)."""
    return dataclasses.field(default=default, metadata={"setting": Declared(help, flag, reload, shown)})


def env_name(flag: str) -> str:
    """--web.listen-address → SPECDECODE_WEB_LISTEN_ADDRESS."""
    return ENV_PREFIX + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def tree(section: type[Section], prefix: str = "") -> tuple[Setting, ...]:
    """Every setting of ``section`` and the sections below it, in the order they are declared."""
    return tuple(_walk(section, prefix))


def _walk(section: type[Section], prefix: str) -> Iterator[Setting]:
    hints = typing.get_type_hints(section, include_extras=True)
    for field in dataclasses.fields(typing.cast(Any, section)):
        key = prefix + field.name
        declared = field.metadata.get("setting")
        child = field.metadata.get("section") or _section(hints[field.name])
        if isinstance(declared, Declared):
            yield _setting(key, hints[field.name], field, declared)
        elif child is not None:
            yield from _walk(child, key + ".")


def _setting(key: str, kind: Any, field: dataclasses.Field[Any], declared: Declared) -> Setting:
    flag = ("--" + key.replace("_", "-")) if declared.flag is True else (declared.flag or None)
    default = field.default
    shown = declared.shown or ("required" if default is dataclasses.MISSING else value_text(default, kind))
    return Setting(key, kind, default, declared.help, flag, declared.reload, shown)


def value_text(value: object, kind: Any) -> str:
    """A value as a user writes it: 5s, 16MiB, 0.3,0.7, none."""
    if value is None:
        return "none"
    named = _named(kind)
    if named is not None:
        return named.text(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value) or "none"
    return str(value)


def type_name(kind: Any) -> str:
    named = _named(kind)
    if named is not None:
        return named.name
    base = _base(kind)
    names = {bool: "bool", int: "integer", float: "number", str: "string", tuple: "list"}
    return names.get(base, "value") if isinstance(base, type) else "value"


def _layers(kind: Any) -> Iterator[Any]:
    """``kind``, then each type it wraps through Annotated and ``| None``; the last is the bare type (or a union of
    several)."""
    while True:
        yield kind
        origin = typing.get_origin(kind)
        if origin is typing.Annotated:
            kind = typing.get_args(kind)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            if len(args) != 1:
                return
            kind = args[0]
        else:
            return


def _strip(kind: Any) -> Any:
    """The type without Annotated and without ``| None``."""
    *_, bare = _layers(kind)
    return bare


def _base(kind: Any) -> Any:
    stripped = _strip(kind)
    return typing.get_origin(stripped) or stripped


def _named(kind: Any) -> Named | None:
    """The Named marker of ``kind`` (Annotated, possibly within ``| None``)."""
    for layer in _layers(kind):
        if typing.get_origin(layer) is typing.Annotated:
            found = [m for m in layer.__metadata__ if isinstance(m, Named)]
            if found:
                return found[0]
    return None


def _section(kind: Any) -> type[Section] | None:
    stripped = _strip(kind)
    return stripped if isinstance(stripped, type) and issubclass(stripped, Section) else None


def put(mapping: Mapping[str, Any] | None, key: str, value: object) -> dict[str, Any]:
    """A copy of ``mapping`` with the dotted ``key`` set to ``value`` (sections on the way made or copied; a section
    that is not a mapping is replaced, as the flag wins over it)."""
    out = dict(mapping) if isinstance(mapping, Mapping) else {}
    head, dot, rest = key.partition(".")
    out[head] = put(out.get(head), rest, value) if dot else value
    return out


def get(tree_value: object, key: str) -> Any:
    """The value at a dotted key of a runtime config (sections are attributes)."""
    for part in key.split("."):
        tree_value = getattr(tree_value, part)
    return tree_value


# ---------- a section's old name ----------

@dataclasses.dataclass(frozen=True, slots=True)
class Renaming:
    """A config's file mapping and flags (by dotted key) with a renamed section's old names made new, the origin of
    each flag's value, one warning line per old name used, and the section's name as the file wrote it."""

    data: Any
    flags: dict[str, object]
    origins: dict[str, str]
    warnings: tuple[str, ...]
    new: str  # the section's name
    written: str  # as the file wrote it: the old name where the file has only that

    def as_written(self, line: str) -> str:
        """An error ``line`` about a key of the file's section, naming it as the file did."""
        if self.written != self.new and _within(line.split(":")[0].split("[")[0], self.new):
            return self.written + line[len(self.new):]
        return line


@dataclasses.dataclass(frozen=True, slots=True)
class Renamed:
    """A section whose name changed (``proxy`` → ``tap``). For a release its old keys, flags and environment
    variables keep working, each old name used with a one-line warning naming the new one; one setting given by
    both names (in the file, a flag or a variable, in any mix) is an error naming both."""

    old: str
    new: str

    def alias(self, item: Setting) -> Setting | None:
        """``item``, a setting of the new section, under its old key, flag and variable (None: not in it)."""
        if not _within(item.key, self.new):
            return None
        flag = item.flag and ("--" + self.old + item.flag[2 + len(self.new):])
        return dataclasses.replace(item, key=self.old + item.key[len(self.new):], flag=flag or None)

    def new_name(self, name: str) -> str:
        """An old key, flag or variable as the new one: proxy.route.mode, --proxy.route.mode,
        SPECDECODE_PROXY_ROUTE_MODE → tap.route.mode, --tap.route.mode, SPECDECODE_TAP_ROUTE_MODE."""
        if name == self.old:
            return self.new
        for old, new in ((self.old + ".", self.new + "."), (f"--{self.old}.", f"--{self.new}."),
                         (env_name(self.old) + "_", env_name(self.new) + "_")):
            if name.startswith(old):
                return new + name[len(old):]
        return name

    def apply(self, data: Any, flags: Mapping[str, object], origins: Mapping[str, str]) -> Renaming:
        """``data`` (the file's mapping) and ``flags`` with every old name made new; ConfigError (SourcedError when
        only flags and variables are involved) when one setting is given by both names."""
        file_old, file_new = _leaves(data, self.old), _leaves(data, self.new)
        # A null key sets nothing: it clashes with no other name.
        self._refuse_both([*(_Given(self.new_name(k), k, True, True) for k, v in file_old.items() if v is not None),
                           *(_Given(k, k, False, True) for k, v in file_new.items() if v is not None),
                           *(_Given(self.new_name(k), origins.get(k, k), _within(k, self.old), False) for k in flags)])
        warnings = []
        in_file = isinstance(data, Mapping) and self.old in data
        written = self.old if in_file and self.new not in data else self.new
        if in_file:
            data = {k: v for k, v in data.items() if k != self.old}
            for key, value in file_old.items():
                data = put(data, self.new_name(key), value)
            warnings.append(f"the config file's section {self.old} is deprecated and goes in the next release: "
                            f"call it {self.new} (the keys in it stay the same)")
        out_flags, out_origins = dict(flags), dict(origins)
        for key in [k for k in flags if _within(k, self.old)]:
            given = out_origins.pop(key, key)
            out_flags[self.new_name(key)], out_origins[self.new_name(key)] = out_flags.pop(key), given
            warnings.append(f"{given} is deprecated and goes in the next release: use {self.new_name(given)}")
        return Renaming(data, out_flags, out_origins, tuple(warnings), self.new, written)

    @staticmethod
    def _refuse_both(given: list[_Given]) -> None:
        """The error when one setting is given by its old name and by its new one."""
        for old in (g for g in given if g.old):
            for new in (g for g in given if not g.old and _overlap(g.key, old.key)):
                error = ConfigError if old.in_file or new.in_file else SourcedError
                raise error(f"{old.name} and {new.name} both set {max(old.key, new.key, key=len)}: {old.name} is "
                            f"its deprecated name; give it once, as {new.name}")


class _Given(typing.NamedTuple):
    key: str  # the new key it sets
    name: str  # as given: a file's key, a flag, a variable
    old: bool  # by the old name
    in_file: bool


def _within(key: str, section: str) -> bool:
    return key == section or key.startswith(section + ".")


def _overlap(key: str, other: str) -> bool:
    """One of two dotted keys is the other or a section above it."""
    return _within(key, other) or _within(other, key)


def _leaves(data: Any, section: str) -> dict[str, object]:
    """The values ``data`` (a file's mapping) gives below ``section``, by dotted key (a mapping that is empty, or
    not a mapping, is a value; the section empty or null gives none)."""
    if not isinstance(data, Mapping) or data.get(section) in (None, {}):
        return {}
    out: dict[str, object] = {}

    def walk(key: str, value: object) -> None:
        if isinstance(value, Mapping) and value:
            for name, inner in value.items():
                walk(f"{key}.{name}", inner)
        else:
            out[key] = value

    walk(section, data[section])
    return out
