"""Routing end to end, as a user runs it: two simulated pools of one model (`simulate`: one with speculative
decoding, one with `--spec-decode false`), the sidecar (`run`) collecting the first and tapping its API with
tap.route, real loopback HTTP, no mocks.

* The class that speculative decoding slows down (workload "summarise", per-request α ≈ 0.15 against the configured
  break-even 0.5) is routed after min_requests; the one it pays for ("chat", α ≈ 0.85) is not.
* The canary share holds: among the routed class's requests the canary count is binomial(n, canary_share).
* The measured speedup (time per output token) equals the hand computation from the responses' own timings
  (metrics.generation_time_ms, usage.completion_tokens), split by the x-specdecode-route header.
* A fallback that freezes with requests in flight and is then killed loses no request: each is answered by the
  speculative pool (reason fallback_down), counted as such.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from devtools.procs import Process, child_env, exporter_command, free_port
from devtools.stack import start_sidecar, start_simulator
from tests.helpers import Exposition

pytestmark = pytest.mark.timeout(300)

MIN_REQUESTS = 20
CANARY_SHARE = 0.25
SCENARIO = {"name": "routing", "models": [{
    "name": "m", "num_speculative_tokens": 3, "drafts_per_second": 50,
    "workloads": [{"name": "chat", "acceptance_rate": 0.85, "temperature": 0.0},
                  {"name": "summarise", "acceptance_rate": 0.15, "temperature": 0.0}]}]}


@dataclass(frozen=True)
class Pools:
    speculative: Process
    fallback: Process
    sidecar: Process
    tap: str


@dataclass(frozen=True)
class Answer:
    route: str  # the x-specdecode-route header
    status: int
    tpot: float | None  # from the response's own metrics: generation_time_ms / (completion_tokens - 1)
    seconds: float  # as the client measured it


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pools]:
    workdir = tmp_path_factory.mktemp("routing")
    scenario = workdir / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    common = ("--scenario", str(scenario), "--time-scale", "10", "--seed", "3")
    with contextlib.ExitStack() as stack:
        speculative = start_simulator(stack, workdir, "speculative", *common)
        fallback = start_simulator(stack, workdir, "fallback", *common, "--spec-decode", "false")
        tap = f"127.0.0.1:{free_port()}"
        sidecar = start_sidecar(stack, workdir, {
            "targets": [{"name": "vllm", "url": f"{speculative.url}/metrics"}],
            "collect": {"interval": "1s"},
            "tap": {"listen_address": tap, "route": {
                "fallback_upstream": fallback.url, "mode": "enforce", "min_requests": MIN_REQUESTS,
                "canary_share": CANARY_SHARE}},
        })
        _wait(lambda: httpx.get(f"{sidecar.url}/readyz").status_code == 200)
        _wait(lambda: _status(sidecar)["series"] and _status(sidecar)["series"][0]["break_even_acceptance_ratio"])
        # A model name is a class label once the upstream has served it: one request first, so that the tests'
        # concurrent first requests are all counted in their classes.
        _plain(f"http://{tap}", "chat")
        yield Pools(speculative, fallback, sidecar, f"http://{tap}")


def _wait(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _status(sidecar: Process) -> dict[str, Any]:
    target: dict[str, Any] = httpx.get(f"{sidecar.url}/api/v1/status").json()["targets"][0]
    return target


def _stream(tap: str, workload: str) -> Answer:
    """One streamed completion asking for usage, so the client sees the usage event with the request's metrics."""
    body = {"model": "m", "prompt": "a b c", "max_tokens": 16, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    started = time.monotonic()
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{tap}/v1/completions", json=body, headers={"x-workload": workload}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {")]
    seconds = time.monotonic() - started
    usage = next(e for e in events if e["choices"] == [])
    tokens, generation_ms = usage["usage"]["completion_tokens"], usage["metrics"]["generation_time_ms"]
    return Answer(response.headers["x-specdecode-route"], response.status_code,
                  generation_ms / 1000 / (tokens - 1), seconds)


def _plain(tap: str, workload: str) -> Answer:
    body = {"model": "m", "prompt": "a b c", "max_tokens": 8, "temperature": 0.0}
    started = time.monotonic()
    response = httpx.post(f"{tap}/v1/completions", json=body, headers={"x-workload": workload}, timeout=30)
    document = response.json()
    assert document["choices"][0]["text"] and document["usage"]["completion_tokens"] == 8
    return Answer(response.headers["x-specdecode-route"], response.status_code, None, time.monotonic() - started)


def _send(tap: str, workloads: list[str], stream: bool = True) -> list[Answer]:
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda w: (_stream if stream else _plain)(tap, w), workloads))


