"""Bench 1: collect+derive per scrape (bytes → samples → engine → decode → store → TargetView).

Baseline: prometheus_client's own parser on the same text. Floor: a line scan that only finds the lines the
sidecar needs from vLLM V1 — the spec-decode counters and the latency families (str.find in C, a slice per line),
the least a Python parser can do.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from bench.common import FakeClock, interleaved, time_call
from bench.corpus import Corpus, simulator_series
from specdecode_exporter.pipeline.engines import ALL_PREFIXES, DecodeResult, FetchTiming
from specdecode_exporter.pipeline.engines.vllm_v1 import ENGINE as V1
from specdecode_exporter.pipeline.parse import Selection, select
from specdecode_exporter.pipeline.scrape import FetchResult
from specdecode_exporter.pipeline.store import Store
from specdecode_exporter.sidecar.collection import TargetCollector
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.simulator.exposition import render

INTERVAL = 5.0
WANTED = V1.prefixes  # every line the sidecar reads from a vLLM V1 exposition


def baseline_parse(body: bytes) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(body.decode("utf-8")))


def line_scan(body: bytes) -> int:
    """The issue's floor: a plain scan of the lines that keeps the wanted ones; no parsing at all."""
    text = body.decode("utf-8")
    return len([line for line in text.split("\n") if line.startswith(WANTED)])


def jump_scan(body: bytes) -> int:
    """A stricter floor: str.find from one wanted line to the next, slicing each out; no parsing."""
    text = body.decode("utf-8")
    lines = []
    for prefix in WANTED:
        needle = "\n" + prefix
        pos = text.find(needle)
        while pos != -1:
            end = text.find("\n", pos + 1)
            lines.append(text[pos + 1:end])
            pos = text.find(needle, end)
    return len(lines)


def new_collector(clock: FakeClock, windows: str = "1m,5m,15m,1h") -> TargetCollector:
    target = TargetConfig(name="vllm", url="http://127.0.0.1:1/metrics")
    config = Config(targets=(target,), windows=parse_windows(windows, "windows"),
                    collect=CollectSection(interval=INTERVAL))
    store = Store(keep_seconds=config.longest_window + 2 * INTERVAL, stale_after=config.collect.stale_after,
                  max_series_per_target=config.collect.max_series_per_target)
    return TargetCollector(target, config, store, clock)


def scrape_once(collector: TargetCollector, clock: FakeClock, body: bytes) -> int:
    """What TargetCollector.collect does after the fetch: ingest then publish (the real code)."""
    clock.advance(INTERVAL)
    timing = FetchTiming(clock.now - 0.01, clock.now)
    collector.ingest(FetchResult(timing=timing, body=body, content_type="text/plain; version=0.0.4"))
    view = collector.publish(up=True, duration=0.0)
    return len(view.series)


def body_sequence(models: int, engines: int, k: int, count: int, fmt: str = "v1") -> list[bytes]:
    """Successive renders of one simulator, INTERVAL apart, so counters move and windows carry drafts."""
    sim = simulator_series(models, engines, k, fmt)
    sim.advance(60.0)
    out = []
    for _ in range(count):
        sim.advance(INTERVAL)
        out.append(render(fmt, sim.snapshot()))
    return out


_COUNTER_VALUE = re.compile(rb"^(vllm:spec_decode_[a-z_]*_total(?:\{[^\n]*\})? )([0-9.e+]+)$", re.MULTILINE)


def scaled_body(body: bytes, factor: float) -> bytes:
    """The exposition with its spec-decode counters scaled by ``factor`` (α and k unchanged, _created untouched)."""
    return _COUNTER_VALUE.sub(lambda m: m.group(1) + repr(float(m.group(2)) * factor).encode(), body)


def moving_bodies(body: bytes, count: int) -> list[bytes]:
    """A static exposition made to move: its spec-decode counters scaled by 1.1, 1.2, …, so successive scrapes
    carry drafts like a live server's."""
    return [scaled_body(body, 1.0 + 0.1 * i) for i in range(1, count + 1)]


