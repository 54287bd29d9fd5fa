"""Source dialects. A new engine is one module with an ``ENGINE`` object plus one line in ENGINES."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.engines import vllm_v0, vllm_v1
from exporter.engines.base import Decoder, DecodeResult, DecoderOptions, Engine, FetchTiming, SeriesReading
from exporter.parse import Sample

# Order matters: the first engine whose detect() accepts the samples wins.
ENGINES: tuple[Engine, ...] = (vllm_v1.ENGINE, vllm_v0.ENGINE)

ALL_PREFIXES: tuple[str, ...] = tuple(dict.fromkeys(p for e in ENGINES for p in e.prefixes))


def detect_engine(samples: Sequence[Sample]) -> Engine | None:
    for engine in ENGINES:
        if engine.detect(samples):
            return engine
    return None


__all__ = [
    "ALL_PREFIXES",
    "ENGINES",
    "DecodeResult",
    "Decoder",
    "DecoderOptions",
    "Engine",
    "FetchTiming",
    "SeriesReading",
    "detect_engine",
]