def _metrics(sidecar: Process) -> Exposition:
    return Exposition.parse(httpx.get(f"{sidecar.url}/metrics").text)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_a_slow_class_is_routed_the_canary_holds_and_the_speedup_is_the_responses(pools: Pools) -> None:
    first = _send(pools.tap, ["summarise", "chat"] * (MIN_REQUESTS + 4))
    routing = _status(pools.sidecar)["routing"]
    states = {c["workload"]: c["routed"] for c in routing["classes"]}
    assert states == {"summarise": True, "chat": False}, routing
    then = _send(pools.tap, ["summarise"] * 200)
    answers = first + then
    assert all(a.status == 200 for a in answers)

    # Canary share: the routed class's requests after it was routed are canary with probability 0.25 each.
    routed = then
    canary = sum(a.route == "speculative; reason=canary" for a in routed)
    assert {a.route for a in routed} == {"speculative; reason=canary", "fallback; reason=benefit"}
    sd = math.sqrt(len(routed) * CANARY_SHARE * (1 - CANARY_SHARE))
    assert abs(canary - len(routed) * CANARY_SHARE) <= 4 * sd, (canary, len(routed))

    exposition = _metrics(pools.sidecar)
    labels = {"model_name": "m", "temperature": "0-0.3"}
    assert exposition.get("specdecode_route_class_state", workload="summarise", **labels) == 1.0
    assert exposition.get("specdecode_route_class_state", workload="chat", **labels) == 0.0
    for reason, upstream in (("canary", "speculative"), ("benefit", "fallback"), ("unrouted", "speculative")):
        counted = exposition.get("specdecode_route_requests_total", workload="summarise", reason=reason,
                                 upstream=upstream, **labels)
        header = f"{upstream}; reason={reason}"
        assert counted == sum(a.route == header for a in first[0::2] + then), reason

    # The measured speedup, by hand from the responses of this routed episode (header canary / benefit).
    arms = {reason: [a for a in answers if a.route.endswith(f"reason={reason}")] for reason in ("canary", "benefit")}
    tpot = _mean([a.tpot for a in arms["benefit"] if a.tpot]) / _mean([a.tpot for a in arms["canary"] if a.tpot])
    measured = exposition.get("specdecode_route_measured_speedup", workload="summarise",
                              latency="time_per_output_token", **labels)
    assert measured == pytest.approx(tpot, rel=1e-9)
    assert measured < 1.0  # α 0.15 with k = 3: speculative decoding is slower here, which routing assumed
    e2e = exposition.get("specdecode_route_measured_speedup", workload="summarise", latency="end_to_end", **labels)
    by_client = _mean([a.seconds for a in arms["benefit"]]) / _mean([a.seconds for a in arms["canary"]])
    assert e2e is not None and abs(math.log(e2e / by_client)) < math.log(1.5), (e2e, by_client)

    summarise = next(c for c in _status(pools.sidecar)["routing"]["classes"] if c["workload"] == "summarise")
    experiment = summarise["measured_speedup"]
    assert experiment["time_per_output_token_basis"] == "engine timings"
    assert experiment["time_per_output_token"]["lower"] <= measured <= experiment["time_per_output_token"]["upper"]
    assert summarise["last_decision"]["break_even_acceptance_ratio"] == 0.5
    assert summarise["last_decision"]["bound"] < 0.5
    page = httpx.get(f"{pools.sidecar.url}/").text
    assert "Routing" in page and "routed</b> for" in page
    said_with_its_own_numbers(pools, summarise, page)


def logged(line: str, key: str) -> float:
    found = re.search(rf"\b{key}=([0-9.]+)", line)
    assert found is not None, line
    return float(found.group(1))


