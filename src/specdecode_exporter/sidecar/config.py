"""YAML + flags → a validated, typed Config (core.config.validation: every problem is one ConfigError line naming the
key, or the flag or environment variable that gave the value).

The sections below are the config tree (core.config.settings): each setting is declared once, as a field of the section
it configures, with its help, flag, variable and reload behaviour; SETTINGS lists them, and the command's flags, its
--help, the reload's notes and docs/configuration.md are built from it. Flags and variables are merged into the
file's mapping by dotted key (``merged``) before it is read, in three steps of the same validation: the file's
sections (ConfigFile), then each target (TargetConfig, whose missing timeout and cost_model come from
collect.timeout and the top-level cost_model), then the request tap (TapSettings, declared beside the tap's code in
tap/settings.py; its target and upstream default to the first target's). TargetConfig, TLSConfig, BaselineConfig and
TapSettings are what the sidecar and the tap run with, and their fields are the keys. Config is the validated tree
the sidecar reads: the file's sections as they are (``config.collect.interval``), the targets and windows resolved,
and the monitoring config's verdict settings. The tap's section was called proxy: RENAMED keeps that name working
for a release.
"""
from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, GetCoreSchemaHandler, ValidationInfo
from pydantic_core import core_schema

from specdecode_exporter.core.config import validation
from specdecode_exporter.core.config.kinds import ListenAddress
from specdecode_exporter.core.config.settings import Renamed, Renaming, Setting, env_name, put, setting, tree
from specdecode_exporter.core.config.validation import (
    Bool,
    Choice,
    ConfigError,
    Context,
    Duration,
    Int,
    Named,
    Number,
    Range,
    Section,
    Size,
    SourcedError,
    Text,
    fail,
    show,
    words,
)
from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.contract.verdict import VerdictBands
from specdecode_exporter.core.process.log import event
from specdecode_exporter.pipeline.derive import CostModel
from specdecode_exporter.tap.settings import TapSettings

RESERVED_LABELS = frozenset(
    {"target", "model_name", "engine", "window", "position", "reason", "api", "method", "num_speculative_tokens",
     "le", "job", "instance"}
)
RESERVED_PATHS = frozenset({"/", "/healthz", "/readyz", "/api/v1/status", "/-/reload"})
LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("logfmt", "json")
DEFAULT_TARGET_URL = "http://127.0.0.1:8000/metrics"
DEFAULT_TARGET_NAME = "vllm"  # the default target's, and that of a target without a name
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


# ---------- the value types of the sidecar's keys and flags ----------

@dataclass(frozen=True, slots=True)
class Window:
    name: str  # as written, e.g. "5m"; the value of the window label
    seconds: float


def _windows(value: object) -> tuple[Window, ...]:
    """'1m,5m' or [1m, 5m] → windows, shortest first; each as written is its window label."""
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise fail(f"expected a list of durations like [1m, 5m] or '1m,5m', got {show(value)}")
    windows = []
    for i, item in enumerate(items):
        name = str(item).strip()
        windows.append(Window(name, validation.duration_seconds(name, i)))
    if not windows:
        raise fail("at least one window is needed")
    if len({w.name for w in windows}) != len(windows):
        raise fail(f"windows must be distinct, got {', '.join(w.name for w in windows)}")
    return tuple(sorted(windows, key=lambda w: w.seconds))


def _url(value: object, info: ValidationInfo) -> str:
    """The one check of a URL the exporter reaches: a target's (``run``), ``check``'s and ``probe``'s. An http(s)
    URL with a host, a port from 1 to 65535 if it has one, and no credentials. A command whose URL has another shape
    puts ``url_example`` (the example in the message) and ``url_credentials`` (what to say instead of
    bearer_token_file) in the validation context."""
    context = info.context or {}
    try:
        parts = urlsplit(str(value))
        ok = isinstance(value, str) and parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # e.g. an unbalanced [ in the host
        ok = False
    if not ok:
        raise fail(f"expected an http(s) URL like {context.get('url_example', DEFAULT_TARGET_URL)}, "
                   f"got {show(value)}")
    try:
        port = parts.port
    except ValueError:  # not a number, or over 65535
        port = 0
    if port == 0:
        raise fail(f"expected a port from 1 to 65535 in the URL, got {show(value)}")
    if parts.username is not None or parts.password is not None:
        # URLs are logged and shown on the status page; secrets only ever come from files.
        raise fail(f"credentials in the URL are not allowed; {context.get('url_credentials', 'use bearer_token_file')}")
    return str(value)


