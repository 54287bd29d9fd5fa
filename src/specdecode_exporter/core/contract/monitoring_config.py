"""The monitoring config (monitoring.yaml beside this file): loaded, merged with a user's file and a profile,
validated key by key (core.config.validation). Every generator and the sidecar's verdict read the MonitoringConfig
it gives.

Each section below is a frozen dataclass whose fields are the file's keys: a new key (a threshold, a window) is a
new field with its type, and every generator can read it."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, GetCoreSchemaHandler
from pydantic_core import core_schema

from specdecode_exporter.core.config import validation
from specdecode_exporter.core.config.validation import (
    Choice,
    ConfigError,
    Context,
    Number,
    PromDuration,
    PromDurationOrZero,
    Range,
    Section,
    Text,
    fail,
    show,
)
from specdecode_exporter.core.contract.verdict import CapacityBounds, VerdictBands
from specdecode_exporter.core.stats.evidence import Dispersion

DEFAULT_FILE = Path(__file__).resolve().parent / "monitoring.yaml"
SEVERITIES = ("critical", "warning", "info")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LEVEL = re.compile(r"[a-z_][a-z0-9_]*")

Ratio = Annotated[Number, Range(0, 1)]
NonNegative = Annotated[Number, Range(0)]


def _label_names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) for v in value):
        raise fail(f"expected a non-empty list of label names, got {show(value)}")
    for i, name in enumerate(value):
        if not _LABEL.fullmatch(name):
            raise fail(f"{name!r} is not a label name", i)
    return tuple(value)


def _level_name(value: object) -> str:
    if not isinstance(value, str) or not _LEVEL.fullmatch(value):
        raise fail(f"{value!r} is not a valid level name (lower case letters, digits, _)")
    return value


LabelNames = Annotated[tuple[str, ...], BeforeValidator(_label_names)]
LevelName = Annotated[str, BeforeValidator(_level_name)]


@dataclass(frozen=True, slots=True)
class Pairs:
    """A mapping in the file, kept as its (key, value) pairs in the file's order: ``Pairs(dict[K, V])``."""

    mapping: Any
    non_empty: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def pairs(value: Mapping[Any, Any]) -> tuple[tuple[Any, Any], ...]:
            if self.non_empty and not value:
                raise fail("expected a non-empty mapping")
            return tuple(value.items())

        return core_schema.no_info_after_validator_function(pairs, handler.generate_schema(self.mapping))


@dataclass(frozen=True, slots=True)
class Selectors(Section):
    NULL_IS_EMPTY = True
    exporter_job: Text  # matchers of the sidecar's own scrape job in `up`
    metric: Annotated[str, Field(strict=True)] = ""  # extra matchers of every specdecode_* selector


@dataclass(frozen=True, slots=True)
class Windows(Section):
    NULL_IS_EMPTY = True
    short: PromDuration  # the rate window of the page
    long: PromDuration  # the tickets, the quantiles, the 1-day baseline
    sidecar: Annotated[tuple[PromDuration, ...], Field(min_length=1)]  # the sidecar's default windows
    verdict: PromDuration  # the window the verdict is given for
    sidecar_alert: PromDuration  # the sidecar window the k-advice alert reads
    # How often the ruler evaluates the window records (not the page's and the alerts': statistics.evaluation_interval);
    # None: the ruler's own default.
    evaluation_interval: PromDuration | None = None
    # The step of the short stage's groups other than the page's evidence (at most 1m: no rule ranges over raw
    # series for longer); the page's evidence is staged every statistics.evaluation_interval.
    stage_interval: PromDuration = "1m"

    def cross_check(self, context: Context) -> Windows:
        for key in ("verdict", "sidecar_alert"):
            if getattr(self, key) not in self.sidecar:
                raise fail(f"{getattr(self, key)} is not one of windows.sidecar", key)
        if validation.duration_seconds(self.stage_interval) > 60:
            raise fail(f"expected at most 1m (the stage reads raw series a step back), got {self.stage_interval}",
                       "stage_interval")
        return self


@dataclass(frozen=True, slots=True)
class BaselineRange(Section):
    NULL_IS_EMPTY = True
    range: PromDuration
    offset: PromDurationOrZero


@dataclass(frozen=True, slots=True)
class Thresholds(Section):
    NULL_IS_EMPTY = True
    page_acceptance_ratio: Ratio
    good_acceptance_ratio: Ratio
    drift_drop: Ratio
    interval_quantile: Ratio
    interval_acceptance_ratio: Ratio
    request_quantile: Ratio
    request_acceptance_ratio: Ratio


