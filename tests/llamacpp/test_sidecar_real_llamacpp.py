"""The sidecar (`specdecode-exporter run`) against a real llama-server with a draft model: the engine is detected
with no config, the model name comes from /v1/models, and the sidecar's counters, α, mean acceptance length and
per-position ratios equal what llama-server's own raw counters give by hand over the same interval.

Needs scripts/setup-llama-cpp.sh --models (see conftest.py) and the exporter's CLI in the project venv.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.procs import Process, exporter_command, start_process, tail
from specdecode_exporter.simulator import ModelSpec, Scenario, Simulator
from specdecode_exporter.simulator.exposition import render
from tests.helpers import Exposition

from .conftest import DRAFT_MAX

COLLECT_INTERVAL = 1.0
TARGET = "vllm"  # the name the CLI gives the first unnamed --target
PREFIX = "llamacpp:spec_decode_num_"
PROMPTS = [
    "kalo miren tosa veldor . kalo miren tosa veldor . kalo miren tosa veldor . kalo miren",
    "pinu gater shimo . balin zendi arul . pinu gater shimo . balin zendi",
    "1 ) veldor tosa ; 2 ) veldor tosa ; 3 ) veldor",
    "feroqua ox mire . kalo kalo mire . feroqua ox",
]


@dataclass(frozen=True)
class Counts:
    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: tuple[float, ...]

    def __sub__(self, other: Counts) -> Counts:
        before = other.per_pos or (0.0,) * len(self.per_pos)
        return Counts(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                      self.accepted - other.accepted, tuple(a - b for a, b in zip(self.per_pos, before, strict=True)))


def raw_counts(base_url: str) -> Counts:
    """llama-server's own counters, read with prometheus_client's parser (not the sidecar's)."""
    values: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    text = httpx.get(base_url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == PREFIX + "accepted_tokens_per_pos_total":
                per_pos[int(s.labels["position"])] = s.value
            elif s.name.startswith(PREFIX):
                values[s.name[len(PREFIX):]] = s.value
    return Counts(values["drafts_total"], values["draft_tokens_total"], values["accepted_tokens_total"],
                  tuple(per_pos[i] for i in sorted(per_pos)))


def settled_counts(base_url: str) -> Counts:
    """The counters once two reads agree (llama-server adds a request's counts when its slot is reset)."""
    last = raw_counts(base_url)
    for _ in range(50):
        time.sleep(0.1)
        now = raw_counts(base_url)
        if now == last:
            return now
        last = now
    return last


def complete(base_url: str, prompt: str, temperature: float, seed: int) -> None:
    response = httpx.post(base_url + "/v1/completions", timeout=60, json={
        "prompt": prompt, "max_tokens": 48, "temperature": temperature, "seed": seed})
    response.raise_for_status()


def served_model(base_url: str) -> str:
    model: str = httpx.get(base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    return model


@pytest.fixture
def start_sidecar(llama_server: Process, tmp_path: Path) -> Iterator[Callable[[], Process]]:
    started: list[Process] = []

    def start() -> Process:
        process = start_process("sidecar", lambda port: [
            *exporter_command(), "run", "--target", f"{llama_server.url}/metrics",
            "--web.listen-address", f"127.0.0.1:{port}", "--collect.interval", f"{COLLECT_INTERVAL:g}s",
        ], tmp_path, "/readyz", timeout=30)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.stop()
            print(f"\nsidecar log tail ({process.log}):\n{tail(process.log, 10)}")


@dataclass(frozen=True)
class SidecarView:
    counts: Counts | None
    exposition: Exposition
    labels: dict[str, str]

    def window(self, name: str, **labels: str) -> float | None:
        return self.exposition.get(name, **self.labels, window="1m", **labels)


def read_sidecar(url: str, model: str) -> SidecarView:
    exposition = Exposition.parse(httpx.get(url + "/metrics", timeout=5).text)
    labels = {"target": TARGET, "model_name": model}
    drafts = exposition.get("specdecode_drafts_total", **labels)
    if drafts is None:
        return SidecarView(None, exposition, labels)
    found = exposition.all("specdecode_accepted_tokens_by_position_total", **labels)
    per_pos = {int(dict(key)["position"]): value for key, value in found.items()}
    counts = Counts(drafts, exposition.get("specdecode_draft_tokens_total", **labels) or 0.0,
                    exposition.get("specdecode_accepted_tokens_total", **labels) or 0.0,
                    tuple(per_pos[i] for i in sorted(per_pos)))
    return SidecarView(counts, exposition, labels)


def wait_for(url: str, model: str, want: Counts, timeout: float = 15.0) -> SidecarView:
    """Poll until the sidecar's counters equal ``want`` (or the timeout), then one more collection for the windows."""
    deadline = time.monotonic() + timeout
    view = read_sidecar(url, model)
    while view.counts != want and time.monotonic() < deadline:
        time.sleep(COLLECT_INTERVAL / 4)
        view = read_sidecar(url, model)
    assert view.counts == want, (view.counts, want)
    time.sleep(1.5 * COLLECT_INTERVAL)
    return read_sidecar(url, model)


def test_before_the_first_draft_alpha_works_and_positions_are_absent(
        llama_server: Process, start_sidecar: Callable[[], Process]) -> None:
    model = served_model(llama_server.url)
    assert raw_counts(llama_server.url) == Counts(0, 0, 0, ())  # the per-position family is not printed yet
    sidecar = start_sidecar()
    quiet = wait_for(sidecar.url, model, Counts(0, 0, 0, ()))
    assert quiet.exposition.get("specdecode_info", **quiet.labels, api="llamacpp", num_speculative_tokens="unknown")
    assert quiet.window("specdecode_acceptance_ratio") is None  # no drafts yet: absent, not 0

    complete(llama_server.url, PROMPTS[0], 0.0, seed=1)
    raw = settled_counts(llama_server.url)
    assert raw.drafts > 0 and len(raw.per_pos) == DRAFT_MAX, raw
    view = wait_for(sidecar.url, model, raw)  # the model name came from /v1/models (llama.cpp has no label)
    assert view.exposition.get("specdecode_info", **view.labels, api="llamacpp", num_speculative_tokens=str(DRAFT_MAX))
    assert view.window("specdecode_acceptance_ratio") == pytest.approx(raw.accepted / raw.draft_tokens, rel=1e-9)
    assert view.window("specdecode_mean_acceptance_length") == pytest.approx(1 + raw.accepted / raw.drafts, rel=1e-9)
    # The per-position family appeared inside this window: no curve for it rather than one against a guessed start.
    assert view.exposition.all("specdecode_position_acceptance_ratio", **view.labels) == {}
    print(f"\nfirst request: drafts={raw.drafts:g} drafted={raw.draft_tokens:g} accepted={raw.accepted:g} "
          f"per position={raw.per_pos}")


def test_sidecar_equals_llama_server_counters_over_the_same_interval(
        llama_server: Process, start_sidecar: Callable[[], Process]) -> None:
    url, model = llama_server.url, served_model(llama_server.url)
    complete(url, PROMPTS[0], 0.0, seed=1)  # the per-position family exists from here on
    raw0 = settled_counts(url)
    sidecar = start_sidecar()
    side0 = wait_for(sidecar.url, model, raw0)  # totals start at the source's own counts
    started = time.monotonic()

    for temperature in (0.0, 1.0):
        for seed, prompt in enumerate(PROMPTS):
            complete(url, prompt, temperature, seed)
    raw1 = settled_counts(url)
    want = raw1 - raw0
    assert want.drafts > 0 and want.accepted > 0, want
    side1 = wait_for(sidecar.url, model, raw1)
    elapsed = time.monotonic() - started
    assert elapsed < 55, f"traffic and collection took {elapsed:.0f} s: the 1m window no longer spans it"

    alpha = side1.window("specdecode_acceptance_ratio")
    length = side1.window("specdecode_mean_acceptance_length")
    positions = [side1.window("specdecode_position_acceptance_ratio", position=str(i)) for i in range(DRAFT_MAX)]
    assert alpha == pytest.approx(want.accepted / want.draft_tokens, rel=1e-9)
    assert length == pytest.approx(1 + want.accepted / want.drafts, rel=1e-9)
    assert side1.window("specdecode_mean_draft_length") == pytest.approx(want.draft_tokens / want.drafts, rel=1e-9)
    if want.draft_tokens == DRAFT_MAX * want.drafts:  # every draft full length: the curve over all drafts holds
        assert positions == pytest.approx([n / want.drafts for n in want.per_pos], rel=1e-9)
    else:  # a draft cut short (the draft model's p-min): llama.cpp counts no drafted tokens per position
        assert positions == [None] * DRAFT_MAX
    assert side1.exposition.get("specdecode_source_restarts_total", **side1.labels) == 0
    assert side0.counts == raw0
    print(f"\nllama-server Δ over the interval: drafts={want.drafts:g} drafted={want.draft_tokens:g} "
          f"accepted={want.accepted:g} per position={want.per_pos}\n"
          f"by hand: α={want.accepted / want.draft_tokens:.6f} mean length={1 + want.accepted / want.drafts:.6f} "
          f"positions={[round(n / want.drafts, 6) for n in want.per_pos]}\n"
          f"sidecar 1m: α={alpha:.6f} mean length={length:.6f} positions={[round(p or 0, 6) for p in positions]}")


def test_simulator_lays_out_families_as_this_llama_server(llama_server: Process) -> None:
    complete(llama_server.url, PROMPTS[0], 0.0, seed=1)
    settled_counts(llama_server.url)
    live = httpx.get(llama_server.url + "/metrics", timeout=10).text
    sim = Simulator(Scenario(models=(ModelSpec(num_speculative_tokens=DRAFT_MAX),), format="llamacpp"),
                    clock=lambda: 0.0)
    sim.advance(10)
    simulated = render("llamacpp", sim.snapshot()).decode()

    def shapes(text: str) -> list[tuple[str, str]]:
        return re.findall(r"^# (?:HELP|TYPE) (\S+) (.*)$", text, flags=re.MULTILINE)

    assert shapes(simulated) == shapes(live)
