"""Routing decisions (pipeline/ratio_test.py, tap/route.py): the statistics, their false-decision rates under
overdispersed requests, the hysteresis, the canary split and the measured speedup — all pure, no sockets."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from specdecode_exporter.pipeline import ratio_test
from specdecode_exporter.pipeline.latency import MeanSums, measured_speedup
from specdecode_exporter.pipeline.ratio_test import RatioSums
from specdecode_exporter.tap.model import (
    BENEFIT,
    CANARY,
    FALLBACK,
    FALLBACK_DOWN,
    SPECULATIVE,
    UNROUTED,
    Route,
    TapRequest,
    TapResult,
)
from specdecode_exporter.tap.request_stats import RequestRecorder
from specdecode_exporter.tap.route import ClassKey, ClassRouter, latencies
from specdecode_exporter.tap.settings import ENFORCE, OBSERVE, RouteSettings
from tests.tap.harness import tap_settings

# ---- the statistics -------------------------------------------------------------------------------------------------


def test_ratio_estimate_by_hand() -> None:
    requests = [(10, 2), (20, 15), (30, 9)]
    sums = RatioSums()
    for drafted, accepted in requests:
        sums = sums.added(drafted, accepted)
    found = ratio_test.estimate(sums)
    assert found is not None
    ratio = 26 / 60
    residuals = sum((a - ratio * d) ** 2 for d, a in requests)
    assert found.ratio == pytest.approx(ratio)
    assert found.standard_error == pytest.approx(math.sqrt(3 / 2 * residuals / 60**2))
    assert found.upper(0.05) == pytest.approx(ratio + ratio_test.t_score(0.05, 2) * found.standard_error)
    assert ratio_test.estimate(RatioSums().added(10, 5)) is None  # one request: no spread to measure
    assert ratio_test.estimate(RatioSums().added(0, 0).added(0, 0)) is None  # nothing drafted


@pytest.mark.parametrize(("level", "degrees", "table"), [(0.01, 49, 2.4049), (0.01, 19, 2.5395), (0.05, 9, 1.8331),
                                                         (0.01, 1000, 2.3301)])
def test_student_quantiles(level: float, degrees: int, table: float) -> None:
    """Against printed t tables: the small-sample bound is Student's, not the normal one (2.326 at 1 %)."""
    assert ratio_test.t_score(level, degrees) == pytest.approx(table, abs=2e-3)


def _request(rng: random.Random, alpha: float, spread: float) -> tuple[float, float]:
    """One request: its own α ~ Beta around ``alpha`` (sd ``spread``: prompts differ), 20–200 drafted tokens, each
    accepted with the request's α (binomial, normal approximation)."""
    k = alpha * (1 - alpha) / spread**2 - 1
    own = rng.betavariate(alpha * k, (1 - alpha) * k)
    drafted = rng.randint(20, 200)
    accepted = min(drafted, max(0, round(rng.gauss(drafted * own, math.sqrt(drafted * own * (1 - own))))))
    return drafted, accepted


def _blocks(alpha: float, spread: float, blocks: int, size: int, seed: int) -> list[RatioSums]:
    rng = random.Random(seed)
    out = []
    for _ in range(blocks):
        sums = RatioSums()
        for _ in range(size):
            sums = sums.added(*_request(rng, alpha, spread))
        out.append(sums)
    return out


def _share_decided(blocks: list[RatioSums], routed: bool, threshold: float) -> float:
    return sum(ratio_test.decide(routed, b, threshold, 50) != routed for b in blocks) / len(blocks)


def test_false_decisions_at_break_even_stay_near_their_level() -> None:
    """A class exactly at break-even (the worst case for a false decision), requests overdispersed (per-request α
    with sd 0.15): routed in about ROUTE_LEVEL of its blocks, brought back in about RETURN_LEVEL. 3000 blocks:
    the expected count at 1 % is 30; 60 is 5.5 standard deviations above it."""
    blocks = _blocks(0.5, 0.15, 3000, 50, seed=1)
    assert _share_decided(blocks, routed=False, threshold=0.5) <= 2 * ratio_test.ROUTE_LEVEL
    assert _share_decided(blocks, routed=True, threshold=0.5) <= 2 * ratio_test.RETURN_LEVEL