@dataclass(frozen=True, slots=True)
class VerdictSpeedups(Section):
    NULL_IS_EMPTY = True
    hurting_below: NonNegative
    paying_off_from: NonNegative
    hold: PromDuration = "1m"  # a new verdict replaces the one in force once it has held this long ...
    margin: NonNegative = 0.05  # ... or at once when it holds with its figures this much toward the one in force

    def cross_check(self, context: Context) -> VerdictSpeedups:
        if self.paying_off_from < self.hurting_below:
            raise fail("must not be below verdict.hurting_below", "paying_off_from")
        return self


@dataclass(frozen=True, slots=True)
class CostVsControl(Section):
    """What spec decode may cost against its control pods at comparable load (alerts and the verdict)."""

    NULL_IS_EMPTY = True
    max_preemptions_per_request_increase: NonNegative
    min_throughput_ratio: NonNegative
    min_waiting_requests: NonNegative

    @property
    def bounds(self) -> CapacityBounds:
        return CapacityBounds(self.max_preemptions_per_request_increase, self.min_throughput_ratio,
                              self.min_waiting_requests)


@dataclass(frozen=True, slots=True)
class SpeculationStopped(Section):
    """When a target that speculated counts as stopped: its speculative token share below share_below while it
    generates at least min_generated_tokens_per_second."""

    NULL_IS_EMPTY = True
    share_below: Ratio
    min_generated_tokens_per_second: NonNegative


@dataclass(frozen=True, slots=True)
class ProbeSettings(Section):
    """The bands of `specdecode-exporter probe` (docs/probe.md); below the page threshold it says "disable"."""

    NULL_IS_EMPTY = True
    measure_below: Ratio  # α from the page threshold up to this: "measure P99 under real load"; from here: "ship"
    ship_speedup: Annotated[Number, Range(0, above=True)]  # a median observed speedup below this: "do not ship"


@dataclass(frozen=True, slots=True)
class Statistics(Section):
    """The tests behind every alert on a ratio (core.stats.evidence): what a request proves and the false-alarm
    budgets."""

    NULL_IS_EMPTY = True
    draft_tokens_per_request: Annotated[Number, Range(1)]  # m: the drafted tokens of one request (one unit)
    request_acceptance_sd: Annotated[Number, Range(0, 0.5)]  # s: how requests' acceptance scatters around α
    min_requests: Annotated[Number, Range(1)]  # no alert on a ratio from fewer requests' worth of tokens
    evaluation_interval: PromDuration  # set on the groups the budgets count evaluations of
    page_windows: Annotated[tuple[PromDuration, ...], Field(min_length=1)]  # ascending; the page ORs them
    # each page window's relative share of false_pages_per_30d, in page_windows' order
    page_budget_shares: tuple[Annotated[Number, Range(0, above=True)], ...]
    page_margin: Ratio  # the page's budget holds at α = page threshold + this
    false_pages_per_30d: Annotated[Number, Range(0, above=True)]  # per model, all page windows together
    false_tickets_per_30d: Annotated[Number, Range(0, above=True)]  # per alert on a ratio and model

    def cross_check(self, context: Context) -> Statistics:
        seconds = [validation.duration_seconds(w) for w in self.page_windows]
        if seconds != sorted(set(seconds)):
            raise fail(f"expected ascending, distinct windows, got {', '.join(self.page_windows)}", "page_windows")
        if len(self.page_budget_shares) != len(self.page_windows):
            raise fail(f"expected one share per page window ({', '.join(self.page_windows)}), got "
                       f"{len(self.page_budget_shares)}", "page_budget_shares")
        return self

    def page_budgets(self) -> tuple[float, ...]:
        """False pages per 30 days each page window may cause: false_pages_per_30d split by page_budget_shares."""
        total = sum(self.page_budget_shares)
        return tuple(self.false_pages_per_30d * share / total for share in self.page_budget_shares)

    @property
    def dispersion(self) -> Dispersion:
        return Dispersion(self.draft_tokens_per_request, self.request_acceptance_sd)

    @property
    def min_draft_tokens(self) -> float:
        """The least evidence an alert on α needs: min_requests requests' worth of drafted tokens."""
        return self.min_requests * self.draft_tokens_per_request


@dataclass(frozen=True, slots=True)
class AlertSettings(Section):
    severity: Annotated[str, Choice(*SEVERITIES)]
    for_: Annotated[PromDurationOrZero, Field(alias="for")]
    window: Annotated[str, Choice("short", "long")] | None = None  # where the alert has a rate window


@dataclass(frozen=True, slots=True)
class DashboardSettings(Section):
    NULL_IS_EMPTY = True
    uid: Text
    title: Text
    refresh: Text
    time_from: Text