def _url_path(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise fail(f"expected a path starting with /, got {show(value)}")
    return value


def _labels(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise fail(f"expected a mapping of label name to value, got {show(value)}")
    for name, label_value in value.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise fail("not a valid Prometheus label name", str(name))
        if name in RESERVED_LABELS:
            raise fail("reserved by the exporter; choose another label name", name)
        if not isinstance(label_value, str | int | float) or isinstance(label_value, bool):
            raise fail(f"expected a string value, got {show(label_value)}", name)
    return tuple(sorted((k, str(v)) for k, v in value.items()))


def _windows_text(windows: tuple[Window, ...]) -> str:
    return ",".join(w.name for w in windows)


Windows = Annotated[tuple[Window, ...], BeforeValidator(_windows), Named("windows", _windows_text)]
Url = Annotated[str, BeforeValidator(_url), Named("URL")]
UrlPath = Annotated[str, BeforeValidator(_url_path), Named("path")]
FilePath = Annotated[str, words("a path"), Named("file")]
Cost = Annotated[Number, Range(0, 10)]
Seconds = Annotated[Number, Range(0, above=True)]
LogLevel = Annotated[str, Choice(*LOG_LEVELS), Named("level")]
LogFormat = Annotated[str, Choice(*LOG_FORMATS), Named("format")]


# ---------- targets ----------

@dataclass(frozen=True, slots=True)
class TLSConfig(Section):
    """How to reach an https target (Prometheus' tls_config names). Files are read when the target's
    collection loop starts, i.e. at start and on every reload."""

    ca_file: FilePath | None = None
    cert_file: FilePath | None = None
    key_file: FilePath | None = None
    server_name: Annotated[str, words("a host name")] | None = None
    insecure_skip_verify: Bool = False

    def cross_check(self, context: Context) -> TLSConfig:
        if bool(self.cert_file) != bool(self.key_file):
            raise fail("cert_file and key_file go together")
        try:
            self.ssl_context()
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise fail(f"cannot load: {getattr(exc, 'strerror', None) or exc}") from None
        return self

    def ssl_context(self) -> ssl.SSLContext:
        """Raises OSError or ssl.SSLError on unreadable or bad files."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        if self.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


@dataclass(frozen=True, slots=True)
class BaselineConfig(Section):
    """What a spec-decode target's latency is compared with: a control target (the same model served with spec
    decode off) or TPOT figures from a measurement."""

    target: Annotated[str, words("the name of a target with spec_decode: false")] | None = None
    time_per_output_token_seconds: Seconds | None = None
    p50: Seconds | None = None
    p99: Seconds | None = None

    def cross_check(self, context: Context) -> BaselineConfig:
        if (self.target is None) == (self.time_per_output_token_seconds is None):
            raise fail("give target (a control target) or time_per_output_token_seconds, one of them")
        if self.target is not None and (self.p50 is not None or self.p99 is not None):
            raise fail("p50 and p99 go with time_per_output_token_seconds, not with a target")
        return self


@dataclass(frozen=True, slots=True)
class CostModelSection(Section):
    """``cost_model``: c_draft, or the draft and target parameter counts it is the ratio of; absent keys keep the
    default's (the top-level cost_model's, for a target)."""

    NULL_IS_EMPTY = True
    c_draft: Cost | None = None
    c_verify: Cost | None = None
    draft_parameters: Annotated[Number, Range(0)] | None = None
    target_parameters: Annotated[Number, Range(1)] | None = None
    c_verify_max: Cost | None = None
    saturating_batch: Annotated[Number, Range(0)] | None = None

    def cross_check(self, context: Context) -> CostModelSection:
        counts = (self.draft_parameters is not None, self.target_parameters is not None)
        if self.c_draft is not None and any(counts):
            raise fail("give c_draft or draft_parameters/target_parameters, not both")
        if any(counts) and not all(counts):
            raise fail("draft_parameters and target_parameters go together")
        return self

    def resolve(self, default: CostModel) -> CostModel:
        c_draft = self.c_draft
        if self.draft_parameters is not None and self.target_parameters is not None:
            c_draft = self.draft_parameters / self.target_parameters
        return CostModel(
            c_draft=default.c_draft if c_draft is None else c_draft,
            c_verify=default.c_verify if self.c_verify is None else self.c_verify,
            c_verify_max=default.c_verify_max if self.c_verify_max is None else self.c_verify_max,
            saturating_batch=default.saturating_batch if self.saturating_batch is None else self.saturating_batch,
        )


class _CostModel:
    """A cost_model section, resolved onto the default cost model of the validation context."""

    @staticmethod
    def __get_pydantic_core_schema__(source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def resolve(section: CostModelSection, info: core_schema.ValidationInfo) -> CostModel:
            return section.resolve((info.context or {}).get("cost_model", CostModel()))

        return core_schema.with_info_after_validator_function(resolve, handler.generate_schema(CostModelSection))


@dataclass(frozen=True, slots=True)
class TargetConfig(Section):
    name: Text
    url: Url
    timeout: Duration = 3.0
    labels: Annotated[tuple[tuple[str, str], ...], BeforeValidator(_labels)] = ()
    method: Annotated[str, words("a string like eagle3 or ngram")] | None = None
    num_speculative_tokens: Annotated[Int, Range(1)] | None = None
    model_name: Annotated[str, words("the served model's name")] | None = None  # for engines whose metrics
    # carry no model label (llama.cpp)
    spec_decode: Bool = True  # False: a control target (spec decode off), collected for its latency only
    # vLLM with enable_adaptive_verification: vllm:spec_decode_num_draft_tokens then counts proposed tokens (unless a
    # build counts verified ones), so without vLLM's verified-token counter the drafted-token count, and α and
    # everything built on it, are withheld rather than guessed (docs/engines.md). vLLM does not export the setting.
    adaptive_verification: Bool = False
    # vLLM's speculative-config rejection_sample_method, where it changes what α means (fly: lossy, synthetic:
    # forced); vLLM does not export it. The status page says what α then is (no series changes).
    rejection_sample_method: Annotated[str, words("a word like standard or fly")] | None = None
    baseline: BaselineConfig | None = None
    cost: Annotated[CostModel, Field(alias="cost_model"), _CostModel()] = field(default_factory=CostModel)
    bearer_token_file: FilePath | None = None
    tls: Annotated[TLSConfig | None, Field(alias="tls_config")] = None


def _target_list(value: object) -> object:
    """The file's targets: a non-empty list (the default target is for a file without the key, not an empty one)."""
    if value is not None and not isinstance(value, list):
        raise fail(f"expected a list of targets, got {show(value)}")
    if not value:
        raise fail(f"no target configured: list at least one, or leave the key out for the default "
                   f"({DEFAULT_TARGET_NAME} at {DEFAULT_TARGET_URL})")
    return value


