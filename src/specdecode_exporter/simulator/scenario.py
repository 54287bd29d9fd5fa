"""Scenarios: models plus phases over time, loaded from YAML and validated key by key.

Every validation failure raises ScenarioError with one line: ``<source>: <key path>: <problem>``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from specdecode_exporter.simulator.model import ModelSpec, Workload, cumulative_fractions

ENGINE_FORMATS: tuple[str, ...] = ("llamacpp", "sglang", "trtllm", "tgi")  # written by engine_formats.py
FORMATS: tuple[str, ...] = ("v1", "v1-multiproc", "v1-openmetrics", "v0", *ENGINE_FORMATS)
# Formats whose exposition has no engine (data-parallel rank) label, and those that name no model at all.
SINGLE_ENGINE_FORMATS: tuple[str, ...] = ("v0", "llamacpp", "trtllm", "tgi")
SINGLE_MODEL_FORMATS: tuple[str, ...] = ("llamacpp", "tgi")
FAULTS: tuple[str, ...] = ("none", "http_500", "garbage", "hang", "drop_spec", "slow")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ScenarioError(ValueError):
    """A scenario (file, dict or flags) is invalid. str() is one line naming the key."""


@dataclass(frozen=True)
class Phase:
    name: str
    duration: float  # simulated seconds
    acceptance_rate: float | None = None
    drafts_per_second: float | None = None
    position_acceptance: tuple[float, ...] | None = None
    restart: bool = False
    fault: str | None = None
    model: str | None = None  # None: applies to every model


@dataclass(frozen=True)
class Scenario:
    models: tuple[ModelSpec, ...] = field(default_factory=lambda: (ModelSpec(),))
    phases: tuple[Phase, ...] = ()
    format: str = "v1"
    loop: bool = False
    seed: int = 0
    name: str = "custom"


def parse_duration(value: object) -> float | None:
    """'90s', '5m', '1h30m', '250ms' or a plain number of seconds; None when it is not a duration."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value > 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0 or total <= 0:
        return None
    return total


