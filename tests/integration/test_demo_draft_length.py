"""What docs/demo.md says `make demo` shows in its busy phase, with the demo as installed (`specdecode-exporter demo`
over real HTTP on a free port): vLLM's dynamic speculative decoding drafts 2 tokens instead of 3 while more than 16
requests run, so specdecode_mean_draft_length falls from 3 to 2 and climbs back after the phase; α stays over the
tokens that were verified (accepted / drafted as the engine counts them, never over k assumed tokens per draft);
the per-position curve and the k advice are absent, with their reason on the status page.

The packaged demo scenario with its model and its busy phase as shipped, only shorter healthy and recovered
phases around it (and busy itself long enough for a 1m window to lie inside it), so the test takes 2½ minutes."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.procs import child_env, exporter_command, free_port
from tests.helpers import Exposition

pytestmark = pytest.mark.timeout(240)

# Recovered: the 1m mean climbs from 2 by about 0.2 in its first 30 s (the busy phase drafted more per second, so
# its drafts weigh more), which the last look, up to a collection late, may just miss; 45 s leaves room.
HEALTHY_S, BUSY_S, RECOVERED_S = 25, 80, 45
K = 3  # the demo model's num_speculative_tokens
# A 1m window lies inside the busy phase from 60 s into it, plus a collection interval (2 s) and slack.
INSIDE_BUSY_S = 66


def demo_scenario(tmp_path: Path) -> Path:
    import yaml

    packaged = resources.files("specdecode_exporter.simulator") / "scenarios" / "demo.yaml"
    scenario = yaml.safe_load(packaged.read_text(encoding="utf-8"))
    phases = {p["name"]: p for p in scenario["phases"]}
    scenario["phases"] = [{**phases["healthy"], "duration": f"{HEALTHY_S}s"},
                          {**phases["busy"], "duration": f"{BUSY_S}s"},
                          {**phases["recovered"], "duration": f"{RECOVERED_S}s"}]
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Sample:
    phase: str
    elapsed: float  # seconds into the phase (the simulator's clock)
    window: dict[str, Any]  # the sidecar's 1m window of the spec-decode series


def printed_urls(log: Path, proc_alive: Any) -> dict[str, str]:
    """The URLs `specdecode-exporter demo` prints once everything listens: {'status page': ..., ...}."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc_alive(), log.read_text()
        urls = {m[1].strip(): m[2] for m in re.finditer(r"^  (\S[\w ()]*?)\s{2,}(http://\S+)", log.read_text(), re.M)}
        if "request tap" in urls:
            return urls
        time.sleep(0.2)
    raise AssertionError(log.read_text())


def raw_counters(simulator: str) -> tuple[float, float, float]:
    """The simulated vLLM's own (drafts, drafted tokens, accepted tokens)."""
    served = Exposition.parse(httpx.get(simulator, timeout=5).text)
    return tuple(served.get(f"vllm:spec_decode_num_{name}_total") or 0.0  # type: ignore[return-value]
                 for name in ("drafts", "draft_tokens", "accepted_tokens"))


def sample(samples: list[Sample], seen: dict[str, Any], base: str, simulator: str) -> bool:
    """One look at the demo: the simulator's phase and the sidecar's 1m window, plus, once each, the sidecar's
    /metrics in healthy, the simulator's raw counters early and late in busy, and the sidecar's /metrics and page
    late in busy. False once the scenario looped (back to healthy after recovered)."""
    state = httpx.get(simulator.removesuffix("/metrics") + "/-/state", timeout=5).json()
    phase, elapsed = state["phase"]["name"], state["phase"]["elapsed_seconds"]
    if phase == "healthy" and samples and samples[-1].phase == "recovered":
        return False
    status = httpx.get(f"{base}/api/v1/status", timeout=5).json()
    spec = next(t for t in status["targets"] if t["name"] == "simulated-vllm")
    samples.append(Sample(phase, elapsed, spec["series"][0]["windows"].get("1m", {}) if spec["series"] else {}))
    if phase == "healthy" and elapsed > 15 and "healthy metrics" not in seen:
        seen["healthy metrics"] = httpx.get(f"{base}/metrics", timeout=5).text
    if phase == "busy" and elapsed > 12 and "raw start" not in seen:
        seen["raw start"] = raw_counters(simulator)
    if phase == "busy" and elapsed > BUSY_S - 8 and "raw end" not in seen:
        seen["raw end"] = raw_counters(simulator)
        seen["busy page"] = httpx.get(f"{base}/", timeout=5).text
        seen["busy metrics"] = httpx.get(f"{base}/metrics", timeout=5).text
    return True


