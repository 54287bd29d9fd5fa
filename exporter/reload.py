"""Configuration reload (SIGHUP or ``POST /-/reload``), as Prometheus does it.

The config (file + flags + env) is read again and validated in full before anything changes; a bad one
is rejected with one log line and the running configuration stays. Targets that keep their name and URL
keep their window state (see Exporter.apply_config). Settings that need the listener again (listen
address, telemetry path, the web config file's path or turning TLS on/off) are reported as needing a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.collection import Exporter
from exporter.config import Config, ConfigError
from exporter.log import event, reconfigure_logging
from exporter.webconfig import WebSecurity

RESTART_ONLY = ("listen_address", "telemetry_path", "web_config_file")


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
            notes = [f"{key} changed; it applies after a restart" for key in RESTART_ONLY
                     if getattr(config, key) != getattr(running, key)]
            if self.web is not None and config.web_config_file == running.web_config_file:
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
        config = replace(config, **{key: getattr(running, key) for key in RESTART_ONLY})
        notes += self.exporter.apply_config(config)
        if (config.log_level, config.log_format) != (running.log_level, running.log_format):
            reconfigure_logging(config.log_level, config.log_format)
            notes.append(f"log.level {config.log_level}, log.format {config.log_format}")
        self.last_successful = True
        self.last_success_time = time.time()
        message = "; ".join(notes) or "no changes"
        event(logging.INFO, "configuration reloaded", source=config.source, changes=message)
        return True, message


class ReloadCollector(Collector):
    """``specdecode_config_last_reload_successful`` and ``…_success_timestamp_seconds``, named after
    Prometheus' own ``prometheus_config_last_reload_*`` so the same alert pattern works."""

    def __init__(self, reloader: Reloader) -> None:
        self._reloader = reloader

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("specdecode_config_last_reload_successful",
                                "1 if the last configuration reload (SIGHUP or POST /-/reload) succeeded, else 0.",
                                value=1.0 if self._reloader.last_successful else 0.0)
        yield GaugeMetricFamily("specdecode_config_last_reload_success_timestamp_seconds",
                                "Unix time of the last successful configuration load (start or reload).",
                                value=self._reloader.last_success_time)

    def describe(self) -> Iterator[Metric]:
        return self.collect()
