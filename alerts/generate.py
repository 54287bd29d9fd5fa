#!/usr/bin/env python3
"""Generate the specdecode recording and alerting rules from alerts/config.yaml.

    python alerts/generate.py                          # writes alerts/specdecode.rules.yaml
    python alerts/generate.py --profile e2e --out F    # short windows and `for:` for end-to-end tests
    python alerts/generate.py --check                  # exit 1 if the committed file is out of date

The output is a plain Prometheus rules file (`groups:`); the deploy helper wraps the same content in a
PrometheusRule. Edit config.yaml, not the output.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "config.yaml"
DEFAULT_OUT = HERE / "specdecode.rules.yaml"

SEVERITIES = ("critical", "warning", "info")
DURATION_RE = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
ALERT_NAMES = (
    "SpecDecodeAcceptanceRateLow",
    "SpecDecodeBelowBreakEven",
    "SpecDecodeAcceptanceRateDrift",
    "SpecDecodeIntervalAcceptanceLow",
    "SpecDecodeTargetDown",
    "SpecDecodeMetricsMissing",
    "SpecDecodeExporterDown",
    "SpecDecodeExporterAbsent",
    "SpecDecodeRecommendedKLower",
)

Rule = dict[str, Any]


class ConfigError(ValueError):
    """A bad value in config.yaml, with the key that holds it."""


# --------------------------------------------------------------------------------------------- config


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_config(path: Path, profile: str | None = None) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    profiles = raw.pop("profiles", None) or {}
    cfg: dict[str, Any] = raw
    if profile is not None:
        if profile not in profiles:
            raise ConfigError(f"profiles: no profile {profile!r} (have: {', '.join(sorted(profiles))})")
        cfg = deep_merge(cfg, profiles[profile])
    force_for = cfg.pop("force_for", None)
    if force_for is not None:
        for alert in cfg.get("alerts", {}).values():
            alert["for"] = force_for
    validate(cfg)
    return cfg


def _duration(value: Any, key: str) -> str:
    if not isinstance(value, str) or not DURATION_RE.match(value):
        raise ConfigError(f"{key}: {value!r} is not a Prometheus duration (e.g. 30s, 5m, 1h, 1d)")
    return value


def _ratio(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"{key}: {value!r} must be a number between 0 and 1")
    return float(value)


def _labels(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: expected a non-empty list of label names")
    for name in value:
        if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", name):
            raise ConfigError(f"{key}: {name!r} is not a label name")
    return value


def validate(cfg: dict[str, Any]) -> None:
    for key in ("runbook_base_url", "exporter_job_selector"):
        if not isinstance(cfg.get(key), str) or not cfg[key]:
            raise ConfigError(f"{key}: required string")
    if not isinstance(cfg.get("metric_selector", ""), str):
        raise ConfigError("metric_selector: must be a string of label matchers")
    _labels(cfg.get("target_labels"), "target_labels")
    levels = cfg.get("levels")
    if not isinstance(levels, dict) or not levels:
        raise ConfigError("levels: expected a mapping of level name to label list")
    for name, labels in levels.items():
        if not re.match(r"^[a-z_][a-z0-9_]*$", str(name)):
            raise ConfigError(f"levels: {name!r} is not a valid level name")
        _labels(labels, f"levels.{name}")
    if cfg.get("alert_level") not in levels:
        raise ConfigError(f"alert_level: {cfg.get('alert_level')!r} is not one of levels ({', '.join(levels)})")
    windows = cfg.get("windows")
    if not isinstance(windows, dict) or set(windows) != {"short", "long"}:
        raise ConfigError("windows: expected exactly the keys short and long")
    for key, value in windows.items():
        _duration(value, f"windows.{key}")
    quantiles = cfg.get("quantiles")
    if not isinstance(quantiles, list) or not quantiles:
        raise ConfigError("quantiles: expected a non-empty list")
    for q in quantiles:
        _ratio(q, "quantiles")
    _duration(cfg.get("baseline", {}).get("range"), "baseline.range")
    _duration(cfg.get("baseline", {}).get("offset"), "baseline.offset")
    if not isinstance(cfg.get("sidecar_window"), str) or not cfg["sidecar_window"]:
        raise ConfigError("sidecar_window: required (one of the sidecar's window labels, e.g. 1h)")
    mdt = cfg.get("min_draft_tokens_per_second")
    if isinstance(mdt, bool) or not isinstance(mdt, int | float) or mdt < 0:
        raise ConfigError("min_draft_tokens_per_second: must be a number >= 0")
    if not isinstance(cfg.get("extra_alert_labels", {}), dict):
        raise ConfigError("extra_alert_labels: expected a mapping")
    alerts = cfg.get("alerts")
    if not isinstance(alerts, dict):
        raise ConfigError("alerts: expected a mapping")
    unknown = set(alerts) - set(ALERT_NAMES)
    if unknown:
        raise ConfigError(f"alerts: unknown alert(s) {', '.join(sorted(unknown))}")
    for name in ALERT_NAMES:
        a = alerts.get(name)
        if not isinstance(a, dict):
            raise ConfigError(f"alerts.{name}: missing")
        if a.get("severity") not in SEVERITIES:
            raise ConfigError(f"alerts.{name}.severity: must be one of {', '.join(SEVERITIES)}")
        _duration(a.get("for"), f"alerts.{name}.for")
        if "window" in a and a["window"] not in windows:
            raise ConfigError(f"alerts.{name}.window: must be short or long")
        for key in ("threshold", "drop", "quantile"):
            if key in a:
                _ratio(a[key], f"alerts.{name}.{key}")
    if alerts["SpecDecodeIntervalAcceptanceLow"]["quantile"] not in quantiles:
        raise ConfigError("alerts.SpecDecodeIntervalAcceptanceLow.quantile: must be one of quantiles")
    _duration(
        alerts["SpecDecodeMetricsMissing"].get("errors_window"),
        "alerts.SpecDecodeMetricsMissing.errors_window",
    )


# ------------------------------------------------------------------------------------------ PromQL bits


def sel(cfg: Mapping[str, Any], *matchers: str) -> str:
    parts = [m for m in (cfg.get("metric_selector", ""), *matchers) if m]
    return "{" + ", ".join(parts) + "}" if parts else ""


def by(labels: list[str]) -> str:
    return ", ".join(labels)


def quantile_name(q: float) -> str:
    """0.1 -> p10, 0.5 -> p50, 0.999 -> p99_9."""
    text = f"{q * 100:.6f}".rstrip("0").rstrip(".")
    return "p" + text.replace(".", "_")


def fmt_num(x: float) -> str:
    return f"{x:g}"


def rate_sum(cfg: Mapping[str, Any], metric: str, labels: list[str], window: str) -> str:
    return f"sum by ({by(labels)}) (rate({metric}{sel(cfg)}[{window}]))"


def record_name(level: str, metric: str, op: str) -> str:
    return f"{level}:{metric}:{op}"


# ------------------------------------------------------------------------------------ recording rules


def recording_groups(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    windows: list[str] = list(dict.fromkeys([cfg["windows"]["short"], cfg["windows"]["long"]]))
    long_w = cfg["windows"]["long"]
    for level, labels in cfg["levels"].items():
        rules: list[Rule] = []
        for w in windows:
            op = f"rate{w}"
            drafted = rate_sum(cfg, "specdecode_draft_tokens_total", labels, w)
            accepted = rate_sum(cfg, "specdecode_accepted_tokens_total", labels, w)
            drafts = rate_sum(cfg, "specdecode_drafts_total", labels, w)
            rules += [
                {"record": record_name(level, "specdecode_draft_tokens", op), "expr": drafted},
                {"record": record_name(level, "specdecode_accepted_tokens", op), "expr": accepted},
                {"record": record_name(level, "specdecode_drafts", op), "expr": drafts},
                {
                    "record": record_name(level, "specdecode_acceptance_ratio", op),
                    "expr": f"{accepted}\n/\n({drafted} > 0)",
                },
                {
                    "record": record_name(level, "specdecode_mean_acceptance_length", op),
                    "expr": f"1 + {accepted}\n/\n({drafts} > 0)",
                },
            ]
        buckets = (
            f"sum by ({by([*labels, 'le'])}) (rate(specdecode_interval_acceptance_ratio_bucket{sel(cfg)}[{long_w}]))"
        )
        count = rate_sum(cfg, "specdecode_interval_acceptance_ratio_count", labels, long_w)
        for q in cfg["quantiles"]:
            rules.append(
                {
                    "record": record_name(
                        level, "specdecode_interval_acceptance_ratio", f"{quantile_name(q)}_rate{long_w}"
                    ),
                    "expr": (f"histogram_quantile({fmt_num(q)}, {buckets})\nand on ({by(labels)})\n({count} > 0)"),
                }
            )
        groups.append({"name": f"specdecode.rules.{level}", "rules": rules})

    level = cfg["alert_level"]
    labels = cfg["levels"][level]
    rng, off = cfg["baseline"]["range"], cfg["baseline"]["offset"]
    acc = record_name(level, "specdecode_accepted_tokens", f"rate{long_w}")
    drf = record_name(level, "specdecode_draft_tokens", f"rate{long_w}")
    groups.append(
        {
            "name": "specdecode.rules.baseline",
            "rules": [
                {
                    "record": record_name(level, "specdecode_acceptance_ratio", f"baseline{rng}"),
                    "expr": (
                        f"sum by ({by(labels)}) (sum_over_time({acc}[{rng}] offset {off}))\n/\n"
                        f"(sum by ({by(labels)}) (sum_over_time({drf}[{rng}] offset {off})) > 0)"
                    ),
                }
            ],
        }
    )
    return groups


# ---------------------------------------------------------------------------------------------- alerts


def runbook_url(cfg: Mapping[str, Any], alert: str) -> str:
    return f"{cfg['runbook_base_url'].rstrip('/')}/alerts/runbook.md#{alert.lower()}"


WHERE = "{{ $labels.model_name }}{{ with $labels.namespace }} (namespace {{ . }}){{ end }}"
PCT = "{{ $value | humanizePercentage }}"


def alert_rule(cfg: Mapping[str, Any], name: str, expr: str, summary: str, description: str) -> Rule:
    a = cfg["alerts"][name]
    labels = {
        "severity": a["severity"],
        **{str(k): str(v) for k, v in cfg.get("extra_alert_labels", {}).items()},
    }
    return {
        "alert": name,
        "expr": expr,
        "for": a["for"],
        "labels": labels,
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": runbook_url(cfg, name),
        },
    }


def query_value(promql: str, fmt: str, *args: str, default: str = "unknown") -> str:
    """A template snippet that runs `printf promql args` and prints the first result's value through fmt."""
    arglist = " ".join(args)
    return (
        f'{{{{ with printf "{promql}" {arglist} | query }}}}'
        f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}{default}{{{{ end }}}}"
    )