def _unnamed_clash(entries: tuple[Any, ...]) -> None:
    """A ConfigError when a target without a name (called DEFAULT_TARGET_NAME) shares that name with another: the
    error asks for names, rather than calling one the user never wrote a duplicate."""
    names = [t.get("name", DEFAULT_TARGET_NAME) if isinstance(t, Mapping) else None for t in entries]
    for i, entry in enumerate(entries):
        others = [j for j, name in enumerate(names) if name == DEFAULT_TARGET_NAME and j != i]
        if isinstance(entry, Mapping) and "name" not in entry and others:
            raise ConfigError(f"targets[{i}]: a target without a name is called {DEFAULT_TARGET_NAME!r}, as is "
                              f"targets[{others[0]}]; give each target its own name (its target label)")


def _tap_keys(value: object) -> object:
    """The file's tap section: only TapSettings' keys (validated once the flags and targets are known)."""
    if value is not None and not isinstance(value, Mapping):
        raise fail(f"expected a mapping, got {show(value)}")
    return TapSettings.check_keys(value)


def api_base(url: str) -> str:
    """The scheme, host and port of a metrics URL: where the same server's OpenAI API is."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def tap_config(section: Mapping[str, Any] | None, targets: tuple[TargetConfig, ...],
               origins: Mapping[str, str] | None = None, name: str = "tap") -> TapSettings | None:
    """The tap section (the --tap.* flags are merged into it already); None (the tap off) when no listen address is
    set. ``name``: the section as the file called it (tap, or proxy: RENAMED), for the messages."""
    raw = dict(section or {})
    if raw.get("listen_address") is None:
        if raw.get("route") is not None:
            raise ConfigError(f"{name}.route: routing needs the request tap: set {name}.listen_address "
                              "(--tap.listen-address)")
        return None
    names = [t.name for t in targets]
    target = raw.get("target", names[0] if names else None)
    if target not in names:
        raise ConfigError(f"{name}.target: {target!r} is not one of the targets ({', '.join(names)})")
    if not raw.get("upstream"):
        raw["upstream"] = api_base(next(t.url for t in targets if t.name == target))
    tap: TapSettings = validation.validate(TapSettings, {**raw, "target": target}, at=("tap",), origins=origins)
    check_not_itself(tap, defaulted=not (section or {}).get("upstream"), origins=origins or {}, name=name)
    return tap


def check_not_itself(tap: TapSettings, defaulted: bool, origins: Mapping[str, str], name: str = "tap") -> None:
    """A ConfigError when the tap's upstream (or routing's fallback) is the tap itself: every request would loop
    until the sockets run out. ``defaulted``: the upstream is the target's, not given."""
    fallback = tap.route.fallback_upstream if tap.route else None
    for key, upstream in (("upstream", tap.upstream), ("route.fallback_upstream", fallback)):
        if upstream is None or not relays_to_itself(tap.listen_address, upstream):
            continue
        origin = origins.get(f"tap.{key}")
        given = key != "upstream" or not defaulted
        default = "" if given else f" (the default: the host and port of target {tap.target!r})"
        listen = origins.get("tap.listen_address", f"{name}.listen_address")
        raise (SourcedError if origin else ConfigError)(
            f"{origin or f'{name}.{key}'}: {upstream}{default} is the tap's own address ({listen} "
            f"{tap.listen_address}): the tap would relay every request to itself; point it at vLLM")


