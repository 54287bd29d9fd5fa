"""YAML + flags → a validated, typed Config. Every problem is one ConfigError line naming the key."""

from __future__ import annotations

import contextlib
import difflib
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from specdecode_exporter.core import monitoring_config
from specdecode_exporter.core.validation import ConfigError
from specdecode_exporter.core.verdict import VerdictBands
from specdecode_exporter.pipeline.derive import CostModel

RESERVED_LABELS = frozenset(
    {"target", "model_name", "engine", "window", "position", "reason", "api", "method", "num_speculative_tokens",
     "le", "job", "instance"}
)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?", re.IGNORECASE)
_SIZE_FACTORS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3}


@dataclass(frozen=True, slots=True)
class Window:
    name: str  # as written, e.g. "5m"; the value of the window label
    seconds: float


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """How to reach an https target (Prometheus' tls_config names). Files are read when the target's
    collection loop starts, i.e. at start and on every reload."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False

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
class BaselineConfig:
    """What a spec-decode target's latency is compared with: a control target (the same model served with spec
    decode off) or TPOT figures from a measurement."""

    target: str | None = None
    time_per_output_token_seconds: float | None = None
    p50: float | None = None
    p99: float | None = None


@dataclass(frozen=True, slots=True)
class TargetConfig:
    name: str
    url: str
    timeout: float = 3.0
    labels: tuple[tuple[str, str], ...] = ()
    method: str | None = None
    num_speculative_tokens: int | None = None
    model_name: str | None = None  # for engines whose metrics carry no model label (llama.cpp)
    spec_decode: bool = True  # False: a control target (spec decode off), collected for its latency only
    baseline: BaselineConfig | None = None
    cost: CostModel = field(default_factory=CostModel)
    bearer_token_file: str | None = None
    tls: TLSConfig | None = None


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The request tap: the sidecar also forwards vLLM's OpenAI API and reads each response's per-request metrics."""

    listen_address: str
    upstream: str  # http://host:port of vLLM's API (default: the target's scheme, host and port)
    target: str  # the target whose series the tap's figures go with
    workload_header: str = "x-workload"
    max_workloads: int = 10
    temperature_bands: tuple[float, ...] = (0.3, 0.7)  # the edges of the temperature label's bands
    connect_timeout: float = 3.0
    drain_timeout: float = 20.0  # on shutdown: how long requests in flight may take to finish


@dataclass(frozen=True, slots=True)
class Config:
    targets: tuple[TargetConfig, ...] = ()
    windows: tuple[Window, ...] = ()
    collect_interval: float = 5.0
    max_body_bytes: int = 16 * 1024 * 1024
    stale_after: float = 600.0
    concurrency: int = 16
    max_series_per_target: int = 1000
    # From the monitoring config (the shipped one unless monitoring.config_file names another).
    verdict: VerdictBands = field(default_factory=lambda: monitoring_config.shipped().verdict)
    verdict_window: str = field(default_factory=lambda: monitoring_config.shipped().verdict_window)
    monitoring_config_file: str | None = None  # None: the shipped monitoring config
    proxy: ProxyConfig | None = None  # the request tap, off unless a listen address is given
    listen_address: str = ":9877"
    telemetry_path: str = "/metrics"
    web_config_file: str | None = None
    log_level: str = "info"
    log_format: str = "logfmt"
    source: str = "flags"  # where the config came from, for messages

    @property
    def longest_window(self) -> float:
        return max((w.seconds for w in self.windows), default=0.0)

    @property
    def page_threshold(self) -> float:
        return self.verdict.page_acceptance_ratio


DEFAULT_WINDOWS = ",".join(monitoring_config.shipped().sidecar_windows)
DEFAULT_TARGET_URL = "http://127.0.0.1:8000/metrics"


