"""Source dialects. A new engine is one module with an ``ENGINE`` object plus one line in ENGINES."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specdecode_exporter.pipeline.engines import (
    llamacpp,
    sglang,
    tgi,
    trtllm,
    vllm_diffusion,
    vllm_plain,
    vllm_v0,
    vllm_v1,
)
from specdecode_exporter.pipeline.engines.base import (
    Decoder,
    DecodeResult,
    DecoderOptions,
    Engine,
    FetchTiming,
    SeriesReading,
)
from specdecode_exporter.pipeline.parse import Sample

# Order matters: the first engine whose detect() accepts the samples wins. Each one detects by names only its
# own dialect has, so the order only decides an exposition that mixes dialects.
ENGINES: tuple[Engine, ...] = (vllm_v1.ENGINE, vllm_v0.ENGINE, llamacpp.ENGINE, sglang.ENGINE, trtllm.ENGINE,
                              vllm_diffusion.ENGINE)

# Dialects recognised and collected whose models do not speculate: why speculative-decoding figures do not apply
# (shown by the status page, /api/v1/status and `check`), by api.
NOT_APPLICABLE: dict[str, str] = {vllm_diffusion.API: vllm_diffusion.NOT_APPLICABLE}

# Dialects recognised only to say why they cannot be monitored: (prefixes, why_not(samples) -> reason or None).
UNSUPPORTED: tuple[tuple[tuple[str, ...], Callable[[Sequence[Sample]], str | None]], ...] = (
    (tgi.PREFIXES, tgi.why_not),
    ((), vllm_plain.why_not),  # its families are among vLLM V1's
)
NO_SPEC_METRICS = "no speculative-decoding metrics in the exposition"

ALL_PREFIXES: tuple[str, ...] = tuple(dict.fromkeys(
    [p for e in ENGINES for p in e.prefixes] + [p for prefixes, _ in UNSUPPORTED for p in prefixes]))


def detect_engine(samples: Sequence[Sample]) -> Engine | None:
    for engine in ENGINES:
        if engine.detect(samples):
            return engine
    return None


def no_engine_detail(samples: Sequence[Sample]) -> str:
    """Why no engine took the exposition, for the no_spec_metrics failure."""
    return next((reason for _, why_not in UNSUPPORTED if (reason := why_not(samples))), NO_SPEC_METRICS)


__all__ = [
    "ALL_PREFIXES",
    "ENGINES",
    "NOT_APPLICABLE",
    "NO_SPEC_METRICS",
    "DecodeResult",
    "Decoder",
    "DecoderOptions",
    "Engine",
    "FetchTiming",
    "SeriesReading",
    "detect_engine",
    "no_engine_detail",
]