def test_the_demo_shows_the_draft_length_move_and_alpha_stay_over_verified_tokens(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*exporter_command(), "demo", "--web.listen-address", f"127.0.0.1:{port}", "--scenario",
             str(demo_scenario(tmp_path)), "--duration", "4m"], stdout=out, stderr=out, text=True, env=child_env())
    samples: list[Sample] = []
    seen: dict[str, Any] = {}
    try:
        simulator = printed_urls(log, lambda: proc.poll() is None)["simulated vLLM"]
        while True:
            assert proc.poll() is None, log.read_text()
            time.sleep(1)
            with contextlib.suppress(httpx.TimeoutException):  # a loaded machine: the next second samples again
                if not sample(samples, seen, base, simulator):
                    break
    finally:
        proc.terminate()
        proc.wait(timeout=20)

    assert proc.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text()

    # Healthy: every draft 3 tokens long, exactly; the per-position curve is there.
    healthy = [s.window for s in samples if s.phase == "healthy" and s.elapsed > 10 and "mean_draft_length" in s.window]
    assert healthy, samples
    for w in healthy:
        assert w["mean_draft_length"] == K and len(w["position_acceptance_ratios"]) == K, w
        assert w["position_acceptance_unproven"] is None, w

    # Busy: the schedule drafts 2 (24 running > 16); the 1m window inside the phase reads exactly 2.
    busy = [s.window for s in samples if s.phase == "busy"]
    inside = [s.window for s in samples if s.phase == "busy" and s.elapsed >= INSIDE_BUSY_S]
    assert inside, samples
    lengths = [w["mean_draft_length"] for w in busy]
    assert lengths == sorted(lengths, reverse=True), "it falls through the phase, monotonically"
    for w in inside:
        assert w["mean_draft_length"] == 2.0, w
        # α over the tokens drafted as the engine counts them, the window's own rates: not over k per draft
        assert w["acceptance_ratio"] == pytest.approx(w["accepted_tokens_per_second"] / w["draft_tokens_per_second"],
                                                      abs=2e-4), w
        assert w["position_acceptance_ratios"] == [] and w["recommended_num_speculative_tokens"] is None, w
        assert w["position_acceptance_unproven"].startswith(
            f"the draft length varies (drafts averaged 2.00 of k = {K} tokens)"), w
        assert w["expected_speedup"] is not None, "the cost model takes the measured length, it does not give up"

    # The engine's own counters over the same phase: it verified 2 tokens per draft (vLLM counts verified tokens),
    # and the sidecar's α is theirs, accepted / verified; accepted / (drafts × k) would be a third lower.
    (d0, t0, a0), (d1, t1, a1) = seen["raw start"], seen["raw end"]
    assert (t1 - t0) == 2 * (d1 - d0) > 0
    verified_alpha, per_k_alpha = (a1 - a0) / (t1 - t0), (a1 - a0) / (K * (d1 - d0))
    alpha = inside[-1]["acceptance_ratio"]
    assert alpha == pytest.approx(verified_alpha, abs=0.02)
    assert abs(alpha - per_k_alpha) > 0.2

    # Recovered: 3-token drafts again, and the 1m mean climbs back towards 3.
    recovered = [s.window["mean_draft_length"] for s in samples if s.phase == "recovered" and s.elapsed > 4]
    assert recovered and recovered == sorted(recovered) and 2.0 < recovered[-1] < K, recovered
    assert recovered[-1] > recovered[0] + 0.2, recovered

    # What docs/demo.md tells the user to look at: the gauge on /metrics, the reason on the status page.
    gauge = tuple(Exposition.parse(text).get("specdecode_mean_draft_length", target="simulated-vllm", window="1m")
                  for text in (seen["healthy metrics"], seen["busy metrics"]))
    assert gauge == (K, 2.0), gauge
    assert "Per position:" in seen["busy page"] and "the draft length varies" in seen["busy page"]
