"""Bench 5: memory over time. Many collections on a fake clock with label churn (a redeploy renames the
model every ``churn_every`` collections), real collection code; RSS and live series at checkpoints."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

from bench.collect import INTERVAL, new_collector, scrape_once
from bench.common import FakeClock, proc_rss_mb

ENGINES = 4
K = 4


def body(gen: int, i: int) -> bytes:
    """A V1 exposition (with _created) for model m-<gen>: counters grow with i."""
    lines = []
    model = f"org/model-{gen}"
    for e in range(ENGINES):
        labels = f'engine="{e}",model_name="{model}"'
        drafts = 100 * i + e
        values = {"drafts": drafts, "draft_tokens": K * drafts, "accepted_tokens": 3 * drafts}
        for name, value in values.items():
            lines.append(f"vllm:spec_decode_num_{name}_total{{{labels}}} {float(value)}")
            lines.append(f"vllm:spec_decode_num_{name}_created{{{labels}}} 1.7e9")
        for p in range(K):
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} '
                         f"{float(drafts * (K - p) // K)}")
    lines.append("# filler: other families the sidecar skips")
    lines.extend(f'vllm:other_metric{{i="{j}"}} {j}' for j in range(200))
    return ("\n".join(lines) + "\n").encode()


@dataclass
class SoakPoint:
    collections: int
    simulated_hours: float
    rss_mb: float
    live_series: int
    ring_snapshots: int  # total snapshots held over all series


@dataclass
class SoakResult:
    points: list[SoakPoint]
    churn_every: int

    @property
    def rss_growth_mb(self) -> float:
        """RSS at the end minus RSS at the first checkpoint after warm-up (steady state)."""
        return self.points[-1].rss_mb - self.points[1].rss_mb

    @property
    def max_series(self) -> int:
        return max(p.live_series for p in self.points)


def run_soak(collections: int, checkpoints: int = 6, churn_every: int = 60) -> SoakResult:
    clock = FakeClock()
    collector = new_collector(clock)
    pid = os.getpid()
    points: list[SoakPoint] = []
    step = max(1, collections // checkpoints)
    for i in range(1, collections + 1):
        scrape_once(collector, clock, body(i // churn_every, i))
        if i % step == 0:
            gc.collect()
            series = collector.store.series
            points.append(SoakPoint(i, i * INTERVAL / 3600, proc_rss_mb(pid), len(series),
                                    sum(len(s.times) for s in series.values())))
    return SoakResult(points, churn_every)
