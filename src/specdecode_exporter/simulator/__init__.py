"""A fake vLLM: serves /metrics in vLLM's formats from a time-based traffic model and scenarios."""

from specdecode_exporter.simulator.app import build_app
from specdecode_exporter.simulator.model import ModelSpec
from specdecode_exporter.simulator.scenario import (
    FAULTS,
    FORMATS,
    Phase,
    Scenario,
    default_scenario,
    load_scenario,
    scenario_from_dict,
    steady_scenario,
)
from specdecode_exporter.simulator.simulator import Simulator

__all__ = [
    "FAULTS",
    "FORMATS",
    "ModelSpec",
    "Phase",
    "Scenario",
    "Simulator",
    "build_app",
    "default_scenario",
    "load_scenario",
    "scenario_from_dict",
    "steady_scenario",
]
