"""Routing: the tap sends the classes of requests that speculative decoding slows down to a pool without it.

A class is (model, workload, temperature band[, prompt-length band]), labelled as the request figures label it.
Each class is decided on blocks of ``min_requests`` requests served with speculative decoding that carried
per-request spec-decode metrics (pipeline/ratio_test.py): an unrouted class is routed when a block shows its α
below the break-even in force for its model (calibrated where a baseline gives one, else configured); a routed
class keeps a random ``canary_share`` of its requests on the speculative pool, and comes back when a block of
canary requests shows α above the break-even. In between it stays as it is, so no class flaps.

While a class is routed (enforce mode), the canary and the rest are a randomized split of the same traffic: their
latencies measure the class's real speedup with speculative decoding against without it (time per output token,
and end-to-end time). In observe mode the decisions and counts are the same, but every request goes to the
speculative pool (the counts say where enforce mode would have sent it), so there is no experiment.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from specdecode_exporter.core.process.log import event
from specdecode_exporter.pipeline import ratio_test
from specdecode_exporter.pipeline.latency import MeanSums, MeasuredSpeedup, measured_speedup
from specdecode_exporter.pipeline.ratio_test import RatioEstimate, RatioSums
from specdecode_exporter.tap import model
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
from specdecode_exporter.tap.request_stats import BandKey, RequestSpec, spec_figures, temperature_band
from specdecode_exporter.tap.settings import ENFORCE, RouteSettings

# Before any response said how many tokens a model's prompts have, a text prompt is taken as this many characters
# per token (English text with common tokenizers); each response's usage.prompt_tokens then corrects it, per model.
PRIOR_CHARS_PER_TOKEN = 4.0
PRIOR_WEIGHT_TOKENS = 100.0
_FAILED = frozenset((model.CLIENT_DISCONNECTED, model.UPSTREAM_FAILED, model.HTTP_ERROR))
TPOT_ENGINE, TPOT_CLOCK = "engine timings", "tap clock"


class ClassKey(NamedTuple):
    model_name: str
    workload: str
    temperature: str
    prompt_length: str | None  # None unless prompt-length bands are configured

    def labels(self) -> dict[str, str]:
        out = {"model_name": self.model_name, "workload": self.workload, "temperature": self.temperature}
        if self.prompt_length is not None:
            out["prompt_length"] = self.prompt_length
        return out


class Decision(NamedTuple):
    """A block of evidence a class was judged on, with its own numbers: the sentence said of it reads only these."""

    estimate: RatioEstimate
    break_even: float  # in force when the block was judged
    routed: bool  # the state it left the class in
    at: float  # monotonic time
    was_routed: bool  # the state it judged: routed (a canary block, tested above) or not (tested below)
    bound: float  # the confidence bound its test compared with break_even: upper when unrouted, lower when routed


@dataclass
class _Arm:
    """One side of the randomized split: time per output token (engine timings, tap clock) and end-to-end time."""

    tpot_engine: MeanSums = field(default_factory=MeanSums)
    tpot_clock: MeanSums = field(default_factory=MeanSums)
    e2e: MeanSums = field(default_factory=MeanSums)


class Experiment(NamedTuple):
    """What a routed class's randomized split measured (this routed episode)."""

    speculative_requests: int  # canary requests with a completed response
    fallback_requests: int
    time_per_output_token: MeasuredSpeedup | None  # mean TPOT without / with speculative decoding
    tpot_basis: str | None  # engine timings (the responses' metrics) or tap clock (the stream's own timestamps)
    end_to_end: MeasuredSpeedup | None


@dataclass
class _Class:
    routed: bool
    since: float  # when the class was first seen, or last changed state
    evidence: RatioSums = field(default_factory=RatioSums)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    arms: dict[str, _Arm] = field(default_factory=lambda: {SPECULATIVE: _Arm(), FALLBACK: _Arm()})
    last: Decision | None = None
    changed_by: Decision | None = None  # the decision that put the class in its state (route, or back)
    episodes: int = 0  # times routed
    last_experiment: Experiment | None = None  # the previous routed episode's, once the class came back