def test_counting_tokens_as_independent_would_route_on_noise() -> None:
    """Why requests are the units: a binomial standard error over tokens, on the same blocks, rejects far more
    often than its level."""
    blocks = _blocks(0.5, 0.15, 1000, 50, seed=2)
    z = ratio_test.z_score(ratio_test.ROUTE_LEVEL)
    token_level = sum(b.y / b.x + z * math.sqrt(0.25 / b.x) < 0.5 for b in blocks) / len(blocks)
    assert token_level > 10 * ratio_test.ROUTE_LEVEL
    assert _share_decided(blocks, routed=False, threshold=0.5) < token_level / 5


@pytest.mark.parametrize(("alpha", "share"), [(0.6, 0.0), (0.4, 0.5), (0.3, 0.99)])
def test_routing_power(alpha: float, share: float) -> None:
    """Above break-even no block routes; 0.1 below, about half of the 50-request blocks; 0.2 below, nearly all."""
    blocks = _blocks(alpha, 0.15, 400, 50, seed=3)
    found = _share_decided(blocks, routed=False, threshold=0.5)
    assert found >= share if share else found == 0.0


def test_decide_is_a_hysteresis() -> None:
    tight = RatioSums()
    for _ in range(50):  # α 0.45 with hardly any spread: shown below 0.5, and not above it
        tight = tight.added(100, 45)
    tight = tight.added(100, 44)
    assert ratio_test.decide(False, tight, 0.5, 50) is True
    assert ratio_test.decide(True, tight, 0.5, 50) is True
    assert ratio_test.decide(False, tight, 0.4, 50) is False
    assert ratio_test.decide(True, tight, 0.4, 50) is False
    # In the dead zone (neither shown below nor above), a class stays as it is.
    noisy = _blocks(0.5, 0.2, 1, 50, seed=4)[0]
    assert ratio_test.decide(True, noisy, 0.5, 50) is True and ratio_test.decide(False, noisy, 0.5, 50) is False
    # No threshold, or too few requests: no decision.
    assert ratio_test.decide(False, tight, None, 50) is False
    assert ratio_test.decide(False, tight, 0.9, 60) is False


def test_measured_speedup_by_hand() -> None:
    slow, fast = MeanSums(), MeanSums()
    for value in (0.030, 0.034, 0.032):
        slow = slow.added(value)
    for value in (0.020, 0.021, 0.019, 0.020):
        fast = fast.added(value)
    found = measured_speedup(slow, fast)
    assert found is not None
    assert found.speedup == pytest.approx(0.032 / 0.020)
    spread = math.sqrt(0.002**2 / (3 * 0.032**2) + (0.002 / math.sqrt(6)) ** 2 / (4 * 0.02**2))
    assert found.lower == pytest.approx(found.speedup * math.exp(-1.959964 * spread), rel=1e-5)
    assert found.lower < found.speedup < found.upper
    assert measured_speedup(MeanSums().added(1.0), fast) is None


# ---- the router ---------------------------------------------------------------------------------------------------


def _request_for(workload: str = "chat", temperature: float = 0.0, **extra: Any) -> TapRequest:
    return TapRequest("POST", "/v1/completions", "completions", "m", temperature, extra.pop("stream", False),
                      extra.pop("n", 1), workload, False, **extra)


