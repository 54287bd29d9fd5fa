"""Why a target that declares adaptive verification has its drafted counts withheld, in one sentence: said of the
sidecar's own counters (pipeline/engines/vllm_v1.py ADAPTIVE_VERIFICATION_WHY) and of the request tap's per-request
counts (tap/request_stats.py ADAPTIVE_VERIFICATION_WITHHELD), which may not import each other."""

from __future__ import annotations


def withheld_why(count: str, withheld: str) -> str:
    """``count``: the drafted-token count whose meaning is unsettled; ``withheld``: what is therefore not given."""
    return (f"adaptive verification: whether {count} counts the proposed or the verified draft tokens is not settled "
            f"by vLLM's source, so {withheld} are withheld, not guessed")