def relays_to_itself(listen_address: str, upstream: str) -> bool:
    """Whether a tap listening on ``listen_address`` is what ``upstream`` (http://host:port) reaches: the same port,
    and the same host as written, or 127.0.0.1 (::1) where the tap listens on every IPv4 (IPv6) address, which
    takes the loopback port too (asyncio binds IPv6 sockets v6-only, so :: does not cover 127.0.0.1). Other
    spellings of one host (localhost, the pod's IP) may reach another server and are left alone."""
    host, port = split_listen_address(listen_address)
    try:
        parts = urlsplit(upstream)
        upstream_host, upstream_port = (parts.hostname or "").lower(), parts.port or 80
    except ValueError:
        return False
    if port == 0 or upstream_port != port:
        return False
    host = host.lower()
    return upstream_host == host or (host, upstream_host) in (("0.0.0.0", "127.0.0.1"), ("::", "::1"))


# ---------- the file ----------

DEFAULT_WINDOWS = ",".join(monitoring_config.shipped().sidecar_windows)


@dataclass(frozen=True, slots=True)
class WebSection(Section):
    NULL_IS_EMPTY = True
    listen_address: ListenAddress = setting(":9877", "address to serve on", reload=False)
    telemetry_path: UrlPath = setting("/metrics", "path under which to expose metrics", reload=False)
    config_file: FilePath | None = setting(
        None, "exporter-toolkit web config: TLS and basic auth for the sidecar's endpoints", flag="--web.config.file",
        reload=False)


@dataclass(frozen=True, slots=True)
class CollectSection(Section):
    NULL_IS_EMPTY = True
    interval: Duration = setting(5.0, "how often to collect the engines' metrics (vLLM V0 targets: at most 2 s)")
    timeout: Duration = setting(3.0, "timeout of one collection, for a target without a timeout of its own")
    max_body_size: Size = setting(
        16 * 1024 * 1024, "largest exposition accepted, after gunzip (a larger one fails as too_large)")
    stale_after: Duration = setting(600.0, "drop a label set not seen for this long")
    concurrency: Annotated[Int, Range(1)] = setting(16, "collections in flight at once", flag=False, reload=False)
    max_series_per_target: Annotated[Int, Range(1)] = setting(
        1000, "label sets kept per target; more are dropped and counted", flag=False)


