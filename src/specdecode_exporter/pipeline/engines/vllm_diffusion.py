"""vLLM V1 serving a diffusion LLM (vllm#45163; vllm/v1/spec_decode/metrics.py, ``SpecDecodingProm`` with
``is_diffusion``): the spec-decode data path is reused with other meanings, and its three counters are exported under
diffusion names, with no per-position family and no ``vllm:spec_decode_*`` family:

* ``vllm:diffusion_num_denoising_steps_total`` (in the place of drafts),
* ``vllm:diffusion_num_canvas_positions_total`` (of drafted tokens),
* ``vllm:diffusion_num_committed_tokens_total`` (of accepted tokens).

A denoising step re-evaluates a canvas and commits some of its positions; nothing is drafted by one model and
verified by another, so α, acceptance length, break-even and k advice do not apply. The target is recognised, so the
collection succeeds (up = 1, ``specdecode_info{api="vllm-diffusion"}``, no ``no_spec_metrics`` error and so no
SpecDecodeMetricsMissing), and each (model_name, engine) series is kept with no counts: no α, no verdict but
"no traffic". The status page, /api/v1/status and ``check`` say why (NOT_APPLICABLE).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdecode_exporter.pipeline.engines.base import (
    DecodeResult,
    DecoderOptions,
    FetchTiming,
    SeriesGrouper,
    SeriesReading,
)
from specdecode_exporter.pipeline.parse import Sample, Selection

DENOISING_STEPS = "vllm:diffusion_num_denoising_steps_total"
CANVAS_POSITIONS = "vllm:diffusion_num_canvas_positions_total"
COMMITTED_TOKENS = "vllm:diffusion_num_committed_tokens_total"
FAMILIES = (DENOISING_STEPS, CANVAS_POSITIONS, COMMITTED_TOKENS)
API = "vllm-diffusion"
NOT_APPLICABLE = "diffusion model: speculative decoding metrics do not apply"


class DiffusionDecoder:
    """One empty reading per (model_name, engine) series that exports a diffusion counter."""

    def __init__(self) -> None:
        self._grouper = SeriesGrouper(("model_name", "engine"))

    def decode_known(self, selection: Selection, timing: FetchTiming) -> DecodeResult | None:
        return None

    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult:
        samples = [s for s in selection.samples() if s.name in FAMILIES]
        result = DecodeResult()
        for (model_name, engine), _ in self._grouper.group(samples).items():
            result.series.append(SeriesReading(model_name=model_name, engine=engine, draft_tokens=None,
                                               accepted_tokens=None))
        return result


@dataclass(frozen=True)
class VllmDiffusion:
    api: str = API
    prefixes: tuple[str, ...] = ("vllm:diffusion_",)
    max_collect_interval: float | None = None
    labels_model: bool = True

    def detect(self, samples: Sequence[Sample]) -> bool:
        return any(s.name in FAMILIES for s in samples)

    def new_decoder(self, options: DecoderOptions) -> DiffusionDecoder:
        return DiffusionDecoder()


ENGINE = VllmDiffusion()