class _Checker:
    """Small typed accessors that turn a bad value into a one-line ScenarioError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {path}: {message}")

    def mapping(self, value: object, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path or "(top level)", f"expected a mapping, got {_show(value)}")
        for key in value:
            if key not in allowed:
                raise self.fail(f"{path}.{key}" if path else str(key),
                                f"unknown key (expected one of: {', '.join(allowed)})")
        return value

    def number(self, value: object, path: str, lo: float, hi: float = math.inf) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(path, f"expected a number, got {_show(value)}")
        if not lo <= value <= hi:
            bounds = f"between {lo:g} and {hi:g}" if hi != math.inf else f">= {lo:g}"
            raise self.fail(path, f"expected a number {bounds}, got {value!r}")
        return float(value)

    def integer(self, value: object, path: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, got {_show(value)}")
        if not lo <= value <= hi:
            raise self.fail(path, f"expected an integer between {lo} and {hi}, got {value}")
        return value

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"expected a non-empty string, got {_show(value)}")
        return value

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"expected true or false, got {_show(value)}")
        return value

    def choice(self, value: object, path: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(path, f"expected one of {', '.join(choices)}, got {_show(value)}")
        return str(value)

    def duration(self, value: object, path: str) -> float:
        seconds = parse_duration(value)
        if seconds is None:
            raise self.fail(path, f"expected a duration like 30s, got {_show(value)}")
        return seconds

    def probabilities(self, value: object, path: str, k: int | None) -> tuple[float, ...]:
        if not isinstance(value, list) or not value:
            raise self.fail(path, f"expected a list of numbers between 0 and 1, got {_show(value)}")
        if k is not None and len(value) != k:
            raise self.fail(path, f"expected {k} values (one per position, num_speculative_tokens), "
                                  f"got {len(value)}")
        return tuple(self.number(v, f"{path}[{i}]", 0.0, 1.0) for i, v in enumerate(value))


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_MODEL_KEYS = tuple(f.name for f in fields(ModelSpec))
_PHASE_KEYS = ("name", "duration", "acceptance_rate", "drafts_per_second", "position_acceptance",
               "restart", "fault", "model")
_SCENARIO_KEYS = ("name", "format", "models", "phases", "loop", "seed")


def _model_from_dict(c: _Checker, raw: object, path: str) -> ModelSpec:
    d = c.mapping(raw, path, _MODEL_KEYS)
    base = ModelSpec()
    k = c.integer(d.get("num_speculative_tokens", base.num_speculative_tokens),
                  f"{path}.num_speculative_tokens", 1, 64)
    fill = c.number(d.get("draft_fill", base.draft_fill), f"{path}.draft_fill", 0.0, 1.0)
    if fill <= 0:
        raise c.fail(f"{path}.draft_fill", "expected a number above 0 and at most 1, got 0")
    spec = ModelSpec(
        name=c.string(d.get("name", base.name), f"{path}.name"),
        engines=c.integer(d.get("engines", base.engines), f"{path}.engines", 1, 1024),
        num_speculative_tokens=k,
        method=c.string(d.get("method", base.method), f"{path}.method"),
        drafts_per_second=c.number(d.get("drafts_per_second", base.drafts_per_second),
                                   f"{path}.drafts_per_second", 0.0, 1e7),
        acceptance_rate=c.number(d.get("acceptance_rate", base.acceptance_rate),
                                 f"{path}.acceptance_rate", 0.0, 1.0),
        position_acceptance=(c.probabilities(d["position_acceptance"], f"{path}.position_acceptance", k)
                             if d.get("position_acceptance") is not None else None),
        draft_fill=fill,
        noise=c.number(d.get("noise", base.noise), f"{path}.noise", 0.0, 1.0),
        target_step_seconds=c.number(d.get("target_step_seconds", base.target_step_seconds),
                                     f"{path}.target_step_seconds", 1e-6, 60.0),
        cost_per_draft_token=c.number(d.get("cost_per_draft_token", base.cost_per_draft_token),
                                      f"{path}.cost_per_draft_token", 0.0, 10.0),
        prompt_tokens=c.integer(d.get("prompt_tokens", base.prompt_tokens),
                                f"{path}.prompt_tokens", 1, 10**7),
        output_tokens=c.integer(d.get("output_tokens", base.output_tokens),
                                f"{path}.output_tokens", 1, 10**7),
        max_num_seqs=c.integer(d.get("max_num_seqs", base.max_num_seqs),
                               f"{path}.max_num_seqs", 1, 10**6),
        spec_decode=c.boolean(d.get("spec_decode", base.spec_decode), f"{path}.spec_decode"),
        request_acceptance_histogram=c.boolean(d.get("request_acceptance_histogram",
                                                     base.request_acceptance_histogram),
                                               f"{path}.request_acceptance_histogram"),
        workloads=_workloads(c, d.get("workloads"), f"{path}.workloads"),
        temperature_sensitivity=c.number(d.get("temperature_sensitivity", base.temperature_sensitivity),
                                         f"{path}.temperature_sensitivity", 0.0, 1.0),
        per_request_spread=c.number(d.get("per_request_spread", base.per_request_spread),
                                    f"{path}.per_request_spread", 0.0, 1.0),
        batch_slowdown=c.number(d.get("batch_slowdown", base.batch_slowdown), f"{path}.batch_slowdown", 0.0, 10.0),
        saturating_batch=c.number(d.get("saturating_batch", base.saturating_batch),
                                  f"{path}.saturating_batch", 0.0, 1e6),
    )
    check_position_curve(c, spec.position_acceptance, spec, f"{path}.position_acceptance")
    return spec


_WORKLOAD_KEYS = ("name", "share", "acceptance_rate", "temperature")


def _workloads(c: _Checker, raw: object, path: str) -> tuple[Workload, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise c.fail(path, f"expected a non-empty list of workloads, got {_show(raw)}")
    out = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        d = c.mapping(item, where, _WORKLOAD_KEYS)
        alpha = d.get("acceptance_rate")
        out.append(Workload(name=c.string(d.get("name", f"w{i}"), f"{where}.name"),
                            share=c.number(d.get("share", 1.0), f"{where}.share", 0.0, 1e6),
                            acceptance_rate=None if alpha is None else c.number(alpha, f"{where}.acceptance_rate",
                                                                                0.0, 1.0),
                            temperature=c.number(d.get("temperature", 0.0), f"{where}.temperature", 0.0, 2.0)))
    if len({w.name for w in out}) != len(out):
        raise c.fail(path, "workload names must be distinct")
    return tuple(out)


def check_position_curve(c: _Checker, curve: tuple[float, ...] | None, spec: ModelSpec, path: str) -> None:
    if curve is None:
        return
    if len(curve) != spec.num_speculative_tokens:
        raise c.fail(path, f"expected {spec.num_speculative_tokens} values for model {spec.name!r}, "
                           f"got {len(curve)}")
    if sum(cumulative_fractions(curve)) > spec.num_speculative_tokens * spec.draft_fill + 1e-9:
        raise c.fail(path, f"implies more accepted than drafted tokens with draft_fill {spec.draft_fill:g}")


def _phase_from_dict(c: _Checker, raw: object, path: str, models: tuple[ModelSpec, ...]) -> Phase:
    d = c.mapping(raw, path, _PHASE_KEYS)
    if "duration" not in d:
        raise c.fail(f"{path}.duration", "missing (expected a duration like 30s)")
    names = tuple(m.name for m in models)
    model = c.choice(d["model"], f"{path}.model", names) if d.get("model") is not None else None
    targets = [m for m in models if model is None or m.name == model]
    curve = None
    if d.get("position_acceptance") is not None:
        curve = c.probabilities(d["position_acceptance"], f"{path}.position_acceptance", None)
        for spec in targets:
            check_position_curve(c, curve, spec, f"{path}.position_acceptance")
    fault = c.choice(d["fault"], f"{path}.fault", FAULTS) if d.get("fault") is not None else None
    return Phase(
        name=c.string(d.get("name", path), f"{path}.name"),
        duration=c.duration(d["duration"], f"{path}.duration"),
        acceptance_rate=(c.number(d["acceptance_rate"], f"{path}.acceptance_rate", 0.0, 1.0)
                         if d.get("acceptance_rate") is not None else None),
        drafts_per_second=(c.number(d["drafts_per_second"], f"{path}.drafts_per_second", 0.0, 1e7)
                           if d.get("drafts_per_second") is not None else None),
        position_acceptance=curve,
        restart=c.boolean(d.get("restart", False), f"{path}.restart"),
        fault=fault,
        model=model,
    )


def scenario_from_dict(data: object, source: str = "scenario") -> Scenario:
    c = _Checker(source)
    d = c.mapping(data, "", _SCENARIO_KEYS)
    fmt = c.choice(d.get("format", "v1"), "format", FORMATS)
    raw_models = d.get("models")
    if not isinstance(raw_models, list) or not raw_models:
        raise c.fail("models", f"expected a non-empty list of models, got {_show(raw_models)}")
    models = tuple(_model_from_dict(c, m, f"models[{i}]") for i, m in enumerate(raw_models))
    seen: set[str] = set()
    for i, m in enumerate(models):
        if m.name in seen:
            raise c.fail(f"models[{i}].name", f"duplicate model name {m.name!r}")
        seen.add(m.name)
        if fmt in SINGLE_ENGINE_FORMATS and m.engines != 1:
            raise c.fail(f"models[{i}].engines", f"format {fmt} has no engine label; expected 1")
    if fmt in SINGLE_MODEL_FORMATS and len(models) != 1:
        raise c.fail("models", f"format {fmt} names no model; expected one model")
    raw_phases = d.get("phases", [])
    if raw_phases is None:
        raw_phases = []
    if not isinstance(raw_phases, list):
        raise c.fail("phases", f"expected a list of phases, got {_show(raw_phases)}")
    phases = tuple(_phase_from_dict(c, p, f"phases[{i}]", models) for i, p in enumerate(raw_phases))
    seed = d.get("seed", 0)
    return Scenario(
        models=models,
        phases=phases,
        format=fmt,
        loop=c.boolean(d.get("loop", False), "loop"),
        seed=c.integer(seed, "seed", 0, 2**63 - 1),
        name=c.string(d.get("name", Path(source).stem), "name"),
    )


def parse_scenario_text(text: str, source: str) -> Scenario:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ScenarioError(f"{source}: {where}: invalid YAML ({problem})") from None
    return scenario_from_dict(data, source)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read scenario ({exc.strerror or exc})") from None
    return parse_scenario_text(text, str(p))


def packaged_scenarios() -> tuple[str, ...]:
    root = resources.files("specdecode_exporter.simulator") / "scenarios"
    return tuple(sorted(e.name[:-5] for e in root.iterdir() if e.name.endswith(".yaml")))


def default_scenario(name: str = "demo") -> Scenario:
    """A scenario shipped with the package (src/specdecode_exporter/simulator/scenarios/<name>.yaml)."""
    entry = resources.files("specdecode_exporter.simulator") / "scenarios" / f"{name}.yaml"
    if not entry.is_file():
        raise ScenarioError(f"scenario {name!r}: not packaged (available: {', '.join(packaged_scenarios())})")
    return parse_scenario_text(entry.read_text(encoding="utf-8"), f"{name}.yaml")


def steady_scenario(spec: ModelSpec, fmt: str = "v1", seed: int = 0) -> Scenario:
    return Scenario(models=(spec,), phases=(), format=fmt, loop=False, seed=seed, name="steady")