def alert_rules(cfg: Mapping[str, Any]) -> list[Rule]:
    level = cfg["alert_level"]
    labels = cfg["levels"][level]
    on = f"on ({by(labels)})"
    long_w = cfg["windows"]["long"]
    alerts = cfg["alerts"]
    min_rate = fmt_num(cfg["min_draft_tokens_per_second"])
    model_match = ", ".join(f"{lbl}=%q" for lbl in labels)
    model_args = [f"$labels.{lbl}" for lbl in labels]

    def win(name: str) -> str:
        return str(cfg["windows"][alerts[name]["window"]])

    def ratio(w: str) -> str:
        return record_name(level, "specdecode_acceptance_ratio", f"rate{w}")

    def guard(w: str) -> str:
        return f"and {on}\n{record_name(level, 'specdecode_draft_tokens', f'rate{w}')} >= {min_rate}"

    rules: list[Rule] = []

    # --- the page
    name = "SpecDecodeAcceptanceRateLow"
    w, thr = win(name), alerts[name]["threshold"]
    rules.append(
        alert_rule(
            cfg,
            name,
            f"{ratio(w)} < {fmt_num(thr)}\n{guard(w)}",
            f"Speculative decoding acceptance rate for {{{{ $labels.model_name }}}} is below {thr:.0%}",
            f"Over the last {w}, {WHERE} accepted only {PCT} of its drafted tokens (page threshold "
            f"{thr:.0%}, all pods together). At this rate speculative decoding most likely makes generation "
            "slower than plain decoding.",
        )
    )

    # --- below break-even (modelled speedup < 1)
    name = "SpecDecodeBelowBreakEven"
    w = win(name)
    be = f"max by ({by(labels)}) (specdecode_break_even_acceptance_ratio{sel(cfg)})"
    be_q = f"max(specdecode_break_even_acceptance_ratio{{{model_match}}})"
    rules.append(
        alert_rule(
            cfg,
            name,
            f"{ratio(w)}\n< {on}\n{be}\n{guard(w)}",
            "Speculative decoding for {{ $labels.model_name }} is below break-even (modelled speedup < 1)",
            f"Over the last {w}, {WHERE} accepted {PCT} of its drafted tokens, below the break-even "
            f"acceptance rate of {query_value(be_q, 'humanizePercentage', *model_args)} from the sidecar's "
            "cost model: speculative decoding is modelled to cost more time than it saves.",
        )
    )

    # --- drift against the 1-day baseline
    name = "SpecDecodeAcceptanceRateDrift"
    w, drop = win(name), alerts[name]["drop"]
    rng = cfg["baseline"]["range"]
    base = record_name(level, "specdecode_acceptance_ratio", f"baseline{rng}")
    base_q = f"{base}{{{model_match}}}"
    rules.append(
        alert_rule(
            cfg,
            name,
            f"{ratio(w)}\n< {on}\n({base} - {fmt_num(drop)})\n{guard(w)}",
            f"Speculative decoding acceptance rate for {{{{ $labels.model_name }}}} dropped more than "
            f"{drop * 100:g} points below its {rng} baseline",
            f"Over the last {w}, {WHERE} accepted {PCT} of its drafted tokens; its baseline over the "
            f"previous {rng} was {query_value(base_q, 'humanizePercentage', *model_args)}. A drop like this "
            "usually means drift in the traffic, a stale draft model, or a quantization or version change.",
        )
    )

    # --- P10 of the per-interval acceptance histogram
    name = "SpecDecodeIntervalAcceptanceLow"
    q, thr = alerts[name]["quantile"], alerts[name]["threshold"]
    qname = quantile_name(q)
    rec = record_name(level, "specdecode_interval_acceptance_ratio", f"{qname}_rate{long_w}")
    rules.append(
        alert_rule(
            cfg,
            name,
            f"{rec} < {fmt_num(thr)}\n{guard(long_w)}",
            f"{qname.upper()} of per-interval acceptance rate for {{{{ $labels.model_name }}}} is below {thr:.0%}",
            f"Over the last {long_w}, {q:.0%} of the collection intervals of {WHERE} had an acceptance rate "
            f"below {PCT} (threshold {thr:.0%}): for a sizeable share of the time speculative decoding was "
            "net-negative, even if the average looks fine.",
        )
    )

    # --- the sidecar cannot collect from vLLM
    tl = by(cfg["target_labels"])
    name = "SpecDecodeTargetDown"
    errw = alerts["SpecDecodeMetricsMissing"]["errors_window"]
    nospec_sel = sel(cfg, 'reason="no_spec_metrics"')
    nospec = f"increase(specdecode_collect_errors_total{nospec_sel}[{errw}]) > 0"
    tmatch = ", ".join(f"{lbl}=%q" for lbl in cfg["target_labels"])
    targs = " ".join(f"$labels.{lbl}" for lbl in cfg["target_labels"])
    reason_q = f"topk(1, increase(specdecode_collect_errors_total{{{tmatch}}}[{errw}]) > 0)"
    reason = (
        f'{{{{ range printf "{reason_q}" {targs} | query }}}}{{{{ .Labels.reason }}}}{{{{ else }}}}unknown{{{{ end }}}}'
    )
    rules.append(
        alert_rule(
            cfg,
            name,
            f"specdecode_up{sel(cfg)} == 0\nunless on ({tl})\n{nospec}",
            "specdecode sidecar cannot collect metrics from {{ $labels.target }}",
            "The sidecar {{ $labels.instance }} (job {{ $labels.job }}) has failed to collect from target "
            f"{{{{ $labels.target }}}} for {alerts[name]['for']}; most frequent error reason: {reason}. "
            "No acceptance-rate alert can fire for this target meanwhile.",
        )
    )

    # --- vLLM answers but without spec-decode metrics
    name = "SpecDecodeMetricsMissing"
    rules.append(
        alert_rule(
            cfg,
            name,
            nospec,
            "vLLM at {{ $labels.target }} serves no speculative-decoding metrics",
            f"{{{{ $value | humanize }}}} collections by {{{{ $labels.instance }}}} in the last {errw} found "
            "target {{ $labels.target }} answering without any speculative-decoding metrics: spec decode was "
            "switched off, or a vLLM upgrade renamed the metrics.",
        )
    )

    # --- the sidecar itself
    job = cfg["exporter_job_selector"]
    name = "SpecDecodeExporterDown"
    rules.append(
        alert_rule(
            cfg,
            name,
            f"up{{{job}}} == 0",
            "Prometheus cannot scrape the specdecode sidecar {{ $labels.instance }}",
            "Prometheus has failed to scrape the specdecode sidecar {{ $labels.instance }} (job "
            f"{{{{ $labels.job }}}}) for {alerts[name]['for']}. The acceptance-rate alerts are blind for "
            "the models it watches.",
        )
    )
    name = "SpecDecodeExporterAbsent"
    job_text = job.replace('"', "'")
    rules.append(
        alert_rule(
            cfg,
            name,
            f"absent(up{{{job}}} == 1)",
            "No specdecode sidecar is up",
            f"For {alerts[name]['for']} Prometheus has had no successfully scraped target matching "
            f"up{{{job_text}}}. Every speculative-decoding alert is blind. Check that the sidecars run and "
            "that the scrape job (or ServiceMonitor/PodMonitor) still selects them.",
        )
    )

    # --- k advice
    name = "SpecDecodeRecommendedKLower"
    sw = cfg["sidecar_window"]
    wsel = sel(cfg, f'window="{sw}"')
    rec_k = f"specdecode_recommended_num_speculative_tokens{wsel}"
    info = "specdecode_info" + sel(cfg, 'num_speculative_tokens!=""')
    rate_g = f"specdecode_draft_tokens_per_second{wsel}"
    k_q = f"max by (num_speculative_tokens) (specdecode_info{{{tmatch}, model_name=%q}})"
    conf_k = (
        f'{{{{ range printf "{k_q}" {targs} $labels.model_name | query }}}}'
        "{{ .Labels.num_speculative_tokens }}"
        "{{ else }}unknown{{ end }}"
    )
    rules.append(
        alert_rule(
            cfg,
            name,
            f"{rec_k}\nunless ignoring (window, num_speculative_tokens)\n"
            f'(count_values without (window) ("num_speculative_tokens", {rec_k})\n'
            f" and ignoring (api, method) {info})\n"
            f"and ignoring (window, api, method, num_speculative_tokens) {info}\n"
            f"and {rate_g} >= {min_rate}",
            "Fewer speculative tokens would be faster for {{ $labels.model_name }} on {{ $labels.target }}",
            f"For {alerts[name]['for']} the sidecar's cost model has recommended num_speculative_tokens = "
            f"{{{{ $value }}}} for {{{{ $labels.model_name }}}} on {{{{ $labels.target }}}}, lower than the "
            f"configured {conf_k} (window {sw}): later draft positions are rarely accepted.",
        )
    )
    return rules


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    groups = recording_groups(cfg)
    groups.append({"name": "specdecode.alerts", "rules": alert_rules(cfg)})
    return {"groups": groups}


# ---------------------------------------------------------------------------------------------- output


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)


def render(cfg: Mapping[str, Any], profile: str | None) -> str:
    header = (
        "# GENERATED by alerts/generate.py from alerts/config.yaml"
        + (f" (profile {profile})" if profile else "")
        + ". Do not edit by hand:\n"
        "# change alerts/config.yaml and run `.venv/bin/python alerts/generate.py`.\n"
    )
    body = yaml.dump(build(cfg), Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
    return header + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--profile", default=None, help="apply profiles.<NAME> from the config (e.g. e2e)")
    parser.add_argument("--out", type=Path, default=None, help=f"output file (default {DEFAULT_OUT}); - for stdout")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file is out of date")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.profile)
    except (ConfigError, OSError, yaml.YAMLError) as exc:
        print(f"generate.py: {exc}", file=sys.stderr)
        return 2
    text = render(cfg, args.profile)
    out: Path = args.out or DEFAULT_OUT
    if args.check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print(f"{out} is out of date: run .venv/bin/python alerts/generate.py", file=sys.stderr)
            return 1
        return 0
    if str(out) == "-":
        sys.stdout.write(text)
    else:
        out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