def parse_duration(text: str | float | int, where: str, allow_zero: bool = False) -> float:
    """'5s', '1m30s', '500ms', '1h' or a number of seconds → seconds (> 0, or ≥ 0 with allow_zero)."""
    if isinstance(text, bool):
        raise ConfigError(f"{where}: expected a duration like 5s, got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        raw = str(text).strip()
        parts = _DURATION_PART.findall(raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            try:
                seconds = float(raw)
            except ValueError:
                raise ConfigError(f"{where}: expected a duration like 5s, 1m or 500ms, got {text!r}") from None
        else:
            seconds = sum(float(n) * _DURATION_SECONDS[u] for n, u in parts)
    if allow_zero and seconds == 0:
        return 0.0
    if not seconds > 0:
        raise ConfigError(f"{where}: must be {'0 or more' if allow_zero else 'greater than 0'}, got {text!r}")
    return seconds


def parse_size(text: str | int, where: str) -> int:
    match = _SIZE.fullmatch(str(text).strip())
    if match is None or isinstance(text, bool):
        raise ConfigError(f"{where}: expected a size like 16MiB, got {text!r}")
    size = int(float(match.group(1)) * _SIZE_FACTORS[(match.group(2) or "b").lower()])
    if size <= 0:
        raise ConfigError(f"{where}: must be greater than 0, got {text!r}")
    return size


def parse_windows(value: str | list[Any], where: str) -> tuple[Window, ...]:
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    windows: list[Window] = []
    for i, item in enumerate(items):
        name = str(item).strip()
        windows.append(Window(name, parse_duration(name, f"{where}[{i}]")))
    if not windows:
        raise ConfigError(f"{where}: at least one window is needed")
    if len({w.name for w in windows}) != len(windows):
        raise ConfigError(f"{where}: windows must be distinct, got {', '.join(w.name for w in windows)}")
    return tuple(sorted(windows, key=lambda w: w.seconds))


def validate_url(url: Any, where: str) -> str:
    try:
        parts = urlsplit(str(url))
        ok = isinstance(url, str) and parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # e.g. an unbalanced [ in the host
        ok = False
    if not ok:
        raise ConfigError(f"{where}: expected an http(s) URL like {DEFAULT_TARGET_URL}, got {url!r}")
    if parts.username is not None or parts.password is not None:
        # URLs are logged and shown on the status page; secrets only ever come from files.
        raise ConfigError(f"{where}: credentials in the URL are not allowed; use bearer_token_file")
    return str(url)


def validate_listen_address(address: str, where: str) -> str:
    _, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}: expected host:port or :port, got {address!r}")
    return address


def split_listen_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def _check_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(sorted(allowed))})"
            raise ConfigError(f"{where}.{key}: unknown key{hint}" if where else f"{key}: unknown key{hint}")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _number(value: Any, where: str, low: float, high: float | None = None) -> float:
    if isinstance(value, str):  # YAML 1.1 reads 8e9 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{where}: must be {bound}, got {value!r}")
    return float(value)


