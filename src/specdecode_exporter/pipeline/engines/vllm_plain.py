"""vLLM started without ``--speculative-config``: its page has the request and latency families but no
``vllm:spec_decode_*`` counter. That is what a control pod looks like, and also what a spec-decode pod looks like
after its speculative config was dropped, so the failure says which families were found and how to declare the
pod a control (collected for its latency only, never failed for the counters it cannot have)."""

from __future__ import annotations

from collections.abc import Sequence

from specdecode_exporter.pipeline.engines import vllm_v1
from specdecode_exporter.pipeline.parse import Sample

WHY_NOT = ("a vLLM page without spec-decode counters (vLLM started without --speculative-config); if this is the "
           "control pod, declare it as one: run --control-target NAME=URL, or spec_decode: false in the config file")


def why_not(samples: Sequence[Sample]) -> str | None:
    """The reason, when the exposition is vLLM's (its request-latency histogram) without the spec-decode counters."""
    return WHY_NOT if vllm_v1.ENGINE.detect_latency(samples) else None
