"""Scenarios: models plus phases over time, loaded from YAML and validated key by key (core.config.validation).

Every validation failure raises ConfigError with one line: ``<source>: <key path>: <problem>``. The keys of a
scenario file are the fields of Scenario, Phase, ModelSpec and Workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field

from specdecode_exporter.core.config.validation import (
    Bool,
    Choice,
    ConfigError,
    Context,
    Duration,
    Int,
    Number,
    Range,
    Section,
    Text,
    fail,
    load_yaml,
    read_yaml,
    show,
    validate,
)
from specdecode_exporter.simulator.model import ModelSpec, Probabilities, Ratio, curve_problem

# Written by engine_formats.py.
ENGINE_FORMATS: tuple[str, ...] = ("llamacpp", "sglang", "trtllm", "tgi", "vllm-diffusion")
FORMATS: tuple[str, ...] = ("v1", "v1-multiproc", "v1-openmetrics", "v0", *ENGINE_FORMATS)
# Formats whose exposition has no engine (data-parallel rank) label, and those that name no model at all.
SINGLE_ENGINE_FORMATS: tuple[str, ...] = ("v0", "llamacpp", "trtllm", "tgi")
SINGLE_MODEL_FORMATS: tuple[str, ...] = ("llamacpp", "tgi")
FAULTS: tuple[str, ...] = ("none", "http_500", "garbage", "hang", "drop_spec", "slow")


@dataclass(frozen=True)
class Phase(Section):
    name: Text
    duration: Duration  # simulated seconds
    acceptance_rate: Ratio | None = None
    drafts_per_second: Annotated[Number, Range(0, 1e7)] | None = None
    position_acceptance: Probabilities | None = None
    restart: Bool = False
    fault: Annotated[str, Choice(*FAULTS)] | None = None
    model: Text | None = None  # None: applies to every model


def _named_phases(value: object) -> object:
    """A scenario's phases; a phase without a name is called by its place, phases[<index>]."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise fail(f"expected a list of phases, got {show(value)}")
    return [{"name": f"phases[{i}]", **p} if isinstance(p, Mapping) else p for i, p in enumerate(value)]


@dataclass(frozen=True)
class Scenario(Section):
    models: Annotated[tuple[ModelSpec, ...], Field(min_length=1)] = field(default_factory=lambda: (ModelSpec(),))
    phases: Annotated[tuple[Phase, ...], BeforeValidator(_named_phases)] = ()
    format: Annotated[str, Choice(*FORMATS)] = "v1"
    loop: Bool = False
    seed: Annotated[Int, Range(0, 2**63 - 1)] = 0
    name: Text = "custom"

    def cross_check(self, context: Context) -> Scenario:
        seen: set[str] = set()
        for i, m in enumerate(self.models):
            if m.name in seen:
                raise fail(f"duplicate model name {m.name!r}", "models", i, "name")
            seen.add(m.name)
            if self.format in SINGLE_ENGINE_FORMATS and m.engines != 1:
                raise fail(f"format {self.format} has no engine label; expected 1", "models", i, "engines")
        if self.format in SINGLE_MODEL_FORMATS and len(self.models) != 1:
            raise fail(f"format {self.format} names no model; expected one model", "models")
        for i, phase in enumerate(self.phases):
            _check_phase(phase, self.models, i)
        return self


def _check_phase(phase: Phase, models: tuple[ModelSpec, ...], i: int) -> None:
    names = tuple(m.name for m in models)
    if phase.model is not None and phase.model not in names:
        raise fail(f"expected one of {', '.join(names)}, got {show(phase.model)}", "phases", i, "model")
    for spec in models:
        problem = curve_problem(phase.position_acceptance, spec) if phase.model in (None, spec.name) else None
        if problem:
            raise fail(problem, "phases", i, "position_acceptance")


def scenario_from_dict(data: object, source: str = "scenario") -> Scenario:
    if isinstance(data, Mapping):
        if "models" not in data:
            raise ConfigError(f"{source}: models: required (a non-empty list of models)")
        data = {"name": Path(source).stem, **data}
    scenario: Scenario = validate(Scenario, data, source)
    return scenario


def parse_scenario_text(text: str, source: str) -> Scenario:
    return scenario_from_dict(load_yaml(text, source), source)


def load_scenario(path: str | Path) -> Scenario:
    return scenario_from_dict(read_yaml(path, "scenario"), str(path))


def packaged_scenarios() -> tuple[str, ...]:
    root = resources.files("specdecode_exporter.simulator") / "scenarios"
    return tuple(sorted(e.name[:-5] for e in root.iterdir() if e.name.endswith(".yaml")))


def default_scenario(name: str = "demo") -> Scenario:
    """A scenario shipped with the package (src/specdecode_exporter/simulator/scenarios/<name>.yaml)."""
    entry = resources.files("specdecode_exporter.simulator") / "scenarios" / f"{name}.yaml"
    if not entry.is_file():
        raise ConfigError(f"scenario {name!r}: not packaged (available: {', '.join(packaged_scenarios())})")
    return parse_scenario_text(entry.read_text(encoding="utf-8"), f"{name}.yaml")


def steady_scenario(spec: ModelSpec, fmt: str = "v1", seed: int = 0) -> Scenario:
    return Scenario(models=(spec,), phases=(), format=fmt, loop=False, seed=seed, name="steady")