def _int(value: Any, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if value < low:
        raise ConfigError(f"{where}: must be at least {low}, got {value!r}")
    return value


def parse_cost_model(data: Any, where: str, default: CostModel) -> CostModel:
    data = _mapping(data, where)
    _check_keys(data, {"c_draft", "c_verify", "draft_parameters", "target_parameters", "c_verify_max",
                       "saturating_batch"}, where)

    def number(key: str, high: float | None, fallback: float) -> float:
        return _number(data[key], f"{where}.{key}", 0, high) if key in data else fallback

    load = {"c_verify_max": number("c_verify_max", 10, default.c_verify_max),
            "saturating_batch": number("saturating_batch", None, default.saturating_batch)}
    c_verify = number("c_verify", 10, default.c_verify)
    if "c_draft" in data:
        if "draft_parameters" in data or "target_parameters" in data:
            raise ConfigError(f"{where}: give c_draft or draft_parameters/target_parameters, not both")
        return CostModel(number("c_draft", 10, default.c_draft), c_verify, **load)
    if "draft_parameters" in data or "target_parameters" in data:
        if not ("draft_parameters" in data and "target_parameters" in data):
            raise ConfigError(f"{where}: draft_parameters and target_parameters go together")
        draft = _number(data["draft_parameters"], f"{where}.draft_parameters", 0)
        target = _number(data["target_parameters"], f"{where}.target_parameters", 1)
        return CostModel(draft / target, c_verify, **load)
    return CostModel(default.c_draft, c_verify, **load)


def parse_baseline(data: Any, where: str) -> BaselineConfig | None:
    """baseline: {target: NAME} (a control target) or {time_per_output_token_seconds: S, p50: S, p99: S}."""
    if data is None:
        return None
    data = _mapping(data, where)
    _check_keys(data, {"target", "time_per_output_token_seconds", "p50", "p99"}, where)
    numbers = {key: _number(data[key], f"{where}.{key}", 1e-9) for key in ("time_per_output_token_seconds", "p50",
                                                                            "p99") if key in data}
    target = _optional_str(data, "target", where, "the name of a target with spec_decode: false")
    if (target is None) == ("time_per_output_token_seconds" not in numbers):
        raise ConfigError(f"{where}: give target (a control target) or time_per_output_token_seconds, one of them")
    if target is not None and numbers:
        raise ConfigError(f"{where}: p50 and p99 go with time_per_output_token_seconds, not with a target")
    return BaselineConfig(target=target, time_per_output_token_seconds=numbers.get("time_per_output_token_seconds"),
                          p50=numbers.get("p50"), p99=numbers.get("p99"))


def parse_labels(data: Any, where: str) -> tuple[tuple[str, str], ...]:
    labels = _mapping(data, where)
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ConfigError(f"{where}.{name}: not a valid Prometheus label name")
        if name in RESERVED_LABELS:
            raise ConfigError(f"{where}.{name}: reserved by the exporter; choose another label name")
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{where}.{name}: expected a string value, got {value!r}")
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _optional_str(data: Mapping[str, Any], key: str, where: str, what: str) -> str | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{where}.{key}: expected {what}, got {value!r}")
    return value


def parse_tls_config(data: Any, where: str) -> TLSConfig | None:
    if data is None:
        return None
    data = _mapping(data, where)
    _check_keys(data, {"ca_file", "cert_file", "key_file", "server_name", "insecure_skip_verify"}, where)
    skip = data.get("insecure_skip_verify", False)
    if not isinstance(skip, bool):
        raise ConfigError(f"{where}.insecure_skip_verify: expected true or false, got {skip!r}")
    tls = TLSConfig(
        ca_file=_optional_str(data, "ca_file", where, "a path"),
        cert_file=_optional_str(data, "cert_file", where, "a path"),
        key_file=_optional_str(data, "key_file", where, "a path"),
        server_name=_optional_str(data, "server_name", where, "a host name"),
        insecure_skip_verify=skip,
    )
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError(f"{where}: cert_file and key_file go together")
    try:
        tls.ssl_context()
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot load: {getattr(exc, 'strerror', None) or exc}") from None
    return tls


def parse_target(data: Any, where: str, default_timeout: float, default_cost: CostModel) -> TargetConfig:
    data = _mapping(data, where)
    _check_keys(data, {"name", "url", "timeout", "labels", "method", "num_speculative_tokens", "model_name",
                       "spec_decode", "baseline", "cost_model", "bearer_token_file", "tls_config"}, where)
    spec_decode = data.get("spec_decode", True)
    if not isinstance(spec_decode, bool):
        raise ConfigError(f"{where}.spec_decode: expected true or false, got {spec_decode!r}")
    if "url" not in data:
        raise ConfigError(f"{where}.url: required")
    name = data.get("name", "vllm")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name: expected a non-empty string, got {name!r}")
    method = data.get("method")
    if method is not None and not isinstance(method, str):
        raise ConfigError(f"{where}.method: expected a string like eagle3 or ngram, got {method!r}")
    k = data.get("num_speculative_tokens")
    token_file = data.get("bearer_token_file")
    if token_file is not None and not isinstance(token_file, str):
        raise ConfigError(f"{where}.bearer_token_file: expected a path, got {token_file!r}")
    return TargetConfig(
        name=name,
        url=validate_url(data["url"], f"{where}.url"),
        timeout=parse_duration(data["timeout"], f"{where}.timeout") if "timeout" in data else default_timeout,
        labels=parse_labels(data.get("labels"), f"{where}.labels"),
        method=method,
        num_speculative_tokens=None if k is None else _int(k, f"{where}.num_speculative_tokens", 1),
        model_name=_optional_str(data, "model_name", where, "the served model's name"),
        spec_decode=spec_decode,
        baseline=parse_baseline(data.get("baseline"), f"{where}.baseline"),
        cost=parse_cost_model(data.get("cost_model"), f"{where}.cost_model", default_cost),
        bearer_token_file=token_file,
        tls=parse_tls_config(data.get("tls_config"), f"{where}.tls_config"),
    )


TOP_LEVEL_KEYS = {"web", "collect", "windows", "targets", "cost_model", "page_threshold", "log", "monitoring",
                  "proxy"}
PROXY_KEYS = {"listen_address", "upstream", "target", "workload_header", "max_workloads", "temperature_bands",
              "connect_timeout", "drain_timeout"}


def api_base(url: str) -> str:
    """The scheme, host and port of a metrics URL: where the same server's OpenAI API is."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def parse_proxy(data: Any, targets: tuple[TargetConfig, ...], flags: Mapping[str, str | None]) -> ProxyConfig | None:
    """The proxy section, with --proxy.* flags winning; None when no listen address is set."""
    section = dict(_mapping(data, "proxy"))
    _check_keys(section, PROXY_KEYS, "proxy")
    section.update({k: v for k, v in flags.items() if v is not None})
    if section.get("listen_address") is None:
        return None
    listen = validate_listen_address(str(section["listen_address"]), "proxy.listen_address")
    names = [t.name for t in targets]
    target = section.get("target", names[0] if names else None)
    if target not in names:
        raise ConfigError(f"proxy.target: {target!r} is not one of the targets ({', '.join(names)})")
    upstream = section.get("upstream") or api_base(next(t.url for t in targets if t.name == target))
    if not isinstance(upstream, str) or not re.fullmatch(r"http://[^/@\s]+/?", upstream):
        raise ConfigError(f"proxy.upstream: expected http://host:port (the tap relays plain HTTP), got {upstream!r}")
    # Absent keys keep ProxyConfig's defaults (one copy of them).
    options: dict[str, Any] = {}
    if "temperature_bands" in section:
        options["temperature_bands"] = _temperature_bands(section["temperature_bands"])
    if "workload_header" in section:
        options["workload_header"] = _header_name(section["workload_header"])
    if "max_workloads" in section:
        options["max_workloads"] = _int(section["max_workloads"], "proxy.max_workloads", 1)
    for key, allow_zero in (("connect_timeout", False), ("drain_timeout", True)):
        if key in section:
            options[key] = parse_duration(section[key], f"proxy.{key}", allow_zero=allow_zero)
    return ProxyConfig(listen, upstream.rstrip("/"), str(target), **options)


def _temperature_bands(edges: Any) -> tuple[float, ...]:
    if not isinstance(edges, list) or not edges:
        raise ConfigError(f"proxy.temperature_bands: expected a list of increasing temperatures, got {edges!r}")
    bands = tuple(_number(e, f"proxy.temperature_bands[{i}]", 0, 10) for i, e in enumerate(edges))
    if list(bands) != sorted(set(bands)):
        raise ConfigError(f"proxy.temperature_bands: must increase, got {edges!r}")
    return bands


def _header_name(header: Any) -> str:
    if not isinstance(header, str) or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", header):
        raise ConfigError(f"proxy.workload_header: expected an HTTP header name, got {header!r}")
    return header


def load_monitoring(data: Mapping[str, Any], monitoring_file: str | None) -> tuple[str | None,
                                                                                   monitoring_config.MonitoringConfig]:
    """The monitoring config the verdict reads: ``monitoring_file`` (a flag) wins over monitoring.config_file."""
    section = _mapping(data.get("monitoring"), "monitoring")
    _check_keys(section, {"config_file"}, "monitoring")
    path = monitoring_file or _optional_str(section, "config_file", "monitoring", "a path")
    try:
        return path, monitoring_config.load(path) if path else monitoring_config.shipped()
    except ConfigError as exc:
        raise ConfigError(f"monitoring.config_file: {exc}") from None


def verdict_bands(data: Mapping[str, Any], monitoring: monitoring_config.MonitoringConfig) -> VerdictBands:
    """The monitoring config's bands; a page_threshold in the sidecar's own config overrides its threshold (for
    this sidecar's verdict only: the alert rules keep the monitoring config's)."""
    if "page_threshold" not in data:
        return monitoring.verdict
    threshold = _number(data["page_threshold"], "page_threshold", 0, 1)
    return replace(monitoring.verdict, page_acceptance_ratio=threshold)


def config_from_mapping(data: Any, source: str, monitoring_file: str | None = None,
                        targets_override: tuple[TargetConfig, ...] | None = None,
                        proxy_flags: Mapping[str, str | None] | None = None) -> Config:
    """The config from a YAML mapping; --target and --proxy.* flags, given here, take part in validation."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    _check_keys(data, TOP_LEVEL_KEYS, "")
    web = _mapping(data.get("web"), "web")
    _check_keys(web, {"listen_address", "telemetry_path", "config_file"}, "web")
    collect = _mapping(data.get("collect"), "collect")
    _check_keys(collect, {"interval", "timeout", "max_body_size", "stale_after", "concurrency",
                          "max_series_per_target"}, "collect")
    log = _mapping(data.get("log"), "log")
    _check_keys(log, {"level", "format"}, "log")
    default_cost = parse_cost_model(data.get("cost_model"), "cost_model", CostModel())
    default_timeout = parse_duration(collect.get("timeout", "3s"), "collect.timeout")
    targets_data = data.get("targets", [])
    if not isinstance(targets_data, list):
        raise ConfigError(f"targets: expected a list of targets, got {type(targets_data).__name__}")
    targets = tuple(
        parse_target(t, f"targets[{i}]", default_timeout, default_cost) for i, t in enumerate(targets_data)
    )
    if targets_override is not None:
        targets = targets_override
    if not targets:  # the vLLM beside the sidecar
        targets = (TargetConfig(name="vllm", url=DEFAULT_TARGET_URL, timeout=default_timeout),)
    monitoring_path, monitoring = load_monitoring(data, monitoring_file)
    config = Config(
        targets=targets,
        windows=parse_windows(data.get("windows", ",".join(monitoring.sidecar_windows)), "windows"),
        collect_interval=parse_duration(collect.get("interval", "5s"), "collect.interval"),
        max_body_bytes=parse_size(collect.get("max_body_size", "16MiB"), "collect.max_body_size"),
        stale_after=parse_duration(collect.get("stale_after", "10m"), "collect.stale_after"),
        concurrency=_int(collect.get("concurrency", 16), "collect.concurrency", 1),
        max_series_per_target=_int(collect.get("max_series_per_target", 1000), "collect.max_series_per_target", 1),
        verdict=verdict_bands(data, monitoring),
        verdict_window=monitoring.verdict_window,
        monitoring_config_file=monitoring_path,
        proxy=parse_proxy(data.get("proxy"), targets, proxy_flags or {}),
        listen_address=validate_listen_address(str(web.get("listen_address", ":9877")), "web.listen_address"),
        telemetry_path=_path(web.get("telemetry_path", "/metrics"), "web.telemetry_path"),
        web_config_file=web.get("config_file"),
        log_level=_choice(log.get("level", "info"), LOG_LEVELS, "log.level"),
        log_format=_choice(log.get("format", "logfmt"), LOG_FORMATS, "log.format"),
        source=source,
    )
    return validate(config)


LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("logfmt", "json")


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigError(f"{where}: expected a path starting with /, got {value!r}")
    return value


def validate(config: Config) -> Config:
    names = [t.name for t in config.targets]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"targets: duplicate target name {duplicates[0]!r}; every target needs its own name")
    if config.telemetry_path in RESERVED_PATHS:
        raise ConfigError(f"web.telemetry_path: {config.telemetry_path} is used by the exporter itself")
    controls = {t.name for t in config.targets if not t.spec_decode}
    for i, target in enumerate(config.targets):
        wanted = target.baseline.target if target.baseline else None
        if wanted is not None and wanted not in controls:
            raise ConfigError(f"targets[{i}].baseline.target: {wanted!r} is not a target with spec_decode: false")
        if not target.spec_decode and target.baseline is not None:
            raise ConfigError(f"targets[{i}].baseline: a control target (spec_decode: false) has no baseline")
    return config


RESERVED_PATHS = frozenset({"/", "/healthz", "/readyz", "/api/v1/status", "/-/reload"})


def load_config_file(path: str, monitoring_file: str | None = None,
                     targets_override: tuple[TargetConfig, ...] | None = None,
                     proxy_flags: Mapping[str, str | None] | None = None) -> Config:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{at}: {problem}") from None
    try:
        return config_from_mapping(data, path, monitoring_file, targets_override, proxy_flags)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def targets_from_flags(urls: list[str], timeout: float) -> tuple[TargetConfig, ...]:
    """``--target URL`` or ``--target name=URL``; the first unnamed target is called vllm."""
    targets: list[TargetConfig] = []
    for i, spec in enumerate(urls):
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = ("vllm" if i == 0 else f"vllm-{i + 1}"), spec
        targets.append(TargetConfig(name=name, url=validate_url(url, "--target"), timeout=timeout))
    return tuple(targets)
