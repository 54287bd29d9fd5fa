"""Flag values of the subcommands that take their own (simulate, probe): one shape of error, one converter."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class UsageError(ValueError):
    """A bad flag value: one line, exit code 2."""


def convert(flag: str, raw: str, fn: Callable[[str], T], what: str, ok: Callable[[T], bool]) -> T:
    """``fn(raw)`` when it succeeds and the result passes ``ok``; else a UsageError naming the flag."""
    try:
        value = fn(raw)
    except ValueError:
        raise UsageError(f"{flag}: expected {what}, got {raw!r}") from None
    if not ok(value):
        raise UsageError(f"{flag}: expected {what}, got {raw!r}")
    return value
