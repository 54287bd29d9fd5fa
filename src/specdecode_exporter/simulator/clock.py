"""A clock advanced by hand: drives the simulator and the sidecar in lockstep in tests and benchmarks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ManualClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
