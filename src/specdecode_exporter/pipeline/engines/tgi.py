"""Hugging Face TGI (text-generation-inference v3.3.7: router/src/server.rs, backends/v3/src/backend.rs): recognised
only to say why it cannot be monitored. Its one speculative family, ``tgi_request_skipped_tokens`` (a summary: per
forward pass of a request, the tokens it produced beyond the first, i.e. accepted speculated tokens), has no drafted
count beside it, so α cannot be computed; estimating it would need k from config and the assumption that every
decode step drafted k tokens. It is not an Engine: a TGI exposition is a collection failure with this reason."""

from __future__ import annotations

from collections.abc import Sequence

from specdecode_exporter.pipeline.parse import Sample

SKIPPED_TOKENS = "tgi_request_skipped_tokens"
PREFIXES: tuple[str, ...] = (SKIPPED_TOKENS,)
WHY_NOT = "TGI exports no drafted-token count: α cannot be computed"


def why_not(samples: Sequence[Sample]) -> str | None:
    """The reason this exposition has no usable spec-decode metrics, when it is TGI's."""
    return WHY_NOT if any(s.name.startswith(SKIPPED_TOKENS) for s in samples) else None
