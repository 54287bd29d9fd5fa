"""The simulator: integrates the traffic model over simulated time, lazily, up to the clock's 'now'.

State is advanced only when someone looks (``snapshot()``, ``state()``, ``/metrics``) or mutates it. The
integration splits time at phase boundaries, V0 report instants and noise ticks, so the result does not
depend on when or how often it is observed: scrapes 1 s apart or one scrape after 2 s give the same counters.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import itertools
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.simulator.model import (
    FINISH_REASON_SHARES,
    LATENCY_SPREAD,
    LiveParams,
    ModelSpec,
    Rates,
    compute_rates,
    cumulative_fractions,
    effective_acceptance_rate,
    noise_factor,
    position_fractions,
    scale_fractions,
    step_k,
)
from specdecode_exporter.simulator.requests import Call, Generation, generate, request_alpha, workload_for
from specdecode_exporter.simulator.scenario import FAULTS, Phase, Scenario, default_scenario

V0_REPORT_INTERVAL = 5.0  # vLLM V0 logs spec-decode metrics every 5 s (local_interval)
NOISE_TICK = 1.0
_EPS = 1e-9

ITL_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                  60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
V0_TPOT_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
REQUEST_ACCEPTANCE_BUCKETS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 11))
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "request_acceptance": REQUEST_ACCEPTANCE_BUCKETS,
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "tpot": ITL_BUCKETS,
    "e2e": E2E_BUCKETS,
    "v0_tpot": V0_TPOT_BUCKETS,
}


def exposed(expected: float) -> int:
    """Integer counter value for an accumulated expectation; the slack absorbs float summation error."""
    return math.floor(expected + 1e-6)


@functools.lru_cache(maxsize=4096)
def _cached_fractions(alpha: float, k: int, fill: float) -> tuple[float, ...]:
    return position_fractions(alpha, k, fill)


class HistogramAccumulator:
    """Expected-value histogram: fractional observation counts, floored on exposure.

    The sum grows only with the exposed (whole) count, by the mean of the observations that completed it, so
    _sum and _count always describe the same observations, as a real histogram's do: Δ_sum/Δ_count over any
    interval is the mean latency of that interval, not skewed by observations counted in _sum but not yet in
    _count (which made a few seconds' mean read up to ~20 % high)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.per_bucket = [0.0] * (len(buckets) + 1)  # non-cumulative; the last slot is above every bound
        self.count = 0.0
        self.sum = 0.0  # of the exposed observations

    def _add(self, n: float, mean: float) -> None:
        before = exposed(self.count)
        self.count += n
        self.sum += (exposed(self.count) - before) * mean

    def observe(self, n: float, mean: float) -> None:
        if n <= 0:
            return
        self._add(n, mean)  # LATENCY_SPREAD's weighted mean is 1: these n observations average ``mean``
        for mult, weight in LATENCY_SPREAD:
            self.per_bucket[bisect.bisect_left(self.buckets, mean * mult)] += n * weight

    def observe_exactly(self, n: float, value: float) -> None:
        """``n`` observations of exactly ``value`` (served requests, whose latency is known)."""
        if n <= 0:
            return
        self._add(n, value)
        self.per_bucket[bisect.bisect_left(self.buckets, value)] += n

    def snapshot(self) -> HistogramSnapshot:
        count = exposed(self.count)
        cumulative = itertools.accumulate(self.per_bucket[:-1])
        pairs = zip(self.buckets, cumulative, strict=True)
        buckets = tuple((le, min(count, exposed(c))) for le, c in pairs)
        return HistogramSnapshot(buckets=(*buckets, (math.inf, count)), count=count, sum=self.sum)


@dataclass(frozen=True)
class HistogramSnapshot:
    buckets: tuple[tuple[float, int], ...]  # cumulative, last is +Inf
    count: int
    sum: float


@dataclass(frozen=True)
class V0Snapshot:
    accepted_total: int  # the buggy sum-of-sums counters
    draft_total: int
    emitted_total: int
    acceptance_rate: float  # lifetime gauge
    efficiency: float
    lifetime_accepted: int  # what the lifetime totals were at the last report (for tests and /-/state)
    lifetime_draft: int
    lifetime_emitted: int
    reports: int


@dataclass(frozen=True)
class EngineSnapshot:
    engine: int
    created: float  # unix time of the engine's (re)start: the value of every *_created sample
    drafts: int
    draft_tokens: int
    accepted: int
    per_pos: tuple[int, ...]
    generation_tokens: int
    prompt_tokens: int
    requests: dict[str, int]
    running: int
    waiting: int
    kv_cache_usage: float
    histograms: dict[str, HistogramSnapshot]
    v0: V0Snapshot | None  # None until V0's first report
    preemptions: int = 0
    scheduled_steps: tuple[int, ...] = ()  # scheduler steps by the k they ran with (index = k)
    speculating: bool = True  # False once an acceptance gate switched speculation off
    drafted_per_pos: tuple[int, ...] = ()  # drafts that reached each position (the k of their step > position)
    verified_draft_tokens: int = 0  # draft tokens sent to verification (vllm#58340's counter)


@dataclass(frozen=True)
class ModelSnapshot:
    spec: ModelSpec
    live: LiveParams
    fractions: tuple[float, ...]
    engines: tuple[EngineSnapshot, ...]


@dataclass
class _Engine:
    index: int
    started_at: float
    k: int
    rng: random.Random
    drafts: float = 0.0
    draft_tokens: float = 0.0
    verified_draft_tokens: float = 0.0
    per_pos: list[float] = field(default_factory=list)
    drafted_per_pos: list[float] = field(default_factory=list)  # a batch-size schedule drafts < k at some steps
    # Drafts by the tokens each drafted (index 0…k; 0: a control pod's steps). Exposed as whole drafts per length,
    # so a stretch of k-token drafts adds exactly k tokens per draft, whatever shorter drafts came before it.
    drafts_by_length: list[float] = field(default_factory=list)
    generation: float = 0.0
    prompt: float = 0.0
    requests: dict[str, float] = field(default_factory=dict)
    running: float = 0.0
    waiting: float = 0.0
    histograms: dict[str, HistogramAccumulator] = field(default_factory=dict)
    noise_drafts: float = 1.0
    noise_accept: float = 1.0
    v0_accepted: float = 0.0
    v0_emitted: float = 0.0
    v0_reports: int = 0
    v0_drafts_at_report: float = 0.0
    v0_logged: int = 0  # reports that carried metrics; V0 series exist only after the first
    v0_counters: tuple[int, int, int] = (0, 0, 0)  # accepted, draft, emitted (sum of lifetime totals)
    v0_lifetime: tuple[int, int, int, int] = (0, 0, 0, 0)  # accepted, draft, emitted, drafts at last report
    gate_window: int = 0  # speculation iterations the acceptance gate averages over (0: no gate)
    preemptions: float = 0.0
    kv_cache_usage: float = 0.0
    scheduled: list[float] = field(default_factory=list)  # scheduler steps by k (0…k)
    speculating: bool = True  # an acceptance gate closes it for good (until a restart)
    gate: RollingMean = field(default_factory=lambda: RollingMean(0.0))

    def __post_init__(self) -> None:
        self.per_pos = [0.0] * self.k
        self.drafted_per_pos = [0.0] * self.k
        self.drafts_by_length = [0.0] * (self.k + 1)
        self.scheduled = [0.0] * (self.k + 1)
        self.gate = RollingMean(float(self.gate_window))
        self.requests = {reason: 0.0 for reason, _ in FINISH_REASON_SHARES}
        self.histograms = {name: HistogramAccumulator(b) for name, b in HISTOGRAM_BUCKETS.items()}

    def next_v0_report(self) -> float:
        return self.started_at + V0_REPORT_INTERVAL * (self.v0_reports + 1)


def _integrate(e: _Engine, r: Rates, dt: float) -> None:
    e.drafts += r.drafts * dt
    e.drafts_by_length[r.k] += r.drafts * dt
    e.draft_tokens += r.draft_tokens * dt
    e.verified_draft_tokens += r.verified_draft_tokens * dt
    for i, rate in enumerate(r.per_pos):
        e.per_pos[i] += rate * dt
    if r.drafts > 0:  # the steps drafted r.k tokens, each position evenly short by the fill (as draft_tokens are)
        per_position = r.draft_tokens / r.k * dt if r.k else 0.0
        for i in range(min(r.k, e.k)):
            e.drafted_per_pos[i] += per_position
    e.generation += r.generation_tokens * dt
    e.prompt += r.prompt_tokens * dt
    for reason, share in FINISH_REASON_SHARES:
        e.requests[reason] += r.requests * share * dt
    e.running, e.waiting, e.kv_cache_usage = r.running, r.waiting, r.kv_cache_usage
    e.preemptions += r.preemptions * dt
    if r.steps > 0 and r.step_seconds > 0:
        e.scheduled[r.k] += min(1.0, r.running) * dt / r.step_seconds  # one scheduler step for the whole batch
    e.histograms["itl"].observe(r.steps * dt, r.step_seconds)
    e.histograms["v0_tpot"].observe(r.steps * dt, r.step_seconds)
    n_req = r.requests * dt
    for requests, tpot in r.tpot_groups:  # a mixed workload: each part at its own TPOT
        e.histograms["tpot"].observe(requests * dt, tpot)
    e.histograms["ttft"].observe(n_req, r.ttft_seconds)
    e.histograms["e2e"].observe(n_req, r.e2e_seconds)
    e.v0_accepted += r.v0_accepted * dt
    e.v0_emitted += r.v0_emitted * dt


def _exposed_drafts(spec: ModelSpec, e: _Engine) -> tuple[int, int]:
    """(drafts, drafted tokens) as the counters show them. Whole drafts of whole lengths where every draft has one
    (draft_fill 1, no trim counted as verified): a window of k-token drafts then shows exactly k tokens per draft,
    before and after a stretch of shorter ones (a batch-size schedule), and both counters only grow."""
    if spec.draft_fill == 1.0 and not (spec.adaptive_verification_share and spec.draft_tokens_count == "verified"):
        whole = tuple(exposed(n) for n in e.drafts_by_length)
        return sum(whole), sum(length * n for length, n in enumerate(whole))
    return exposed(e.drafts), exposed(e.draft_tokens)


class RollingMean:
    """The mean of the last ``size`` (fractional) observations, fed in weighted chunks: TensorRT-LLM's
    SpeculationGate averages the acceptance rate of the last acceptance_rate_window_size speculation iterations."""

    def __init__(self, size: float) -> None:
        self.size = size
        self.chunks: collections.deque[tuple[float, float]] = collections.deque()  # (weight, value)
        self.weight = 0.0
        self.total = 0.0

    def add(self, weight: float, value: float) -> None:
        self.chunks.append((weight, value))
        self.weight += weight
        self.total += weight * value
        while self.weight - self.size > 1e-9:
            oldest, old_value = self.chunks[0]
            drop = min(oldest, self.weight - self.size)
            self.weight -= drop
            self.total -= drop * old_value
            if drop >= oldest:
                self.chunks.popleft()
            else:
                self.chunks[0] = (oldest - drop, old_value)

    @property
    def full(self) -> bool:
        return self.size > 0 and self.weight >= self.size - 1e-9

    @property
    def mean(self) -> float:
        return self.total / self.weight if self.weight > 0 else 0.0


def _gate(e: _Engine, spec: ModelSpec, iterations: float, acceptance_rate: float) -> None:
    """TensorRT-LLM's acceptance gate (NVIDIA/TensorRT-LLM#12905): ``iterations`` more speculation iterations, each
    accepting ``acceptance_rate`` of the tokens it drafted; once the window is full and the mean of its last
    acceptance_rate_window_size samples is below acceptance_rate_threshold, speculation stops for good."""
    threshold = spec.acceptance_rate_threshold
    if threshold is None or not e.speculating or iterations <= 0:
        return
    e.gate.add(iterations, acceptance_rate)
    if e.gate.full and e.gate.mean < threshold:
        e.speculating = False


def _account(e: _Engine, g: Generation, prompt_tokens: int) -> None:
    """One served request in an engine's counters and histograms (exact observations, not spread)."""
    e.drafts += g.spec_steps
    e.drafts_by_length[min(g.drafted_per_step, e.k)] += g.spec_steps
    e.draft_tokens += g.drafted
    e.verified_draft_tokens += g.drafted  # a served request's drafts are not trimmed
    for prefix in g.accepted_per_step:
        for i in range(prefix):
            e.per_pos[i] += 1
    for i in range(min(g.drafted_per_step, e.k)):
        e.drafted_per_pos[i] += g.spec_steps
    e.v0_accepted += g.accepted
    e.v0_emitted += g.accepted + g.spec_steps
    e.generation += g.tokens
    e.prompt += prompt_tokens
    e.requests["length"] += 1.0
    e.scheduled[min(g.drafted_per_step, e.k)] += g.steps
    e.histograms["itl"].observe_exactly(g.steps, g.step_seconds)
    e.histograms["v0_tpot"].observe_exactly(g.steps, g.step_seconds)
    e.histograms["tpot"].observe_exactly(1.0, g.tpot_seconds)
    if g.drafted:
        e.histograms["request_acceptance"].observe_exactly(1.0, g.accepted / g.drafted)
    e.histograms["ttft"].observe_exactly(1.0, g.ttft_seconds)
    e.histograms["e2e"].observe_exactly(1.0, g.ttft_seconds + g.generation_seconds)


def _v0_report(e: _Engine) -> None:
    """One V0 stats report: the counters grow by the LIFETIME totals (vLLM's sum-of-sums bug)."""
    e.v0_reports += 1
    if e.drafts <= e.v0_drafts_at_report:
        return  # idle engine: no spec-decode step ran, so no metrics were collected or logged
    e.v0_drafts_at_report = e.drafts
    e.v0_logged += 1
    drafts = exposed(e.drafts)
    lifetime = (exposed(e.v0_accepted), drafts * e.k, exposed(e.v0_emitted))
    e.v0_counters = tuple(c + x for c, x in zip(e.v0_counters, lifetime, strict=True))  # type: ignore[assignment]
    e.v0_lifetime = (*lifetime, drafts)


class Simulator:
    """A fake vLLM's numbers. Thread-safe; time comes from ``clock`` × ``time_scale`` plus ``advance()``."""

    def __init__(
        self,
        scenario: Scenario | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        time_scale: float = 1.0,
        wall_epoch: float | None = None,
        seed: int | None = None,
        hang_seconds: float = 600.0,
        slow_seconds: float = 10.0,
        per_request_metrics: str = "summary",
        request_timings: bool = True,
        pace: bool = False,
    ) -> None:
        # The per-request metrics vLLM is started with (--per-request-spec-decode-metrics none|summary,
        # --enable-per-request-metrics), and whether a stream is paced at the simulated step time.
        self.per_request_metrics = per_request_metrics
        self.request_timings = request_timings
        self.pace = pace
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ConfigError(f"time_scale: expected a positive number, got {time_scale!r}")
        self.scenario = scenario if scenario is not None else default_scenario()
        self.time_scale = time_scale
        self.seed = self.scenario.seed if seed is None else seed
        self.hang_seconds = hang_seconds
        self.slow_seconds = slow_seconds
        self._clock = clock
        self._t0 = clock()
        self._manual = 0.0
        self._now = 0.0
        self._wall_epoch = time.time() if wall_epoch is None else wall_epoch
        self._lock = threading.RLock()
        self._phase_index = 0
        self._phase_time = 0.0
        self._paused = False
        self._overrides: dict[str, dict[str, Any]] = {}
        self._manual_fault: str | None = None
        self._round_robin = -1
        self._request_rng = random.Random(f"{self.seed}:requests")
        self._specs = {m.name: m for m in self.scenario.models}
        self._engines: dict[str, list[_Engine]] = {}
        self._restart_all()
        if self.scenario.phases:
            self._enter_phase(0)

    # ----- time -----
    @property
    def format(self) -> str:
        return self.scenario.format

    def sim_time(self) -> float:
        """Simulated seconds since start, as the clock sees it now."""
        return (self._clock() - self._t0) * self.time_scale + self._manual

    def advance(self, seconds: float) -> None:
        """Move simulated time forward by ``seconds`` (on top of the clock)."""
        if seconds < 0:
            raise ValueError("advance: seconds must be >= 0")
        with self._lock:
            self._manual += seconds
            self._sync()

    def _sync(self) -> None:
        target = self.sim_time()
        while self._now < target - _EPS:
            end = min(target, self._next_event())
            dt = end - self._now
            if dt > 0:
                self._integrate_all(dt)
                if self.scenario.phases and not self._paused:
                    self._phase_time += dt
            self._now = max(self._now, end)
            self._fire_events()

    def _next_event(self) -> float:
        nxt = math.inf
        if self._phase_can_end():
            nxt = self._now + max(0.0, self._current_phase().duration - self._phase_time)
        if any(m.noise > 0 for m in self.scenario.models):
            nxt = min(nxt, (math.floor(self._now / NOISE_TICK + _EPS) + 1) * NOISE_TICK)
        if self.format == "v0":
            nxt = min(nxt, *(e.next_v0_report() for es in self._engines.values() for e in es))
        return nxt

    def _fire_events(self) -> None:
        if self.format == "v0":
            for es in self._engines.values():
                for e in es:
                    while e.next_v0_report() <= self._now + _EPS:
                        _v0_report(e)
        if any(m.noise > 0 for m in self.scenario.models):
            on_tick = abs(self._now / NOISE_TICK - round(self._now / NOISE_TICK)) < _EPS
            if on_tick:
                self._resample_noise()
        if self._phase_can_end() and self._phase_time >= self._current_phase().duration - _EPS:
            self._enter_phase((self._phase_index + 1) % len(self.scenario.phases))

    def _phase_can_end(self) -> bool:
        """False while paused, without phases, or in the last phase of a non-looping scenario (it holds)."""
        phases = self.scenario.phases
        if not phases or self._paused:
            return False
        return self.scenario.loop or self._phase_index < len(phases) - 1

    # ----- phases and parameters -----
    def _current_phase(self) -> Phase:
        return self.scenario.phases[self._phase_index]

    def _enter_phase(self, index: int) -> None:
        self._phase_index = index
        self._phase_time = 0.0
        if self._current_phase().restart:
            self._restart_all()

    def live_params(self, spec: ModelSpec) -> LiveParams:
        alpha, dps, curve = spec.acceptance_rate, spec.drafts_per_second, spec.position_acceptance
        layers: list[dict[str, Any]] = []
        if self.scenario.phases:
            p = self._current_phase()
            if p.model is None or p.model == spec.name:
                layers.append({"acceptance_rate": p.acceptance_rate, "drafts_per_second": p.drafts_per_second,
                               "position_acceptance": p.position_acceptance})
        layers.append(self._overrides.get(spec.name, {}))
        for layer in layers:
            if layer.get("acceptance_rate") is not None:
                alpha, curve = layer["acceptance_rate"], None
            if layer.get("position_acceptance") is not None:
                curve = layer["position_acceptance"]
            if layer.get("drafts_per_second") is not None:
                dps = layer["drafts_per_second"]
        return LiveParams(acceptance_rate=alpha, drafts_per_second=dps, position_acceptance=curve)

    def _fractions(self, spec: ModelSpec, live: LiveParams) -> tuple[float, ...]:
        if live.position_acceptance is not None:
            return cumulative_fractions(live.position_acceptance)
        return _cached_fractions(live.acceptance_rate, spec.num_speculative_tokens, spec.draft_fill)

    def _integrate_all(self, dt: float) -> None:
        for spec in self.scenario.models:
            live = self.live_params(spec)
            fractions = self._fractions(spec, live)
            for e in self._engines[spec.name]:
                params, curve = live, fractions
                if spec.noise > 0:
                    params = LiveParams(live.acceptance_rate, live.drafts_per_second * e.noise_drafts)
                    curve = scale_fractions(fractions, e.noise_accept)
                rates = compute_rates(spec, params, curve, step_k(spec, params.drafts_per_second, e.speculating))
                _integrate(e, rates, dt)
                if rates.k > 0 and rates.steps > 0 and rates.step_seconds > 0 and rates.verified_draft_tokens > 0:
                    # one sample per scheduler iteration (the whole batch's): its accepted over drafted tokens
                    _gate(e, spec, min(1.0, rates.running) * dt / rates.step_seconds,
                          rates.accepted / rates.verified_draft_tokens)

    def _resample_noise(self) -> None:
        for spec in self.scenario.models:
            if spec.noise <= 0:
                continue
            for e in self._engines[spec.name]:
                e.noise_drafts = noise_factor(spec.noise, e.rng.gauss(0.0, 1.0))
                e.noise_accept = noise_factor(spec.noise, e.rng.gauss(0.0, 1.0))

    def _restart_all(self) -> None:
        self._engines = {
            spec.name: [
                _Engine(index=i, started_at=self._now, k=spec.num_speculative_tokens,
                        rng=random.Random(f"{self.seed}:{spec.name}:{i}:{self._now!r}"),
                        gate_window=spec.acceptance_rate_window_size)
                for i in range(spec.engines)
            ]
            for spec in self.scenario.models
        }
        self._resample_noise()

    # ----- control (the /-/ endpoints) -----
    def set_override(self, *, model: str | None = None, acceptance_rate: float | None = None,
                     drafts_per_second: float | None = None,
                     position_acceptance: tuple[float, ...] | None = None) -> None:
        """Override live parameters from now on and pause phase progression (until ``resume()``)."""
        with self._lock:
            self._sync()
            targets = [model] if model is not None else list(self._specs)
            for name in targets:
                if name not in self._specs:
                    raise ConfigError(f"model: unknown model {name!r} (known: {', '.join(self._specs)})")
                k = self._specs[name].num_speculative_tokens
                if position_acceptance is not None and len(position_acceptance) != k:
                    raise ConfigError(f"position_acceptance: expected {k} values "
                                        f"for model {name!r}, got {len(position_acceptance)}")
            for name in targets:
                layer = self._overrides.setdefault(name, {})
                if acceptance_rate is not None:
                    layer["acceptance_rate"] = acceptance_rate
                    layer.pop("position_acceptance", None)
                if position_acceptance is not None:
                    layer["position_acceptance"] = tuple(position_acceptance)
                if drafts_per_second is not None:
                    layer["drafts_per_second"] = drafts_per_second
            self._paused = True

    def resume(self) -> None:
        """Drop manual overrides and let the scenario's phases run on from where they stopped."""
        with self._lock:
            self._sync()
            self._overrides.clear()
            self._paused = False

    def goto_phase(self, name: str) -> None:
        with self._lock:
            self._sync()
            names = [p.name for p in self.scenario.phases]
            if name not in names:
                raise ConfigError(f"phase: unknown phase {name!r} (known: {', '.join(names) or 'none'})")
            self._enter_phase(names.index(name))

    def restart(self) -> None:
        """Like a vLLM restart: counters back to 0, new ``_created`` values, V0 series gone until a report."""
        with self._lock:
            self._sync()
            self._restart_all()

    def set_fault(self, mode: str) -> None:
        """Force a /metrics fault; 'none' clears it (a scenario phase's own fault still applies)."""
        if mode not in FAULTS:
            raise ConfigError(f"mode: expected one of {', '.join(FAULTS)}, got {mode!r}")
        with self._lock:
            self._manual_fault = None if mode == "none" else mode

    @property
    def fault(self) -> str:
        with self._lock:
            self._sync()
            if self._manual_fault is not None:
                return self._manual_fault
            if self.scenario.phases and self._current_phase().fault is not None:
                return self._current_phase().fault or "none"
            return "none"

    def serve(self, call: Call, prompt_tokens: int, workload_header: str | None = None) -> list[Generation]:
        """Generate one API request (n choices) on the model's next engine and account every step in the
        engine's counters and histograms, exactly as its response will report them."""
        with self._lock:
            self._sync()
            spec = self._specs[call.model]
            live = self.live_params(spec)
            engines = self._engines[call.model]
            self._round_robin += 1
            engine = engines[self._round_robin % len(engines)]
            k = step_k(spec, live.drafts_per_second, engine.speculating)
            rates = compute_rates(spec, LiveParams(live.acceptance_rate, 1.0), self._fractions(spec, live), k)
            workload = workload_for(spec, call.temperature, workload_header)
            alpha = request_alpha(spec, live.acceptance_rate, call.temperature, workload)
            generations = [generate(spec, alpha, call.max_tokens, rates.step_seconds, rates.ttft_seconds,
                                    self._request_rng, workload.name, k) for _ in range(call.n)]
            for generation in generations:
                _account(engine, generation, prompt_tokens)
                if generation.drafted:  # its steps ride in the iterations of the running batch: a share of each
                    _gate(engine, spec, generation.spec_steps / (1.0 + engine.running),
                          generation.accepted / generation.drafted)
            return generations

    def model_names(self) -> tuple[str, ...]:
        return tuple(self._specs)

    # ----- observation -----
    def snapshot(self) -> tuple[ModelSnapshot, ...]:
        with self._lock:
            self._sync()
            return tuple(self._model_snapshot(spec) for spec in self.scenario.models)

    def _model_snapshot(self, spec: ModelSpec) -> ModelSnapshot:
        live = self.live_params(spec)
        fractions = self._fractions(spec, live)
        engines = tuple(self._engine_snapshot(spec, e) for e in self._engines[spec.name])
        return ModelSnapshot(spec=spec, live=live, fractions=fractions, engines=engines)

    def _engine_snapshot(self, spec: ModelSpec, e: _Engine) -> EngineSnapshot:
        drafts, draft_tokens = _exposed_drafts(spec, e)
        per_pos = tuple(exposed(x) for x in e.per_pos)
        v0 = None
        if e.v0_logged:
            acc, draft, emitted, n_drafts = e.v0_lifetime
            v0 = V0Snapshot(
                accepted_total=e.v0_counters[0], draft_total=e.v0_counters[1], emitted_total=e.v0_counters[2],
                acceptance_rate=acc / draft if draft else math.nan,
                efficiency=emitted / (n_drafts * (e.k + 1)) if n_drafts else math.nan,
                lifetime_accepted=acc, lifetime_draft=draft, lifetime_emitted=emitted, reports=e.v0_logged,
            )
        return EngineSnapshot(
            engine=e.index,
            created=self._wall_epoch + e.started_at,
            drafts=drafts,
            draft_tokens=draft_tokens,
            accepted=sum(per_pos),
            per_pos=per_pos,
            generation_tokens=exposed(e.generation),
            prompt_tokens=exposed(e.prompt),
            requests={reason: exposed(v) for reason, v in e.requests.items()},
            running=round(e.running),
            waiting=round(e.waiting),
            kv_cache_usage=round(e.kv_cache_usage, 4),
            histograms={name: h.snapshot() for name, h in e.histograms.items()},
            v0=v0,
            preemptions=exposed(e.preemptions),
            scheduled_steps=tuple(exposed(x) for x in e.scheduled),
            speculating=e.speculating,
            drafted_per_pos=tuple(exposed(x) for x in e.drafted_per_pos),
            verified_draft_tokens=min(exposed(e.verified_draft_tokens), draft_tokens),  # never above the drafted
        )

    def state(self) -> dict[str, Any]:
        """JSON-able view for GET /-/state."""
        snap = self.snapshot()
        with self._lock:
            phase: dict[str, Any] | None = None
            if self.scenario.phases:
                p = self._current_phase()
                phase = {"index": self._phase_index, "name": p.name, "elapsed_seconds": self._phase_time,
                         "duration_seconds": p.duration, "restart": p.restart, "fault": p.fault}
            return {
                "scenario": self.scenario.name,
                "format": self.format,
                "sim_time_seconds": self._now,
                "time_scale": self.time_scale,
                "phase": phase,
                "paused": self._paused,
                "overrides": {k: _jsonable(v) for k, v in self._overrides.items()},
                "fault": self.fault,
                "models": [_model_state(m) for m in snap],
            }


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _model_state(m: ModelSnapshot) -> dict[str, Any]:
    spec = m.spec
    return {
        "name": spec.name,
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "engines": spec.engines,
        "draft_fill": spec.draft_fill,
        "live": {
            "acceptance_rate": effective_acceptance_rate(spec, m.fractions),
            "drafts_per_second": m.live.drafts_per_second,
            "position_acceptance": list(m.live.position_acceptance) if m.live.position_acceptance else None,
            "position_fractions": list(m.fractions),
            "mean_acceptance_length": 1.0 + sum(m.fractions),
        },
        "series": [_engine_state(e) for e in m.engines],
    }


def _engine_state(e: EngineSnapshot) -> dict[str, Any]:
    out: dict[str, Any] = {
        "engine": str(e.engine),
        "created": e.created,
        "drafts": e.drafts,
        "draft_tokens": e.draft_tokens,
        "accepted_tokens": e.accepted,
        "accepted_tokens_per_pos": list(e.per_pos),
        "generation_tokens": e.generation_tokens,
        "prompt_tokens": e.prompt_tokens,
        "requests": dict(e.requests),
        "running": e.running,
        "waiting": e.waiting,
        "kv_cache_usage": e.kv_cache_usage,
        "preemptions": e.preemptions,
        "speculating": e.speculating,
        "scheduled_steps": list(e.scheduled_steps),
    }
    v0 = {} if e.v0 is None else dataclasses.asdict(e.v0)
    out["v0"] = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in v0.items()} or None
    return out