@dataclass(frozen=True, slots=True)
class LogSection(Section):
    NULL_IS_EMPTY = True
    level: LogLevel = setting("info", f"one of {', '.join(LOG_LEVELS)}")
    format: LogFormat = setting("logfmt", f"one of {', '.join(LOG_FORMATS)}")


@dataclass(frozen=True, slots=True)
class MonitoringSection(Section):
    NULL_IS_EMPTY = True
    config_file: FilePath | None = setting(
        None, "the monitoring config the verdict reads (thresholds, bands), merged onto the shipped one; the same "
              "file the rules and dashboard are built from", shown="the shipped one")


@dataclass(frozen=True, slots=True)
class ConfigFile(Section):
    """The sidecar's YAML file, its sections validated; targets and tap are validated as TargetConfig and
    TapSettings once the defaults they take from the rest of the file (and the flags) are known."""

    NULL_IS_EMPTY = True
    web: WebSection = WebSection()
    collect: CollectSection = CollectSection()
    windows: Windows | None = setting(None, "windows of the windowed gauges (comma-separated in a flag)",
                                      flag="--collect.windows", shown=DEFAULT_WINDOWS)
    targets: Annotated[tuple[dict[str, Any], ...] | None, BeforeValidator(_target_list)] = None  # None: the default
    cost_model: CostModelSection = CostModelSection()
    page_threshold: Annotated[Number, Range(0, 1)] | None = setting(
        None, "the verdict's page threshold, for this sidecar only (the alert rules keep the monitoring config's)",
        flag=False, shown="the monitoring config's")
    log: LogSection = LogSection()
    monitoring: MonitoringSection = MonitoringSection()
    tap: Annotated[dict[str, Any] | None, BeforeValidator(_tap_keys)] = field(
        default=None, metadata={"section": TapSettings})  # validated once the targets are known

    def targets_config(self, origins: Mapping[str, str] | None = None) -> tuple[TargetConfig, ...]:
        """The file's targets (or --target's); a target without timeout or cost_model takes collect.timeout and
        cost_model."""
        default_cost = self.cost_model.resolve(CostModel())
        _unnamed_clash(self.targets or ())
        raw = [{"name": DEFAULT_TARGET_NAME, "timeout": self.collect.timeout, "cost_model": None, **t}
               for t in self.targets or ()]
        targets: tuple[TargetConfig, ...] = validation.validate(
            tuple[TargetConfig, ...], raw, context={"cost_model": default_cost}, at=("targets",), origins=origins)
        return targets


# ---------- what the sidecar reads ----------

@dataclass(frozen=True, slots=True)
class Config:
    """The validated tree the sidecar runs with: the file's sections as they are (``config.collect.interval``), the
    targets and windows resolved, and what the monitoring config gives the verdict."""

    targets: tuple[TargetConfig, ...] = ()
    windows: tuple[Window, ...] = ()
    web: WebSection = WebSection()
    collect: CollectSection = CollectSection()
    log: LogSection = LogSection()
    monitoring: MonitoringSection = MonitoringSection()  # config_file None: the shipped monitoring config
    # From the monitoring config (the shipped one unless monitoring.config_file names another).
    verdict: VerdictBands = field(default_factory=lambda: monitoring_config.shipped().verdict)
    verdict_window: str = field(default_factory=lambda: monitoring_config.shipped().verdict_window)
    speculation_stopped: monitoring_config.SpeculationStopped = field(
        default_factory=lambda: monitoring_config.shipped().speculation_stopped)
    # The page's statistics: the configured variance (m, s) and min_requests, for the measured variance's gauge.
    statistics: monitoring_config.Statistics = field(default_factory=lambda: monitoring_config.shipped().statistics)
    tap: TapSettings | None = None  # the request tap, off unless a listen address is given
    source: str = "flags"  # where the config came from, for messages
    deprecated: tuple[str, ...] = ()  # one warning line per deprecated name the config used (RENAMED), logged at
    # start and at each reload

    @property
    def longest_window(self) -> float:
        return max((w.seconds for w in self.windows), default=0.0)

    @property
    def page_threshold(self) -> float:
        return self.verdict.page_acceptance_ratio