def _extra_labels(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(f"expected a mapping of label name to value, got {show(value)}")
    return {str(k): str(v) for k, v in value.items()}


@dataclass(frozen=True, slots=True)
class MonitoringConfig(Section):
    runbook_base_url: Text
    selectors: Selectors
    target_labels: LabelNames
    levels: Annotated[tuple[tuple[str, tuple[str, ...]], ...], Pairs(dict[LevelName, LabelNames], non_empty=True)]
    alert_level: Text
    windows: Windows
    quantiles: Annotated[tuple[Ratio, ...], Field(min_length=1)]
    baseline: BaselineRange
    min_draft_tokens_per_second: NonNegative
    min_requests_per_hour: NonNegative
    thresholds: Thresholds
    statistics: Statistics
    speedups: Annotated[VerdictSpeedups, Field(alias="verdict")]
    alerts: Annotated[tuple[tuple[str, AlertSettings], ...], Pairs(dict[str, AlertSettings])]
    dashboard: DashboardSettings
    probe: ProbeSettings
    cost_vs_control: CostVsControl
    speculation_stopped: SpeculationStopped
    extra_alert_labels: Annotated[tuple[tuple[str, str], ...], Pairs(dict[str, str]),
                                  BeforeValidator(_extra_labels)] = ()
    force_for: PromDurationOrZero | None = None  # every alert's `for:` (the end-to-end profile's short waits)
    profile: str | None = field(default=None, metadata={"key": False})

    def cross_check(self, context: Context) -> MonitoringConfig:
        if self.alert_level not in dict(self.levels):
            raise fail(f"{self.alert_level!r} is not one of levels ({', '.join(dict(self.levels))})", "alert_level")
        if self.thresholds.interval_quantile not in self.quantiles:
            raise fail("must be one of quantiles (it is recorded)", "thresholds", "interval_quantile")
        page = self.thresholds.page_acceptance_ratio
        if self.probe.measure_below < page:
            raise fail(f"{self.probe.measure_below:g} must not be below thresholds.page_acceptance_ratio ({page:g})",
                       "probe", "measure_below")
        if self.force_for is None:
            return self
        forced = tuple((name, replace(a, for_=self.force_for)) for name, a in self.alerts)
        return replace(self, alerts=forced)

    # The names the generators read.
    @property
    def metric_selector(self) -> str:
        return self.selectors.metric

    @property
    def exporter_job_selector(self) -> str:
        return self.selectors.exporter_job

    @property
    def short_window(self) -> str:
        return self.windows.short

    @property
    def long_window(self) -> str:
        return self.windows.long

    @property
    def sidecar_windows(self) -> tuple[str, ...]:
        return self.windows.sidecar

    @property
    def verdict_window(self) -> str:
        return self.windows.verdict

    @property
    def sidecar_alert_window(self) -> str:
        return self.windows.sidecar_alert

    @property
    def baseline_range(self) -> str:
        return self.baseline.range

    @property
    def verdict(self) -> VerdictBands:
        return VerdictBands(page_acceptance_ratio=self.thresholds.page_acceptance_ratio,
                            hurting_below=self.speedups.hurting_below, paying_off_from=self.speedups.paying_off_from,
                            capacity=self.cost_vs_control.bounds,
                            hold_seconds=validation.duration_seconds(self.speedups.hold),
                            margin=self.speedups.margin)

    def level_labels(self, level: str | None = None) -> tuple[str, ...]:
        return dict(self.levels)[level or self.alert_level]

    def alert(self, name: str) -> AlertSettings:
        settings = dict(self.alerts).get(name)
        if settings is None:
            raise ConfigError(f"alerts.{name}: missing (severity and for: of every alert)")
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
    data = validation.read_yaml(path, "monitoring config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {show(data)}")
    return data


def load(path: str | Path | None = None, profile: str | None = None) -> MonitoringConfig:
    """The shipped config, with ``path`` (a user's file, only the keys to change) and ``profile`` merged onto it."""
    raw = read_yaml(DEFAULT_FILE)
    if path is not None and Path(path).resolve() != DEFAULT_FILE:
        raw = deep_merge(raw, read_yaml(Path(path)))
    return from_mapping(raw, profile, str(path or DEFAULT_FILE))


@functools.cache
def shipped() -> MonitoringConfig:
    """The config as shipped (cached: the sidecar's defaults read it)."""
    return load()


def from_mapping(raw: Mapping[str, Any], profile: str | None = None, source: str | None = None) -> MonitoringConfig:
    """The config from a merged mapping (``source``, the file named in errors); ``profile`` merged onto it."""
    data = dict(raw)
    profiles = data.pop("profiles", None) or {}
    if not isinstance(profiles, Mapping) or not all(isinstance(p, Mapping) for p in profiles.values()):
        raise ConfigError(f"profiles: expected a mapping of profile name to settings, got {show(profiles)}")
    if profile is not None:
        if profile not in profiles:
            raise ConfigError(f"profiles: no profile {profile!r} (have: {', '.join(sorted(profiles))})")
        data = deep_merge(data, profiles[profile])
    config: MonitoringConfig = validation.validate(MonitoringConfig, data, source)
    return replace(config, profile=profile)