class Pipeline:
    """A warmed collector fed a cycle of bodies; each call is one scrape's collect+derive."""

    def __init__(self, bodies: list[bytes], warm: int = 3) -> None:
        self.bodies = bodies
        self.clock = FakeClock()
        self.collector = new_collector(self.clock)
        self.i = 0
        for _ in range(warm):
            self()

    def __call__(self) -> int:
        body = self.bodies[self.i % len(self.bodies)]
        self.i += 1  # wrapping around looks like a vLLM restart to the collector: a legitimate scrape too
        return scrape_once(self.collector, self.clock, body)


def stage_breakdown(bodies: list[bytes], rounds: int) -> dict[str, float]:
    """Median seconds of each stage, replicating TargetCollector.ingest/publish piece by piece (after the first
    body, the decoder knows the layout and takes its fast path, as in the sidecar)."""
    clock = FakeClock()
    collector = new_collector(clock)
    stages: dict[str, list[float]] = {k: [] for k in ("text", "select", "decode", "store", "view")}
    for body in bodies[: max(rounds, 2)]:
        clock.advance(INTERVAL)
        timing = FetchTiming(clock.now - 0.01, clock.now)
        text = ""
        selection: Selection | None = None
        decoded: DecodeResult | None = None

        def s_text() -> None:
            nonlocal text
            text = body.decode("utf-8")  # noqa: B023 (called within this iteration)

        def s_select() -> None:
            nonlocal selection
            # As TargetCollector.ingest: only the known engine's lines once it knows the engine.
            prefixes = collector.engine.prefixes if collector.engine else ALL_PREFIXES
            selection = select(text, prefixes)  # noqa: B023 (called within this iteration)

        def s_decode() -> None:
            nonlocal decoded
            assert selection is not None  # noqa: B023 (called within this iteration)
            known = collector.decoder.decode_known(selection, timing) if collector.decoder else None  # noqa: B023
            decoded = known or collector.decode(selection, timing)  # noqa: B023

        for name, fn in (("text", s_text), ("select", s_select), ("decode", s_decode)):
            stages[name].extend(time_call(fn, repeat=1))
        assert decoded is not None
        stages["store"].extend(time_call(
            lambda: collector.store.update("vllm", decoded.series, decoded.pending, clock.now), repeat=1))  # noqa: B023
        stages["view"].extend(time_call(lambda: collector.publish(up=True, duration=0.0), repeat=1))
    return {k: statistics.median(v[1:] if len(v) > 2 else v) for k, v in stages.items()}


@dataclass
class CollectResult:
    corpus: str
    kib: float
    lines: int
    baseline: float
    line_scan: float
    jump_scan: float
    select: float
    pipeline: float

    @property
    def speedup_vs_baseline(self) -> float:
        return self.baseline / self.pipeline


def bench_corpus(corpus: Corpus, bodies: list[bytes] | None, rounds: int) -> CollectResult:
    """bodies: a moving sequence for the stateful pipeline (None: the corpus body, made to move). Every
    function runs several times in a row per round (the first call of a round is cold, the others warm),
    round-robin, so the ratios compare like with like."""
    body = corpus.body
    seq = bodies or moving_bodies(body, 12)
    pipeline = Pipeline(seq)
    baseline_n = 1 if len(body) > 200_000 else 5
    scale = max(1, int(200_000 / max(len(body), 1)))
    medians = interleaved(
        {
            "baseline": lambda: baseline_parse(body),
            "line_scan": lambda: line_scan(body),
            "jump_scan": lambda: jump_scan(body),
            "select": lambda: select(body.decode("utf-8"), ALL_PREFIXES),
            "pipeline": pipeline,
        },
        rounds=rounds,
        number={"baseline": baseline_n, "line_scan": 5 * scale, "jump_scan": 5 * scale, "select": 5 * scale,
                "pipeline": 5 * scale},
    )
    return CollectResult(corpus.name, corpus.kib, jump_scan(body), medians["baseline"], medians["line_scan"],
                         medians["jump_scan"], medians["select"], medians["pipeline"])