def _result(route: Route, drafted: int | None = 100, accepted: int = 30, *, status: int = 200, tokens: int = 21,
            generation_ms: float | None = None, started: float = 0.0, first_body: float | None = None,
            finished: float = 1.0, prompt_tokens: int | None = None) -> TapResult:
    metrics: dict[str, Any] = {"generation_time_ms": generation_ms}
    if drafted is not None:
        metrics["speculative_decoding"] = {"num_draft_tokens": drafted, "num_accepted_draft_tokens": accepted,
                                           "num_spec_steps": drafted // 3}
    usage = {"completion_tokens": tokens, "prompt_tokens": prompt_tokens}
    return TapResult(status, metrics, None, usage, None, started, started, finished, first_body, route)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _router(mode: str = ENFORCE, break_even: float | Callable[[str], float | None] | None = 0.5, seed: int = 7,
            **settings: Any) -> tuple[ClassRouter, Clock]:
    recorder = RequestRecorder(tap_settings())
    # The upstream has served model "m" before: a model name is a class label only from then on.
    recorder.observe(_request_for(), _result(Route(SPECULATIVE, UNROUTED, False, ClassKey("m", "chat", "0-0.3", None))))
    clock = Clock()
    router = ClassRouter(RouteSettings("http://fallback:8000", mode=mode, **{"min_requests": 20, **settings}),
                         recorder.band_key, break_even if callable(break_even) else lambda model: break_even,
                         random.Random(seed), clock)
    return router, clock


def _serve(router: ClassRouter, request: TapRequest, alpha: float, **result: Any) -> Route:
    route = router.route(request)
    served_spec = not route.to_fallback
    drafted = 100 if served_spec else None  # the fallback pool reports no spec-decode metrics
    router.observe(request, _result(route, drafted, round(100 * alpha), **result))
    return route


def test_a_class_below_break_even_is_routed_after_min_requests_and_others_are_not() -> None:
    router, _ = _router()
    slow, fast = _request_for("summarise"), _request_for("chat")
    for _ in range(19):
        assert _serve(router, slow, 0.2) == Route(SPECULATIVE, UNROUTED, True, router.key(slow))
        _serve(router, fast, 0.8)
    _serve(router, slow, 0.2)  # the 20th request of the block: the decision
    _serve(router, fast, 0.8)
    assert router.route(fast).reason == UNROUTED
    routes = [router.route(slow) for _ in range(2000)]
    assert {(r.upstream, r.reason) for r in routes} == {(FALLBACK, BENEFIT), (SPECULATIVE, CANARY)}
    (slow_view,) = [c for c in router.view().classes if c.routed]
    assert slow_view.key == ClassKey("m", "summarise", "0-0.3", None)
    assert slow_view.last is not None and slow_view.last.break_even == 0.5 and slow_view.episodes == 1


def test_the_canary_share_holds() -> None:
    """10 000 routed requests, share 0.05: the canary count is binomial (sd 21.8); 5 sd either side."""
    router, _ = _router(canary_share=0.05)
    request = _request_for("summarise")
    for _ in range(20):
        _serve(router, request, 0.1)
    canary = sum(router.route(request).reason == CANARY for _ in range(10_000))
    assert abs(canary - 500) <= 5 * math.sqrt(10_000 * 0.05 * 0.95)


def test_a_routed_class_comes_back_only_on_canary_evidence() -> None:
    router, clock = _router(canary_share=0.2)
    request = _request_for("summarise")
    for _ in range(20):
        _serve(router, request, 0.1)
    assert router.view().classes[0].routed
    # The class recovers: its fallback requests carry no metrics and decide nothing; the canary brings it back.
    routes = []
    clock.now += 60
    while router.view().classes[0].routed:
        routes.append(_serve(router, request, 0.9))
        assert len(routes) < 1000
    canary = [r for r in routes if r.reason == CANARY]
    assert len(canary) == 20 and routes[-1].reason == CANARY
    view = router.view().classes[0]
    assert view.seconds_in_state == 0.0 and view.last is not None and not view.last.routed
    assert router.route(request).reason == UNROUTED


def test_requests_routed_before_a_change_of_state_are_not_evidence_after_it() -> None:
    router, _ = _router()
    request = _request_for("summarise")
    earlier = [router.route(request) for _ in range(5)]  # unrouted, in flight while the class gets routed
    for _ in range(20):
        _serve(router, request, 0.1)
    for route in earlier:
        router.observe(request, _result(route, 100, 90))
    assert router.view().classes[0].block_requests == 0


def test_fallback_down_requests_count_as_canary_evidence() -> None:
    router, _ = _router()
    request = _request_for("summarise")
    for _ in range(20):
        _serve(router, request, 0.1)
    down = router.route(request).failed_over()
    router.observe(request, _result(down, 100, 10))
    view = router.view().classes[0]
    assert view.block_requests == 1 and dict(view.counts)[(SPECULATIVE, FALLBACK_DOWN)] == 1


def test_observe_mode_decides_and_counts_alike_but_enforces_nothing() -> None:
    router, _ = _router(mode=OBSERVE)
    request = _request_for("summarise")
    for _ in range(20):
        _serve(router, request, 0.1)
    routes = [_serve(router, request, 0.1) for _ in range(200)]
    assert all(not r.to_fallback for r in routes)
    assert {(r.upstream, r.reason, r.enforced) for r in routes} == {(FALLBACK, BENEFIT, False),
                                                                     (SPECULATIVE, CANARY, True)}
    view = router.view().classes[0]
    assert view.routed and view.experiment is None
    # Only the canary is evidence for coming back, in observe mode as in enforce mode.
    assert view.block_requests == sum(r.reason == CANARY for r in routes) % 20


def test_no_break_even_no_decision() -> None:
    router, _ = _router(break_even=None)
    request = _request_for("summarise")
    for _ in range(100):
        _serve(router, request, 0.0)
    assert not router.view().classes[0].routed and router.view().classes[0].last is None


def test_a_block_served_before_the_break_even_is_known_waits_for_it() -> None:
    """The tap process hears the sidecar's first break-even a moment after the sidecar has it: a block served
    meanwhile is kept, not dropped, and the first request after the break-even arrives decides on all of it."""
    known: dict[str, float] = {}
    router, _ = _router(break_even=known.get)
    request = _request_for("summarise")
    for _ in range(20):  # a whole block (min_requests 20), no break-even yet
        _serve(router, request, 0.2)
    (state,) = router.view().classes
    assert not state.routed and state.last is None and state.block_requests == 20
    known["m"] = 0.5
    _serve(router, request, 0.2)
    (state,) = router.view().classes
    assert state.routed and state.last is not None and state.last.estimate.n == 21


def test_measured_speedup_of_a_routed_class_is_the_randomized_split() -> None:
    router, _ = _router(canary_share=0.3)
    request = _request_for("summarise", stream=True)
    for _ in range(20):
        _serve(router, request, 0.1)
    expected: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(60):
        route = router.route(request)
        canary = route.reason == CANARY
        generation_ms = (30.0 if canary else 20.0) + i % 7  # spec decode 1.4x slower per token here
        end = 2.0 + i / 100
        router.observe(request, _result(route, 100 if canary else None, 10, tokens=21, generation_ms=generation_ms,
                                        first_body=0.5, finished=end))
        expected[canary].append((generation_ms / 1000 / 20, end))
    experiment = router.view().classes[0].experiment
    assert experiment is not None and experiment.tpot_basis == "engine timings"
    assert (experiment.speculative_requests, experiment.fallback_requests) == (len(expected[True]),
                                                                                len(expected[False]))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    tpot = mean([t for t, _ in expected[False]]) / mean([t for t, _ in expected[True]])
    e2e = mean([e for _, e in expected[False]]) / mean([e for _, e in expected[True]])
    assert experiment.time_per_output_token is not None and experiment.end_to_end is not None
    assert experiment.time_per_output_token.speedup == pytest.approx(tpot)
    assert experiment.end_to_end.speedup == pytest.approx(e2e)


def test_latencies_of_one_request() -> None:
    route = Route(SPECULATIVE, CANARY, True, ())
    stream = _request_for(stream=True)
    result = _result(route, tokens=11, generation_ms=50.0, started=1.0, first_body=1.2, finished=1.7)
    assert latencies(stream, result) == pytest.approx((0.005, 0.05, 0.7))
    assert latencies(_request_for(), result) == pytest.approx((0.005, None, 0.7))  # not streamed: no tap clock
    assert latencies(_request_for(n=2), result)[:2] == (None, None)  # tokens of several choices: no TPOT
    assert latencies(stream, _result(route, tokens=1, first_body=1.2))[:2] == (None, None)


def test_prompt_length_bands() -> None:
    router, _ = _router(prompt_length_bands=(1000, 4000))
    assert router.key(_request_for(prompt_tokens=5000)).prompt_length == "4000+"  # token ids: exact
    text = _request_for(prompt_chars=10_000)
    assert router.key(text).prompt_length == "1000-4000"  # 4 characters a token before any response says
    # Responses show this model's prompts at 2 characters a token: the same text is now a long prompt.
    route = router.route(text)
    for _ in range(10):
        router.observe(text, _result(route, prompt_tokens=5000))
    assert router.key(text).prompt_length == "4000+"
    assert router.key(_request_for()).prompt_length == "unset"
    assert _router()[0].key(text).prompt_length is None


def test_the_request_figures_leave_out_what_the_fallback_served() -> None:
    """The tapped target's per-request figures are its own: a request routed to the fallback is counted by the
    router (specdecode_route_requests_total), not as a target request without spec-decode metrics."""
    recorder = RequestRecorder(tap_settings())
    request = _request_for("summarise")
    key = ClassKey("m", "summarise", "0-0.3", None)
    recorder.observe(request, _result(Route(FALLBACK, BENEFIT, True, key), drafted=None))
    assert recorder.view().without_metrics == {} and recorder.view().bands == {}
    recorder.observe(request, _result(Route(FALLBACK, BENEFIT, False, key)))  # observe mode: served by the target
    assert sum(t.requests for t in recorder.view().bands.values()) == 1