SETTINGS = tree(ConfigFile)
"""Every setting of the sidecar (``run``), in the order declared: the flags, --help, the reload's notes and the
configuration reference are built from it."""
RENAMED = Renamed("proxy", "tap")
"""The tap's section was called proxy: its proxy.* keys, --proxy.* flags and SPECDECODE_PROXY_* variables keep
working, each with a warning, for one more release (CHANGELOG.md)."""
DEPRECATED: tuple[Setting, ...] = tuple(alias for item in SETTINGS if (alias := RENAMED.alias(item)) is not None)
"""The tap's settings under their old names: hidden flags of ``run``, and variables it knows."""


@dataclass(frozen=True)
class OuterFlag:
    """A flag of ``run`` that is not a setting of the tree: the file the tree is read from, and the targets (a list
    of sections, each flag one entry). Declared here so that --help and the reference come from one place."""

    key: str
    flag: str
    type_name: str
    default: str
    reload: str
    help: str

    @property
    def env(self) -> str:
        return env_name(self.flag)

    @property
    def flag_help(self) -> str:
        return f"{self.help} (default {self.default}; env {self.env})"


CONFIG_FILE_FLAG = OuterFlag("", "--config.file", "file", "none", "the path: restart",
                             "YAML configuration: the keys below and the targets' own keys (docs/configuration.md)")
TARGET_FLAG = OuterFlag("targets", "--target", "[NAME=]URL", DEFAULT_TARGET_URL,
                        "applied (the file's)", "a vLLM /metrics URL; repeatable (the variable: comma-separated); "
                        "replaces the file's targets, each taking collect.timeout and cost_model")
CONTROL_TARGET_FLAG = OuterFlag("targets", "--control-target", "[NAME=]URL", "none", "applied (the file's)",
                                "a vLLM /metrics URL serving the same model without spec decode (a control target, "
                                "spec_decode: false), the baseline of every --target; goes with --target")
OUTER_FLAGS = (CONFIG_FILE_FLAG, TARGET_FLAG, CONTROL_TARGET_FLAG)


def reference_table() -> str:
    """The configuration reference (docs/configuration.md): the file and the targets, then one row per setting of
    the tree."""
    rows = ["| key | type | default | flag | environment variable | reload | what it sets |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for outer in OUTER_FLAGS:
        rows.append(f"| {f'`{outer.key}`' if outer.key else ''} | {outer.type_name} | `{outer.default}` | "
                    f"`{outer.flag}` | `{outer.env}` | {outer.reload} | {outer.help} |")
    for item in SETTINGS:
        flag, env = (f"`{item.flag}`", f"`{item.env}`") if item.flag else ("", "")
        reload = "applied" if item.reload else "restart"
        rows.append(f"| `{item.key}` | {item.type_name} | `{item.shown}` | {flag} | {env} | {reload} | "
                    f"{item.help.replace('|', '/')} |")
    return "\n".join(rows)


def parse_windows(value: str | list[Any], where: str) -> tuple[Window, ...]:
    windows: tuple[Window, ...] = validation.validate(Windows, value, where)
    return windows


def split_listen_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def load_monitoring(file: ConfigFile) -> monitoring_config.MonitoringConfig:
    """The monitoring config the verdict reads: monitoring.config_file, else the shipped one."""
    path = file.monitoring.config_file
    try:
        return monitoring_config.load(path) if path else monitoring_config.shipped()
    except ConfigError as exc:
        raise ConfigError(f"monitoring.config_file: {exc}") from None


def merged(data: Any, flags: Mapping[str, object]) -> Any:
    """The file's mapping with the values of flags and environment variables (by dotted key) over it: the one place
    they meet, before the one validation. A file that is not a mapping is left for the validation to refuse."""
    if data is not None and not isinstance(data, Mapping):
        return data
    for key, value in flags.items():
        data = put(data, key, value)
    return data if data is not None else {}


def config_from_mapping(data: Any, source: str, flags: Mapping[str, object] | None = None,
                        origins: Mapping[str, str] | None = None) -> Config:
    """The config from a YAML mapping, with ``flags`` (dotted key → value) over it; ``origins`` names the flag or
    variable that gave each, for the error about it. The tap's old names (RENAMED) are made new first; an error
    about the file's tap section names it as the file does."""
    renaming = RENAMED.apply(data, flags or {}, origins or {})
    try:
        return _config(renaming, source)
    except SourcedError:
        raise
    except ConfigError as exc:
        raise ConfigError(renaming.as_written(str(exc))) from None


def _config(renaming: Renaming, source: str) -> Config:
    origins = renaming.origins
    file: ConfigFile = validation.validate(ConfigFile, merged(renaming.data, renaming.flags), origins=origins)
    targets = file.targets_config(origins)
    if not targets:  # no targets key: the vLLM beside the sidecar
        targets = (TargetConfig(name=DEFAULT_TARGET_NAME, url=DEFAULT_TARGET_URL, timeout=file.collect.timeout),)
    monitoring = load_monitoring(file)
    verdict = monitoring.verdict
    if file.page_threshold is not None:
        verdict = replace(verdict, page_acceptance_ratio=file.page_threshold)
    config = Config(
        targets=targets,
        windows=file.windows or parse_windows(list(monitoring.sidecar_windows), "monitoring windows.sidecar"),
        web=file.web,
        collect=file.collect,
        log=file.log,
        monitoring=file.monitoring,
        verdict=verdict,
        verdict_window=monitoring.verdict_window,
        speculation_stopped=monitoring.speculation_stopped,
        statistics=monitoring.statistics,
        tap=tap_config(file.tap, targets, origins, renaming.written),
        source=source,
        deprecated=renaming.warnings,
    )
    return check_config(config)


def warn_deprecated(config: Config) -> None:
    """One warning line per deprecated name the config used: at start, and at each reload."""
    for line in config.deprecated:
        event(logging.WARNING, "deprecated setting name", detail=line)


def check_config(config: Config) -> Config:
    """The rules between targets and the web settings, for a config from a file, flags or both."""
    names = [t.name for t in config.targets]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"targets: duplicate target name {duplicates[0]!r}; every target needs its own name")
    if config.web.telemetry_path in RESERVED_PATHS:
        raise ConfigError(f"web.telemetry_path: {config.web.telemetry_path} is used by the exporter itself")
    controls = {t.name for t in config.targets if not t.spec_decode}
    for i, target in enumerate(config.targets):
        wanted = target.baseline.target if target.baseline else None
        if wanted is not None and wanted not in controls:
            raise ConfigError(f"targets[{i}].baseline.target: {wanted!r} is not a target with spec_decode: false")
        if not target.spec_decode and target.baseline is not None:
            raise ConfigError(f"targets[{i}].baseline: a control target (spec_decode: false) has no baseline")
    return config