class ClassView(NamedTuple):
    key: ClassKey
    routed: bool
    seconds_in_state: float
    counts: tuple[tuple[tuple[str, str], int], ...]  # ((upstream, reason), requests)
    block: RatioEstimate | None  # the block of evidence being gathered
    block_requests: int
    last: Decision | None
    episodes: int
    experiment: Experiment | None  # while routed in enforce mode
    last_experiment: Experiment | None
    changed_by: Decision | None = None  # the decision that put the class in its state


class RoutesView(NamedTuple):
    settings: RouteSettings
    classes: tuple[ClassView, ...]


def experiment_of(arms: Mapping[str, _Arm]) -> Experiment:
    spec, fallback = arms[SPECULATIVE], arms[FALLBACK]
    basis = TPOT_ENGINE if min(spec.tpot_engine.n, fallback.tpot_engine.n) >= 2 else TPOT_CLOCK
    tpot = (measured_speedup(fallback.tpot_engine, spec.tpot_engine) if basis == TPOT_ENGINE
            else measured_speedup(fallback.tpot_clock, spec.tpot_clock))
    return Experiment(spec.e2e.n, fallback.e2e.n, tpot, basis if tpot is not None else None,
                      measured_speedup(fallback.e2e, spec.e2e))


def _number(mapping: Mapping[str, Any] | None, key: str) -> float | None:
    value = mapping.get(key) if isinstance(mapping, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def latencies(request: TapRequest, result: TapResult) -> tuple[float | None, float | None, float]:
    """(TPOT from the response's engine timings, TPOT from the tap's clock, end-to-end seconds) of a completed
    request. TPOT is decode time / (output tokens − 1), vLLM's definition: engine timings use the response's
    metrics.generation_time_ms (first to last token); the tap's clock, a stream's first event to its end."""
    tokens = _number(result.usage, "completion_tokens")
    engine = clock = None
    if tokens is not None and tokens >= 2 and request.n == 1:
        generation_ms = _number(result.metrics, "generation_time_ms")
        if generation_ms is not None:
            engine = generation_ms / 1000.0 / (tokens - 1)
        if request.stream and result.first_body is not None:
            clock = (result.finished - result.first_body) / (tokens - 1)
    return engine, clock, result.finished - result.started


class ClassRouter:
    """The tap's Router (relay: ``route``, at request time) and an Observer (``observe``, when it ended)."""

    def __init__(self, settings: RouteSettings, band: Callable[[TapRequest], BandKey],
                 break_even: Callable[[str], float | None], rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 figures: Callable[[TapResult], RequestSpec | None] | None = None) -> None:
        self.settings = settings
        self._band = band  # the request figures' labelling, so that both label a class alike
        self._break_even = break_even
        self._random = (rng or random.Random()).random
        self._clock = clock
        # A response's spec-decode figures, the evidence: the recorder's (RequestRecorder.figures: none of vLLM's
        # while they are withheld), else all that the response carries.
        self._figures = figures or (lambda result: spec_figures(result.metrics, result.timings, result.sglext))
        self._enforce = settings.mode == ENFORCE
        self._classes: dict[ClassKey, _Class] = {}
        self._chars_per_token: dict[str, tuple[float, float]] = {}  # model → (characters, tokens) seen

    # ---- request time -----------------------------------------------------------------------------------------

    def key(self, request: TapRequest) -> ClassKey:
        band = self._band(request)
        length = None
        if self.settings.prompt_length_bands:
            length = temperature_band(self.prompt_tokens(band.model_name, request), self.settings.prompt_length_bands)
        return ClassKey(band.model_name, band.workload, band.temperature, length)

    def prompt_tokens(self, model_name: str, request: TapRequest) -> float | None:
        if request.prompt_tokens is not None:
            return float(request.prompt_tokens)
        if request.prompt_chars is None:
            return None
        chars, tokens = self._chars_per_token.get(model_name, (0.0, 0.0))
        ratio = (chars + PRIOR_CHARS_PER_TOKEN * PRIOR_WEIGHT_TOKENS) / (tokens + PRIOR_WEIGHT_TOKENS)
        return request.prompt_chars / ratio

    def route(self, request: TapRequest) -> Route:
        key = self.key(request)
        state = self._classes.get(key)
        if state is None or not state.routed:
            return Route(SPECULATIVE, UNROUTED, True, key)
        if self._random() < self.settings.canary_share:
            return Route(SPECULATIVE, CANARY, True, key)
        return Route(FALLBACK, BENEFIT, self._enforce, key)

    # ---- when the response ended ------------------------------------------------------------------------------

    def observe(self, request: TapRequest, result: TapResult) -> None:
        route = result.route
        if route is None or not isinstance(route.key, ClassKey):
            return
        now = self._clock()
        state = self._classes.get(route.key)
        if state is None:
            state = self._classes[route.key] = _Class(routed=False, since=now)
        counted = (route.upstream, route.reason)
        state.counts[counted] = state.counts.get(counted, 0) + 1
        self._learn_prompt_length(route.key.model_name, request, result)
        completed = result.status == 200 and result.reason not in _FAILED
        if completed and state.routed and self._enforce and route.reason in (CANARY, BENEFIT):
            arm = state.arms[SPECULATIVE if route.reason == CANARY else FALLBACK]
            engine, clock, e2e = latencies(request, result)
            if engine is not None:
                arm.tpot_engine = arm.tpot_engine.added(engine)
            if clock is not None:
                arm.tpot_clock = arm.tpot_clock.added(clock)
            arm.e2e = arm.e2e.added(e2e)
        figures = self._figures(result)
        if figures is None or not self._is_evidence(state.routed, route.reason):
            return
        state.evidence = state.evidence.added(figures.draft_tokens, figures.accepted_tokens)
        if state.evidence.n >= self.settings.min_requests:
            self._judge(route.key, state, now)

    @staticmethod
    def _is_evidence(routed: bool, reason: str) -> bool:
        """What a block counts: an unrouted class's requests; a routed class's canary (and, while the fallback is
        down, the requests sent back to the speculative pool). A request routed before a change of state is not
        counted for the new state."""
        return reason in (CANARY, FALLBACK_DOWN) if routed else reason == UNROUTED

    def _learn_prompt_length(self, model_name: str, request: TapRequest, result: TapResult) -> None:
        tokens = _number(result.usage, "prompt_tokens")
        if request.prompt_chars and tokens and self.settings.prompt_length_bands:
            chars, seen = self._chars_per_token.get(model_name, (0.0, 0.0))
            self._chars_per_token[model_name] = (chars + request.prompt_chars, seen + tokens)

    def _judge(self, key: ClassKey, state: _Class, now: float) -> None:
        threshold = self._break_even(key.model_name)
        if threshold is None:
            # None in force yet (the sidecar sends the tap process its first one right after its first collection
            # of the target): the block waits for it, and the first request after it comes decides.
            return
        found = ratio_test.estimate(state.evidence)
        routed = ratio_test.decide(state.routed, state.evidence, threshold, self.settings.min_requests)
        state.evidence = RatioSums()
        if found is None:
            return
        bound = found.lower(ratio_test.RETURN_LEVEL) if state.routed else found.upper(ratio_test.ROUTE_LEVEL)
        state.last = Decision(found, threshold, routed, now, state.routed, bound)
        if routed == state.routed:
            return
        state.changed_by = state.last
        if routed:
            state.episodes += 1
            state.arms = {SPECULATIVE: _Arm(), FALLBACK: _Arm()}
        else:
            state.last_experiment = experiment_of(state.arms) if self._enforce else None
        state.routed, state.since = routed, now
        event(logging.INFO, "route: class sent to the fallback" if routed else "route: class back on speculation",
              **key.labels(), mode=self.settings.mode, acceptance_ratio=round(found.ratio, 4),
              bound=round(bound, 4), break_even=round(threshold, 4), requests=found.n)

    # ---- for scrapes and the status page ------------------------------------------------------------------------

    def view(self) -> RoutesView:
        """An immutable snapshot. Scrapes may run on another thread than the tap: each dict is copied in one step
        (list() of a dict view holds the GIL throughout) before it is read."""
        now = self._clock()
        classes = tuple(
            ClassView(key, state.routed, now - state.since, tuple(sorted(list(state.counts.items()))),
                      ratio_test.estimate(state.evidence), state.evidence.n, state.last, state.episodes,
                      experiment_of(dict(state.arms)) if state.routed and self._enforce else None,
                      state.last_experiment, state.changed_by)
            for key, state in sorted(list(self._classes.items()), key=lambda item: tuple(map(str, item[0]))))
        return RoutesView(self.settings, classes)
