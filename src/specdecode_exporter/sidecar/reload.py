"""Configuration reload (SIGHUP or ``POST /-/reload``), as Prometheus does it.

The config (file + flags + env) is read again and validated in full before anything changes; a bad one
is rejected with one log line and the running configuration stays. Targets that keep their name and URL
keep their window state (see Exporter.apply_config). Every other changed setting is named in the answer,
as applied (it is, at once: the views are published again) or as needing a restart (the listener's address,
path and web config file, and the collection concurrency).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specdecode_exporter.core.config.settings import get
from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.core.contract import metrics as m
from specdecode_exporter.core.process.log import event, reconfigure_logging
from specdecode_exporter.sidecar.collection import Exporter
from specdecode_exporter.sidecar.config import SETTINGS, Config, warn_deprecated
from specdecode_exporter.sidecar.webconfig import WebSecurity

# From the config tree: the settings a reload applies and those that wait for a restart (the tap, tap.*, as one: its
# process is started with its settings, none of which reloads).
_SECTIONS = ("web", "collect", "log", "monitoring")  # Config's fields that are the file's sections, as they are
_RUNTIME = [s for s in SETTINGS if s.key.partition(".")[0] in (*_SECTIONS, "windows")]
RESTART_ONLY = (*(s.key for s in _RUNTIME if not s.reload), "tap")
# Config fields a reload applies, with the names a user knows them by: the tree's settings by their keys, and what
# the monitoring config gives the verdict. Targets are described by apply_config.
APPLIED = {
    **{s.key: s.key for s in _RUNTIME if s.reload},
    "verdict": "verdict (page_threshold and bands)", "verdict_window": "verdict window",
    "speculation_stopped": "speculation_stopped",
}
NOT_SETTINGS = ("targets", "source", "deprecated")


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(getattr(item, "name", str(item)) for item in value)
    return str(value)


def _keys() -> list[str]:
    """Config's settings in its order, a section's by their dotted keys."""
    keys = []
    for item in fields(Config):
        if item.name in _SECTIONS:
            keys += [s.key for s in _RUNTIME if s.key.startswith(item.name + ".")]
        elif item.name not in NOT_SETTINGS:
            keys.append(item.name)
    return keys


def describe_changes(running: Config, new: Config) -> list[str]:
    """One note per changed setting, saying whether the reload applied it."""
    notes = []
    for key in _keys():
        old_value, new_value = get(running, key), get(new, key)
        if old_value == new_value:
            continue
        if key in RESTART_ONLY:
            notes.append(f"{key} changed; it applies after a restart")
        else:
            notes.append(f"{APPLIED.get(key, key)} {_shown(old_value)} → {_shown(new_value)} applied")
    return notes


def keep_running(config: Config, running: Config) -> Config:
    """``config`` with the restart-only settings of ``running``: what is actually in force."""
    for key in RESTART_ONLY:
        config = _with(config, key, get(running, key))
    return config


def _with(node: Any, key: str, value: object) -> Any:
    head, dot, rest = key.partition(".")
    return replace(node, **{head: _with(getattr(node, head), rest, value) if dot else value})


@dataclass
class Reloader:
    exporter: Exporter
    load: Callable[[], Config]
    web: WebSecurity | None = None
    last_successful: bool = True
    last_success_time: float = field(default_factory=time.time)

    def reload(self) -> tuple[bool, str]:
        """Returns (ok, one-line message). Never raises on a bad config."""
        running = self.exporter.config
        try:
            config = self.load()
            notes = describe_changes(running, config)
            if self.web is not None and config.web.config_file == running.web.config_file:
                notes += self.web.reload()
        except ConfigError as exc:
            self.last_successful = False
            event(logging.ERROR, "reload failed; the running configuration stays", detail=str(exc))
            return False, str(exc)
        except Exception as exc:  # e.g. a certificate that vanished between validation and loading
            self.last_successful = False
            event(logging.ERROR, "reload failed; the running configuration stays", error=type(exc).__name__,
                  detail=str(exc)[:200])
            return False, f"{type(exc).__name__}: {exc}"
        # Keep what is actually in force, so the next reload compares against it.
        config = keep_running(config, running)
        notes += self.exporter.apply_config(config)
        if config.log != running.log:
            reconfigure_logging(config.log.level, config.log.format)
        self.last_successful = True
        self.last_success_time = time.time()
        message = "; ".join(notes) or "no changes"
        warn_deprecated(config)
        event(logging.INFO, "configuration reloaded", source=config.source, changes=message)
        return True, message


class ReloadCollector(Collector):
    """The reload families of the contract (metrics.RELOAD)."""

    def __init__(self, reloader: Reloader) -> None:
        self._reloader = reloader

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(m.CONFIG_RELOAD_SUCCESSFUL.name, m.CONFIG_RELOAD_SUCCESSFUL.help,
                                value=1.0 if self._reloader.last_successful else 0.0)
        yield GaugeMetricFamily(m.CONFIG_RELOAD_TIME.name, m.CONFIG_RELOAD_TIME.help,
                                value=self._reloader.last_success_time)

    def describe(self) -> Iterator[Metric]:
        return self.collect()
