"""Why a target that declares adaptive verification has its drafted counts withheld, in one sentence: said of the
sidecar's own counters (pipeline/engines/vllm_v1.py ADAPTIVE_VERIFICATION_WHY) and of the request tap's per-request
counts (tap/request_stats.py ADAPTIVE_VERIFICATION_WITHHELD), which may not import each other.

vLLM's adaptive verification trims drafts on the device after the scheduler counted them: its drafted-token count
is the proposed tokens (the trimmed ones surface as rejections) unless a build counts verified ones, so accepted over
it is at most α. Where vLLM also exports the verified tokens (vllm:spec_decode_num_verified_draft_tokens, proposed in
vllm#58340) nothing is withheld: α is accepted over verified tokens.
"""

from __future__ import annotations

VERIFIED_COUNTER = "vllm:spec_decode_num_verified_draft_tokens"


def withheld_why(count: str, withheld: str, lower_bound: str | None = None,
                 verified: str = f"{VERIFIED_COUNTER} counter") -> str:
    """``count``: the drafted-token count that may be the proposed tokens; ``withheld``: what is therefore not
    given; ``lower_bound``: where accepted over that count is given instead, as what it is; ``verified``: the
    verified-token count whose absence leaves it unsettled."""
    instead = f"; accepted per proposed token, a lower bound of α, is {lower_bound} instead" if lower_bound else ""
    return (f"adaptive verification: {count} counts the proposed draft tokens (trimmed ones surface as rejections) "
            f"unless this vLLM counts verified ones, and no {verified} tells them apart, so {withheld} are "
            f"withheld, not guessed{instead}")
