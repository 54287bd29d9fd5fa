"""The request tap: a byte-for-byte relay in front of vLLM's OpenAI API that reports each completion's
per-request metrics to an Observer (docs/architecture.md §8; docs/tap-design.md).

The names below load on first use (PEP 562): the sidecar with the tap off reads the tap's settings and view types
(tap.route, tap.request_stats, tap.model) but never starts a relay, so importing any tap module must not load the
relay (tap.relay) with it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdecode_exporter.tap.model import Observer, TapRequest, TapResult
    from specdecode_exporter.tap.relay import Tap, TapStats, start_tap

__all__ = ["Observer", "Tap", "TapRequest", "TapResult", "TapStats", "start_tap"]
_HOME = {"Observer": "model", "TapRequest": "model", "TapResult": "model",
         "Tap": "relay", "TapStats": "relay", "start_tap": "relay"}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