def load_config_file(path: str, monitoring_file: str | None = None, flags: Mapping[str, object] | None = None,
                     origins: Mapping[str, str] | None = None) -> Config:
    """The config file at ``path`` with ``flags`` over it (``monitoring_file``: --monitoring.config-file's)."""
    data = validation.read_yaml(path, "config file")
    if monitoring_file is not None:
        flags = {**(flags or {}), "monitoring.config_file": monitoring_file}
    try:
        return config_from_mapping(data, path, flags, origins)
    except SourcedError:  # names the flag or variable that gave the value, not the file
        raise
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def target_entries(specs: list[str], source: str, unnamed: str = DEFAULT_TARGET_NAME) -> list[dict[str, Any]]:
    """``--target URL`` or ``--target name=URL`` as the targets key's entries; the first unnamed target is called
    ``unnamed`` (vllm), the next ones vllm-2, …. Each URL is checked here, so that its error names ``source`` (the
    flag or the variable)."""
    entries: list[dict[str, Any]] = []
    for i, spec in enumerate(specs):
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = (unnamed if i == 0 else f"{unnamed}-{i + 1}"), spec
        entries.append({"name": name, "url": validation.validate(Url, url, source)})
    return entries


def with_control(targets: list[dict[str, Any]], controls: list[str], source: str) -> list[dict[str, Any]]:
    """``--control-target``'s entries (spec_decode: false) after ``targets``, which take the control as their
    baseline. One control only: several are paired with their targets in the config file (baseline.target)."""
    entries = target_entries(controls, source, unnamed="control")
    if len(entries) > 1:
        raise SourcedError(f"{source}: one control target on the command line; pair several with their targets in "
                           "the config file (spec_decode: false, baseline.target)")
    (control,) = entries
    paired = [{**entry, "baseline": {"target": control["name"]}} for entry in targets]
    return [*paired, {**control, "spec_decode": False}]
