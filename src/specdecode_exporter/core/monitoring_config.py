"""The monitoring config (monitoring.yaml beside this file): loaded, merged with a user's file and a profile,
validated key by key. Every generator and the sidecar's verdict read the MonitoringConfig it gives."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from specdecode_exporter.core.verdict import VerdictBands

DEFAULT_FILE = Path(__file__).resolve().parent / "monitoring.yaml"
SEVERITIES = ("critical", "warning", "info")
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LEVEL = re.compile(r"^[a-z_][a-z0-9_]*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class MonitoringConfigError(ValueError):
    """A bad value in the monitoring config; the message names the key."""


@dataclass(frozen=True, slots=True)
class AlertSettings:
    severity: str
    for_: str
    window: str | None  # "short" or "long", where the alert has a rate window


@dataclass(frozen=True, slots=True)
class Thresholds:
    page_acceptance_ratio: float
    good_acceptance_ratio: float
    drift_drop: float
    interval_quantile: float
    interval_acceptance_ratio: float
    request_quantile: float
    request_acceptance_ratio: float


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """The bands of `specdecode-exporter probe` (docs/probe.md); below the page threshold it says "disable"."""

    measure_below: float  # α from the page threshold up to this: "measure P99 under real load"; from here: "ship"
    ship_speedup: float  # with a baseline, a median observed speedup below this: "do not ship"


@dataclass(frozen=True, slots=True)
class DashboardSettings:
    uid: str
    title: str
    refresh: str
    time_from: str


@dataclass(frozen=True, slots=True)
class MonitoringConfig:
    runbook_base_url: str
    metric_selector: str
    exporter_job_selector: str
    target_labels: tuple[str, ...]
    levels: tuple[tuple[str, tuple[str, ...]], ...]  # (level, labels) in the config's order
    alert_level: str
    short_window: str
    long_window: str
    sidecar_windows: tuple[str, ...]
    verdict_window: str
    sidecar_alert_window: str
    quantiles: tuple[float, ...]
    baseline_range: str
    baseline_offset: str
    min_draft_tokens_per_second: float
    min_requests_per_hour: float
    thresholds: Thresholds
    verdict: VerdictBands
    alerts: tuple[tuple[str, AlertSettings], ...]
    extra_alert_labels: tuple[tuple[str, str], ...]
    dashboard: DashboardSettings
    probe: ProbeSettings
    profile: str | None = None

    def level_labels(self, level: str | None = None) -> tuple[str, ...]:
        return dict(self.levels)[level or self.alert_level]

    def alert(self, name: str) -> AlertSettings:
        settings = dict(self.alerts).get(name)
        if settings is None:
            raise MonitoringConfigError(f"alerts.{name}: missing (severity and for: of every alert)")
        return settings

    def window(self, which: str) -> str:
        return self.short_window if which == "short" else self.long_window


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MonitoringConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise MonitoringConfigError(f"{path}: invalid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MonitoringConfigError(f"{path}: expected a mapping at the top level")
    return data


def load(path: str | Path | None = None, profile: str | None = None) -> MonitoringConfig:
    """The shipped config, with ``path`` (a user's file, only the keys to change) and ``profile`` merged onto it."""
    raw = read_yaml(DEFAULT_FILE)
    if path is not None and Path(path).resolve() != DEFAULT_FILE:
        raw = deep_merge(raw, read_yaml(Path(path)))
    return from_mapping(raw, profile)


@functools.cache
def shipped() -> MonitoringConfig:
    """The config as shipped (cached: the sidecar's defaults read it)."""
    return load()


def from_mapping(raw: Mapping[str, Any], profile: str | None = None) -> MonitoringConfig:
    data = dict(raw)
    profiles = data.pop("profiles", None) or {}
    if profile is not None:
        if profile not in profiles:
            raise MonitoringConfigError(f"profiles: no profile {profile!r} (have: {', '.join(sorted(profiles))})")
        data = deep_merge(data, profiles[profile])
    force_for = data.pop("force_for", None)
    _check_keys(data, _TOP_LEVEL, "")
    try:
        config = _build(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise MonitoringConfigError(f"missing or malformed key {exc}") from None
    if force_for is not None:
        _duration(force_for, "force_for")
        forced = tuple((name, AlertSettings(a.severity, force_for, a.window)) for name, a in config.alerts)
        config = replace(config, alerts=forced)
    return replace(config, profile=profile)


_TOP_LEVEL = {"runbook_base_url", "selectors", "target_labels", "levels", "alert_level", "windows", "quantiles",
              "baseline", "min_draft_tokens_per_second", "min_requests_per_hour", "thresholds", "verdict", "alerts",
              "extra_alert_labels", "dashboard", "probe"}


def _build(data: Mapping[str, Any]) -> MonitoringConfig:
    selectors = _mapping(data.get("selectors"), "selectors", {"metric", "exporter_job"})
    windows = _mapping(data.get("windows"), "windows", {"short", "long", "sidecar", "verdict", "sidecar_alert"})
    levels = _levels(data.get("levels"))
    alert_level = data.get("alert_level")
    if alert_level not in dict(levels):
        raise MonitoringConfigError(f"alert_level: {alert_level!r} is not one of levels ({', '.join(dict(levels))})")
    sidecar_windows = tuple(_duration(w, f"windows.sidecar[{i}]") for i, w in enumerate(_list(windows, "sidecar")))
    verdict_window = _duration(windows.get("verdict"), "windows.verdict")
    sidecar_alert = _duration(windows.get("sidecar_alert"), "windows.sidecar_alert")
    for key, value in (("verdict", verdict_window), ("sidecar_alert", sidecar_alert)):
        if value not in sidecar_windows:
            raise MonitoringConfigError(f"windows.{key}: {value} is not one of windows.sidecar")
    baseline = _mapping(data.get("baseline"), "baseline", {"range", "offset"})
    return MonitoringConfig(
        runbook_base_url=_string(data.get("runbook_base_url"), "runbook_base_url"),
        metric_selector=_string(selectors.get("metric", ""), "selectors.metric", empty_ok=True),
        exporter_job_selector=_string(selectors.get("exporter_job"), "selectors.exporter_job"),
        target_labels=_labels(data.get("target_labels"), "target_labels"),
        levels=levels,
        alert_level=str(alert_level),
        short_window=_duration(windows.get("short"), "windows.short"),
        long_window=_duration(windows.get("long"), "windows.long"),
        sidecar_windows=sidecar_windows,
        verdict_window=verdict_window,
        sidecar_alert_window=sidecar_alert,
        quantiles=tuple(_ratio(q, "quantiles") for q in _list(data, "quantiles")),
        baseline_range=_duration(baseline.get("range"), "baseline.range"),
        baseline_offset=_duration(baseline.get("offset"), "baseline.offset"),
        min_draft_tokens_per_second=_number(data.get("min_draft_tokens_per_second"), "min_draft_tokens_per_second"),
        min_requests_per_hour=_number(data.get("min_requests_per_hour"), "min_requests_per_hour"),
        thresholds=_thresholds(data.get("thresholds"), [q for q in data.get("quantiles") or []]),
        verdict=_verdict(data.get("verdict"), data.get("thresholds")),
        alerts=_alerts(data.get("alerts")),
        extra_alert_labels=tuple((str(k), str(v)) for k, v in
                                 _mapping(data.get("extra_alert_labels"), "extra_alert_labels", None).items()),
        dashboard=_dashboard(data.get("dashboard")),
        probe=_probe(data.get("probe"), data.get("thresholds")),
    )


def _thresholds(value: Any, quantiles: list[Any]) -> Thresholds:
    keys = {"page_acceptance_ratio", "good_acceptance_ratio", "drift_drop", "interval_quantile",
            "interval_acceptance_ratio", "request_quantile", "request_acceptance_ratio"}
    data = _mapping(value, "thresholds", keys)
    ratios = {key: _ratio(data.get(key), f"thresholds.{key}") for key in keys}
    if ratios["interval_quantile"] not in quantiles:
        raise MonitoringConfigError("thresholds.interval_quantile: must be one of quantiles (it is recorded)")
    return Thresholds(**ratios)


def _verdict(value: Any, thresholds: Any) -> VerdictBands:
    data = _mapping(value, "verdict", {"hurting_below", "paying_off_from"})
    hurting = _number(data.get("hurting_below"), "verdict.hurting_below")
    paying = _number(data.get("paying_off_from"), "verdict.paying_off_from")
    if paying < hurting:
        raise MonitoringConfigError("verdict.paying_off_from: must not be below verdict.hurting_below")
    page = _ratio(_mapping(thresholds, "thresholds", None).get("page_acceptance_ratio"),
                  "thresholds.page_acceptance_ratio")
    return VerdictBands(page_acceptance_ratio=page, hurting_below=hurting, paying_off_from=paying)


def _probe(value: Any, thresholds: Any) -> ProbeSettings:
    data = _mapping(value, "probe", {"measure_below", "ship_speedup"})
    measure_below = _ratio(data.get("measure_below"), "probe.measure_below")
    page = _mapping(thresholds, "thresholds", None).get("page_acceptance_ratio")
    if isinstance(page, int | float) and measure_below < page:
        raise MonitoringConfigError(f"probe.measure_below: {measure_below:g} must not be below "
                                    f"thresholds.page_acceptance_ratio ({page:g})")
    ship_speedup = _number(data.get("ship_speedup"), "probe.ship_speedup")
    if ship_speedup <= 0:
        raise MonitoringConfigError(f"probe.ship_speedup: must be a number > 0, got {ship_speedup:g}")
    return ProbeSettings(measure_below=measure_below, ship_speedup=ship_speedup)


def _alerts(value: Any) -> tuple[tuple[str, AlertSettings], ...]:
    data = _mapping(value, "alerts", None)
    out: list[tuple[str, AlertSettings]] = []
    for name, settings in data.items():
        where = f"alerts.{name}"
        entry = _mapping(settings, where, {"severity", "for", "window"})
        severity = entry.get("severity")
        if severity not in SEVERITIES:
            raise MonitoringConfigError(f"{where}.severity: must be one of {', '.join(SEVERITIES)}, got {severity!r}")
        window = entry.get("window")
        if window is not None and window not in ("short", "long"):
            raise MonitoringConfigError(f"{where}.window: must be short or long, got {window!r}")
        out.append((str(name), AlertSettings(str(severity), _duration(entry.get("for"), f"{where}.for"), window)))
    return tuple(out)


def _dashboard(value: Any) -> DashboardSettings:
    data = _mapping(value, "dashboard", {"uid", "title", "refresh", "time_from"})
    return DashboardSettings(**{key: _string(data.get(key), f"dashboard.{key}") for key in
                                ("uid", "title", "refresh", "time_from")})


def _levels(value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(value, Mapping) or not value:
        raise MonitoringConfigError("levels: expected a mapping of level name to label list")
    out = []
    for name, labels in value.items():
        if not _LEVEL.match(str(name)):
            raise MonitoringConfigError(f"levels: {name!r} is not a valid level name")
        out.append((str(name), _labels(labels, f"levels.{name}")))
    return tuple(out)


def _check_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise MonitoringConfigError(f"{prefix}{unknown[0]}: unknown key (allowed: {', '.join(sorted(allowed))})")


def _mapping(value: Any, where: str, allowed: set[str] | None) -> Mapping[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise MonitoringConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    if allowed is not None:
        _check_keys(value, allowed, where)
    return value


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise MonitoringConfigError(f"{key}: expected a non-empty list")
    return value


def _string(value: Any, where: str, empty_ok: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty_ok):
        raise MonitoringConfigError(f"{where}: required string, got {value!r}")
    return value


def _duration(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _DURATION.match(value):
        raise MonitoringConfigError(f"{where}: {value!r} is not a Prometheus duration (e.g. 30s, 5m, 1h, 1d)")
    return value


def duration_seconds(value: str) -> float:
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", value))


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise MonitoringConfigError(f"{where}: must be a number >= 0, got {value!r}")
    return float(value)


def _ratio(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise MonitoringConfigError(f"{where}: {value!r} must be a number between 0 and 1")
    return float(value)


def _labels(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise MonitoringConfigError(f"{where}: expected a non-empty list of label names")
    for name in value:
        if not _LABEL.match(name):
            raise MonitoringConfigError(f"{where}: {name!r} is not a label name")
    return tuple(value)