def said_with_its_own_numbers(pools: Pools, summarise: dict[str, Any], page: str) -> None:
    """The decision that routed the class is said with the numbers it was made on (the ones its log line gives),
    its upper bound below the break-even in force then; the canary blocks judged since (about 50 canary requests:
    two blocks) left it routed, and say so in their own words: their α, their lower bound not above the
    break-even."""
    routed_by, latest = summarise["state_decision"], summarise["last_decision"]
    assert routed_by["outcome"] == "routed" and routed_by["bound_kind"] == "upper"
    (line,) = [line for line in Path(pools.sidecar.log).read_text().splitlines()
               if "route: class sent to the fallback" in line and "workload=summarise" in line]
    assert (routed_by["acceptance_ratio"], routed_by["bound"], routed_by["break_even_acceptance_ratio"]) == (
        logged(line, "acceptance_ratio"), logged(line, "bound"), logged(line, "break_even"))
    assert routed_by["bound"] < routed_by["break_even_acceptance_ratio"]
    assert latest["outcome"] == "stays routed" and latest["bound_kind"] == "lower", latest
    assert latest["bound"] <= latest["break_even_acceptance_ratio"]
    assert latest["acceptance_ratio"] != routed_by["acceptance_ratio"]  # another block, its own α
    routed_words = (f"routed: α {routed_by['acceptance_ratio']:.2f}, upper bound {routed_by['bound']:.2f} &lt; "
                    f"break-even {routed_by['break_even_acceptance_ratio']:.2f} in force then, "
                    f"{routed_by['requests']} requests")
    stays_words = (f"latest: stays routed: canary α {latest['acceptance_ratio']:.2f}, lower bound "
                   f"{latest['bound']:.2f} ≤ break-even {latest['break_even_acceptance_ratio']:.2f} in force then, "
                   f"{latest['requests']} requests")
    assert f"{routed_words}<br><small>{stays_words}</small>" in page, page


def test_check_through_the_tap_says_where_its_test_completion_went(pools: Pools) -> None:
    result = subprocess.run([*exporter_command(), "check", f"{pools.tap}/metrics", "--duration", "1s",
                             "--send-test-completion"], capture_output=True, text=True, timeout=60, env=child_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("Routing: this URL is a routing request tap; the test completion went to the speculative pool (reason "
            "unrouted).") in result.stdout


def test_a_block_that_ends_within_a_second_of_the_first_collection_is_judged(pools: Pools, tmp_path: Path) -> None:
    """A fresh sidecar: the router judges the first block of a class against the break-even that the collection
    before it found. Before, the tap process heard the break-even once a second, so a block that ended within a
    second of the first collection (fast requests just after a start) waited without a decision."""
    with contextlib.ExitStack() as stack:
        tap = f"127.0.0.1:{free_port()}"
        sidecar = start_sidecar(stack, tmp_path, {
            "targets": [{"name": "vllm", "url": f"{pools.speculative.url}/metrics"}],
            "collect": {"interval": "1s"},
            "tap": {"listen_address": tap, "route": {
                "fallback_upstream": pools.fallback.url, "mode": "enforce", "min_requests": 4}},
        }, name="fresh-sidecar")
        _wait(lambda: _status(sidecar)["series"] and _status(sidecar)["series"][0]["break_even_acceptance_ratio"])
        _plain(f"http://{tap}", "chat")  # the model is a class label once the upstream has served it
        _send(f"http://{tap}", ["summarise"] * 4, stream=False)

        def summarise() -> dict[str, Any]:
            (state,) = [c for c in _status(sidecar)["routing"]["classes"] if c["workload"] == "summarise"]
            return state

        _wait(lambda: sum(r["requests"] for r in summarise()["requests"]) >= 4)
        state = summarise()
        assert state["last_decision"] is not None, state
        assert state["last_decision"]["break_even_acceptance_ratio"] == 0.5


def test_a_fallback_killed_mid_run_loses_no_request(pools: Pools) -> None:
    """The fallback freezes (SIGSTOP) with requests in flight on it, then dies (SIGKILL): every request is answered
    whole, by the speculative pool, and counted with reason fallback_down."""
    before = _metrics(pools.sidecar)
    labels = {"model_name": "m", "temperature": "0-0.3", "workload": "summarise"}
    down_before = before.get("specdecode_route_requests_total", reason="fallback_down", **labels) or 0.0
    os.kill(pools.fallback.popen.pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(8) as pool:
            in_flight = [pool.submit(_plain, pools.tap, "summarise") for _ in range(8)]
            time.sleep(1.0)  # sent: those for the fallback wait on a frozen process
            assert not all(f.done() for f in in_flight)
            os.kill(pools.fallback.popen.pid, signal.SIGKILL)
            answers = [f.result() for f in in_flight]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pools.fallback.popen.pid, signal.SIGKILL)
    after = _send(pools.tap, ["summarise"] * 20, stream=False)
    everything = answers + after
    assert all(a.status == 200 for a in everything)  # _plain also checked each body is a whole completion
    assert {a.route for a in everything} <= {"speculative; reason=fallback_down", "speculative; reason=canary"}
    down = sum(a.route == "speculative; reason=fallback_down" for a in everything)
    assert sum(a.route == "speculative; reason=fallback_down" for a in answers) >= 1
    counted = _metrics(pools.sidecar).get("specdecode_route_requests_total", reason="fallback_down", **labels)
    assert counted == down_before + down
    log = Path(pools.sidecar.log).read_text()
    assert "request tap fallback unavailable" in log
