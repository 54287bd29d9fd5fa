"""The sidecar (`specdecode-exporter run`) against a real vLLM 0.32.0 (CPU build): its counters move
exactly as vLLM's raw counters do, and its 1-minute α is Δaccepted/Δdraft_tokens computed by hand from
vLLM's own exposition over the same interval.

Needs the exporter's CLI in the project venv (.venv/bin/specdecode-exporter, from `pip install -e .`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.procs import Process, exporter_command, start_process, tail

from . import vllm_harness as h

pytestmark = pytest.mark.vllm

COLLECT_INTERVAL = 1.0
TARGET_NAME = "vllm"  # the name the CLI gives the first unnamed --target


@dataclass
class Sidecar:
    process: Process

    @property
    def base_url(self) -> str:
        return self.process.url


@pytest.fixture
def sidecar(vllm_ngram_url: str, tmp_path: Path) -> Iterator[Sidecar]:
    process = start_process("sidecar", lambda port: [
        *exporter_command(), "run", "--target", f"{vllm_ngram_url}/metrics",
        "--web.listen-address", f"127.0.0.1:{port}", "--collect.interval", f"{COLLECT_INTERVAL:g}s",
    ], tmp_path, "/readyz", timeout=30)
    try:
        yield Sidecar(process)
    finally:
        process.stop()
        print(f"\nsidecar log tail ({process.log}):\n{tail(process.log, 20)}")


@dataclass(frozen=True)
class SidecarView:
    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: dict[int, float]
    alpha_1m: float | None
    label_names: frozenset[str]


def read_sidecar(url: str) -> SidecarView:
    text = httpx.get(url + "/metrics", timeout=5).text
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    alpha: float | None = None
    labels: set[str] = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("target") != TARGET_NAME or s.labels.get("model_name") != h.SERVED_MODEL_NAME:
                continue
            if s.name == "specdecode_accepted_tokens_by_position_total":
                per_pos[int(s.labels["position"])] = per_pos.get(int(s.labels["position"]), 0.0) + s.value
            elif s.name in (
                "specdecode_drafts_total",
                "specdecode_draft_tokens_total",
                "specdecode_accepted_tokens_total",
            ):
                sums[s.name] = sums.get(s.name, 0.0) + s.value
                labels |= set(s.labels)
            elif s.name == "specdecode_acceptance_ratio" and s.labels.get("window") == "1m":
                alpha = s.value
    return SidecarView(
        sums.get("specdecode_drafts_total", float("nan")),
        sums.get("specdecode_draft_tokens_total", float("nan")),
        sums.get("specdecode_accepted_tokens_total", float("nan")),
        dict(sorted(per_pos.items())),
        alpha,
        frozenset(labels),
    )


def wait_for_sidecar(url: str, want: h.SpecCounters, base: SidecarView, timeout: float = 15.0) -> SidecarView:
    """Poll until the sidecar's counters moved by exactly vLLM's deltas (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        view = read_sidecar(url)
        got = (view.drafts - base.drafts, view.draft_tokens - base.draft_tokens, view.accepted - base.accepted)
        if got == (want.drafts, want.draft_tokens, want.accepted) or time.monotonic() > deadline:
            return view
        time.sleep(COLLECT_INTERVAL / 2)


def test_sidecar_counters_track_real_vllm(vllm_ngram_url: str, sidecar: Sidecar) -> None:
    vurl = vllm_ngram_url
    # Quiet period: vLLM is idle, so after two collections the sidecar holds the state raw0 describes.
    raw0 = h.spec_counters(h.scrape(vurl))
    time.sleep(3 * COLLECT_INTERVAL)
    side0 = read_sidecar(sidecar.base_url)
    assert h.spec_counters(h.scrape(vurl)) == raw0, "vLLM counters moved without traffic"
    assert {"target", "model_name", "engine"} <= side0.label_names, side0.label_names

    traffic_start = time.monotonic()
    res = h.send_completions(vurl, h.make_prompts(8, seed=7), [0.0, 1.0], max_tokens=32, concurrency=4)
    # Traffic has stopped; vLLM records a request's last step a moment after its response: the settled counters.
    raw1 = h.wait_until_stable(lambda: h.spec_counters(h.scrape(vurl)))
    want = raw1 - raw0
    assert want.drafts > 0 and want.accepted > 0, want

    side1 = wait_for_sidecar(sidecar.base_url, want, side0)
    time.sleep(2 * COLLECT_INTERVAL)  # one more collection after the last change, for the window
    side1 = read_sidecar(sidecar.base_url)
    elapsed = time.monotonic() - traffic_start

    assert side1.drafts - side0.drafts == want.drafts
    assert side1.draft_tokens - side0.draft_tokens == want.draft_tokens
    assert side1.accepted - side0.accepted == want.accepted
    assert sorted(side1.per_pos) == sorted(want.per_pos)
    for pos, n in want.per_pos.items():
        assert side1.per_pos[pos] - side0.per_pos.get(pos, 0.0) == n, (pos, side0, side1, want)

    # α over the last minute, by hand from vLLM's raw counters: only valid while the whole traffic
    # interval (and a quiet sample before it) lies inside the 1m window.
    assert elapsed < 55, f"traffic + collection took {elapsed:.0f} s; the 1m window no longer covers it"
    by_hand = want.accepted / want.draft_tokens
    assert side1.alpha_1m is not None, "specdecode_acceptance_ratio{window='1m'} absent after traffic"
    assert side1.alpha_1m == pytest.approx(by_hand, abs=1e-3), (side1.alpha_1m, by_hand, want)
    print(
        f"\nsidecar vs vLLM: Δ={want} α by hand={by_hand:.4f} sidecar 1m α={side1.alpha_1m:.4f} "
        f"({res.requests} requests, {res.tokens_per_second:.0f} tok/s)"
    )
