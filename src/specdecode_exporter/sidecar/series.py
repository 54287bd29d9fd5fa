"""From one series' state to its view: per window, acceptance, latency and capacity; against a baseline, the
observed speedup and the cost that calibrates the model to it; against a control target, what spec decode costs in
memory and throughput; the break-even under load; whether speculation stopped; the batch-size schedule; and the
verdict."""

from __future__ import annotations

import dataclasses
import enum
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from specdecode_exporter.core.config.validation import parse_duration
from specdecode_exporter.core.contract.metrics import MetricSpec
from specdecode_exporter.core.contract.monitoring_config import SpeculationStopped
from specdecode_exporter.core.contract.verdict import Evidence, HeldVerdict, Judgement, judge
from specdecode_exporter.pipeline import latency
from specdecode_exporter.pipeline.capacity import (
    AgainstControl,
    CapacityStats,
    against_control,
    capacity_stats,
    has_capacity,
)
from specdecode_exporter.pipeline.derive import (
    CostModel,
    WindowStats,
    break_even_acceptance,
    has_acceptance,
    lower_bound_ratio,
    recommended_num_speculative_tokens,
    span_stats,
    speedup_by_length,
)
from specdecode_exporter.pipeline.latency import BaselineLatency, Histogram, LatencyStats, ObservedSpeedup
from specdecode_exporter.pipeline.schedule import BatchSchedule, Calibration, LazySchedule
from specdecode_exporter.pipeline.store import (
    NOTHING_DRAFTED_YET,
    STANDSTILL_COLLECTIONS,
    Drafting,
    SeriesKey,
    SeriesState,
    Totals,
    WindowSpan,
    optional_minus,
    positions_minus,
)
from specdecode_exporter.sidecar.config import Config, TargetConfig, Window

# A baseline for a model over a window (the collector knows the control target or the configured figures).
BaselineFor = Callable[[str | None, Window], BaselineLatency | None]
# A control target's capacity for a model over a window, pooled over its engines, and its name in words.
ControlFor = Callable[[str | None, Window], tuple[str, CapacityStats] | None]


class _Unread(enum.Enum):
    UNREAD = 0  # a part of a WindowView not worked out yet (None is a value: "nothing to say")


UNREAD = _Unread.UNREAD


def ago(seconds: float) -> str:
    """A duration as a person says it: 45 s, 12 min, 3 h 5 min, 2 d 4 h."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{seconds:.0f} s"
    if minutes < 60:
        return f"{minutes} min"
    hours = minutes // 60
    return f"{hours} h {minutes % 60} min" if hours < 48 else f"{hours // 24} d {hours % 24} h"


# The wall clock's lead on the monotonic clock the collector runs on, taken once: the times in words a view gives
# (since when) depend only on its collection, not on when it is built or read.
WALL_CLOCK_LEAD = time.time() - time.monotonic()


class Moment(NamedTuple):
    """A collection's time on the collector's clock, and the wall clock's lead on it (to say times in words)."""

    now: float
    wall_offset: float = WALL_CLOCK_LEAD

    def wall(self, at: float) -> float:
        return at + self.wall_offset

    def words(self, at: float) -> str:
        """``at`` (the collector's clock) as a reader says it: 12:03:04 UTC, 40 s ago."""
        return f"{time.strftime('%H:%M:%S', time.gmtime(self.wall(at)))} UTC, {ago(self.now - at)} ago"


CLOCK_START = Moment(0.0)  # a view built outside a collection


class WindowView:
    """One window of one series: acceptance, latency and capacity, and against a baseline and a control target.

    Built for every series × window at every collection, but most of it is read only when the page renders (once
    per scrape) or the status API asks: each part is worked out at its first read and kept. It reads the span and
    the context the collection gave it (the peers' views as published then), so a later read gives what a read at
    the collection would have. Immutable as far as its readers can tell; equal when every part is."""

    __slots__ = (
        "_acceptance",
        "_advice",
        "_against_control",
        "_capacity",
        "_ctx",
        "_k",
        "_latency",
        "_model",
        "_span",
        "window",
    )

    def __init__(self, window: Window, span: WindowSpan, model: str | None, k: int | None,
                 ctx: SeriesContext) -> None:
        self.window = window
        self._span, self._model, self._k, self._ctx = span, model, k, ctx
        self._acceptance: WindowStats | _Unread | None = UNREAD
        self._latency: LatencyStats | _Unread | None = UNREAD
        self._capacity: CapacityStats | _Unread | None = UNREAD
        self._advice: tuple[ObservedSpeedup | None, float | None, int | None] | _Unread = UNREAD
        self._against_control: AgainstControl | _Unread | None = UNREAD

    @property
    def has_acceptance(self) -> bool:
        """``acceptance is not None``, without working it out."""
        known = self._acceptance
        return has_acceptance(self._span) if known is UNREAD else known is not None

    @property
    def acceptance(self) -> WindowStats | None:
        """None without drafts in the window, or without token counters."""
        if self._acceptance is UNREAD:
            self._acceptance = span_stats(self._span, self._ctx.config.cost, self._k)
        return self._acceptance

    @property
    def proposed_token_acceptance_ratio(self) -> float | None:
        """Accepted per proposed token, where α is withheld for want of a verified-token count: a lower bound of α
        (pipeline/derive.py lower_bound_ratio)."""
        return None if self.has_acceptance else lower_bound_ratio(self._span)

    @property
    def has_latency(self) -> bool:
        """``latency is not None``, without working it out."""
        known = self._latency
        return has_latency(self._span) if known is UNREAD else known is not None

    @property
    def latency(self) -> LatencyStats | None:
        """None without latency families."""
        if self._latency is UNREAD:
            self._latency = latency_stats(self._span)
        return self._latency

    @property
    def capacity(self) -> CapacityStats | None:
        """Generation, preemptions, KV cache (None where the source counts none)."""
        if self._capacity is UNREAD:
            self._capacity = capacity_stats(self._span)
        return self._capacity

    @property
    def observed(self) -> ObservedSpeedup | None:
        """Against the baseline, when there is one and requests."""
        return self._advised()[0]

    @property
    def calibrated_cost(self) -> float | None:
        """c = c_draft + c_verify that makes the model match the observed speedup."""
        return self._advised()[1]

    @property
    def recommended_k(self) -> int | None:
        """Under the cost in force: calibrated when there is one, else configured."""
        return self._advised()[2]

    @property
    def break_even_at_load(self) -> float | None:
        """The configured model's break-even at the window's mean running batch."""
        lat = self.latency
        if self.acceptance is None or lat is None or lat.running is None:
            return None
        return break_even_acceptance(self._ctx.config.cost.per_draft_token_at(lat.running))

    @property
    def against_control(self) -> AgainstControl | None:
        """Where a control target is configured and has data."""
        if self._against_control is UNREAD:
            capacity, ctx = self.capacity, self._ctx
            control = ctx.control_for(self._model, self.window) if capacity is not None and ctx.config.spec_decode \
                else None
            self._against_control = (
                against_control(capacity, control[1], control[0], ctx.app.verdict.capacity.min_waiting_requests)
                if capacity is not None and control is not None else None)
        return self._against_control

    def _advised(self) -> tuple[ObservedSpeedup | None, float | None, int | None]:
        if self._advice is UNREAD:
            lat, ctx = self.latency, self._ctx
            baseline = ctx.baseline_for(self._model, self.window) if lat is not None and ctx.config.spec_decode \
                else None
            observed = latency.observed_speedup(baseline, lat) if baseline is not None and lat is not None else None
            self._advice = (observed, *_cost_advice(self.acceptance, observed))
        return self._advice

    PARTS = ("window", "acceptance", "latency", "observed", "calibrated_cost", "break_even_at_load",
             "recommended_k", "capacity", "against_control", "proposed_token_acceptance_ratio")

    def parts(self) -> tuple[object, ...]:
        """Everything it says, worked out."""
        return tuple(getattr(self, name) for name in self.PARTS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WindowView) and self.parts() == other.parts()

    __hash__ = None  # type: ignore[assignment]  # equal by value, mutable caches: not a dict key

    def __repr__(self) -> str:
        return "WindowView(" + ", ".join(f"{n}={v!r}" for n, v in zip(self.PARTS, self.parts(), strict=True)) + ")"


class SeriesAdvice:
    """What a series' windows add up to: the verdict over its verdict window, the calibrated break-even, whether it
    still speculates, and the batch-size schedule. Worked out at the first read, like the windows' parts (a render,
    the status API, `check`, and the collector's verdict hysteresis read them; the windows it reads are the
    collection's). Equal when every part is."""

    __slots__ = ("_computed", "_ctx", "_drafted_ever", "_drafting", "_has_tokens", "_judged", "_judgement",
                 "_no_data", "_schedule", "_speculation")

    def __init__(self, computed: tuple[tuple[WindowView, WindowSpan], ...], judged: WindowView | None,
                 ctx: SeriesContext, has_tokens: bool, drafted_ever: bool, drafting: Drafting = NOTHING_DRAFTED_YET,
                 no_data: str | None = None) -> None:
        self._computed, self._judged, self._ctx = computed, judged, ctx
        self._has_tokens, self._drafted_ever = has_tokens, drafted_ever
        self._drafting, self._no_data = drafting, no_data
        self._judgement: Judgement | _Unread = UNREAD
        self._speculation: Speculation | _Unread | None = UNREAD
        self._schedule: tuple[LazySchedule | None, str | None] | _Unread = UNREAD

    @property
    def evidence(self) -> Evidence:
        """What the verdict is judged on: the verdict window's figures, or why there is nothing to judge."""
        speculation = self.speculation
        stopped = speculation.verdict if speculation is not None and speculation.state == "stopped" else None
        return dataclasses.replace(evidence(self._judged), not_speculating=stopped, no_data=self._no_data)

    @property
    def judgement(self) -> Judgement:
        """This collection's judgement (the one in force, held through the hysteresis, is SeriesView's)."""
        if self._judgement is UNREAD:
            self._judgement = judge(self.evidence, self._ctx.app.verdict)
        return self._judgement

    @property
    def calibrated_break_even(self) -> float | None:
        """From the cost that matches the observed speedup over the verdict window, where there is one."""
        judged = self._judged
        calibrated = judged.calibrated_cost if judged is not None and self._has_tokens else None
        return break_even_acceptance(calibrated) if calibrated is not None else None

    @property
    def speculation(self) -> Speculation | None:
        """None where the source counts no generated tokens (and for a control target's series)."""
        if self._speculation is UNREAD:
            computed = self._computed
            self._speculation = (speculation(tuple(view for view, _ in computed), self._drafted_ever,
                                             self._ctx.app.speculation_stopped, self._drafting, self._ctx.moment,
                                             computed[-1][1].end if computed else None)
                                 if self._ctx.config.spec_decode else None)
        return self._speculation

    @property
    def schedule(self) -> tuple[LazySchedule | None, str | None]:
        """Batch-size advice, worked out when read, and the window it is over."""
        if self._schedule is UNREAD:
            self._schedule = schedule_of(self._computed, self._ctx) if self._ctx.config.spec_decode else (None, None)
        return self._schedule

    def parts(self) -> tuple[object, ...]:
        return self.judgement, self.calibrated_break_even, self.speculation, self.schedule

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SeriesAdvice) and self.parts() == other.parts()

    __hash__ = None  # type: ignore[assignment]  # equal by value, mutable caches: not a dict key

    def __repr__(self) -> str:
        return f"SeriesAdvice{self.parts()!r}"


class SeriesView(NamedTuple):
    key: SeriesKey
    totals: Totals
    histogram: Histogram  # per-interval α (specdecode_interval_acceptance_ratio)
    windows: tuple[WindowView, ...]
    num_speculative_tokens: int | None
    reported: tuple[tuple[MetricSpec, float], ...]  # the engine's own figures, passed through
    restarts: int
    verdict_window: str | None  # the window the judgement is for
    advice: SeriesAdvice  # the judgement, calibrated break-even, speculation and schedule, worked out when read
    method: str | None = None  # from config, else as the source states it (TensorRT-LLM)
    configured_break_even: float | None = None  # the configured cost per drafted token (None without tokens)
    spec_decode: bool = True  # False for a control target's series
    kv_cache_usage: float | None = None  # at the last reading
    held: HeldVerdict | None = None  # the verdict in force, through the hysteresis (the collector keeps it)

    @property
    def judgement(self) -> Judgement:
        """The verdict in force: held through the hysteresis, else (a view nobody held) this collection's."""
        return self.held.judgement if self.held is not None else self.advice.judgement

    @property
    def calibrated_break_even(self) -> float | None:
        return self.advice.calibrated_break_even

    @property
    def speculation(self) -> Speculation | None:
        return self.advice.speculation

    @property
    def schedule_window(self) -> str | None:
        return self.advice.schedule[1]

    def window(self, name: str | None) -> WindowView | None:
        return next((w for w in self.windows if w.window.name == name), None)

    @property
    def schedule(self) -> BatchSchedule | None:
        lazy = self.advice.schedule[0]
        return lazy.get() if lazy is not None else None

    @property
    def break_even(self) -> float | None:
        """The break-even α in force: calibrated where a baseline gives one, else configured."""
        return self.calibrated_break_even if self.calibrated_break_even is not None else self.configured_break_even

    @property
    def cost_basis(self) -> str:
        return "calibrated" if self.calibrated_break_even is not None else "configured"

    @property
    def cost_basis_words(self) -> str:
        return COST_BASIS_WORDS[self.cost_basis]


# What the break-even α in force is based on, as the status page, /api/v1/status and `check` say it.
COST_BASIS_WORDS = {
    "configured": "from the configured cost model (c_draft + c_verify per drafted token); no measured speedup "
                  "calibrates it",
    "calibrated": "calibrated: the cost per drafted token at which the modelled speedup matches the speedup "
                  "measured against the baseline",
}


@dataclass(frozen=True)
class SeriesContext:
    """What every series of one target is viewed with."""

    config: TargetConfig
    app: Config
    slack: float  # a snapshot this much before a window's start may open it
    baseline_for: BaselineFor
    control_for: ControlFor = lambda model, window: None
    moment: Moment = CLOCK_START  # when the collection viewed it


def has_latency(span: WindowSpan) -> bool:
    """Whether latency_stats has something to say of the span, without working it out."""
    start, end = span.start, span.end
    return (latency.defined(start.time_per_output_token, end.time_per_output_token)
            or latency.defined(start.time_to_first_token, end.time_to_first_token)
            or (end.running_seconds is not None and start.running_seconds is not None))


def latency_stats(span: WindowSpan) -> LatencyStats | None:
    if not has_latency(span):
        return None
    start, end = span.start, span.end
    tpot = latency.Change.between(start.time_per_output_token, end.time_per_output_token)
    ttft = latency.Change.between(start.time_to_first_token, end.time_to_first_token)
    running = optional_minus(end.running_seconds, start.running_seconds)
    waiting = optional_minus(end.waiting_seconds, start.waiting_seconds)
    seconds = span.seconds
    return LatencyStats(tpot, ttft, running / seconds if running is not None and seconds > 0 else None,
                        waiting / seconds if waiting is not None and seconds > 0 else None)


def _cost_advice(stats: WindowStats | None, observed: ObservedSpeedup | None
                 ) -> tuple[float | None, int | None]:
    """The calibrated cost and the k it recommends, where a baseline makes calibration possible."""
    if stats is None or observed is None:
        return None, None if stats is None else stats.recommended_num_speculative_tokens
    cost = latency.calibrated_cost(observed.mean, stats.mean_acceptance_length, stats.mean_draft_length)
    if cost is None:
        return None, stats.recommended_num_speculative_tokens
    speedups = speedup_by_length(stats.position_acceptance_ratios, CostModel(c_draft=0.0, c_verify=cost))
    return cost, recommended_num_speculative_tokens(speedups) if speedups else None


def window_view(window: Window, span: WindowSpan, model: str | None, k: int | None,
                ctx: SeriesContext) -> WindowView | None:
    """The window's view; None where the span says nothing of acceptance, latency or capacity."""
    if not (has_acceptance(span) or has_latency(span) or has_capacity(span) or lower_bound_ratio(span) is not None):
        return None
    return WindowView(window, span, model, k, ctx)


@functools.cache
def _seconds(duration: str) -> float:
    return parse_duration(duration, "windows.verdict")


def verdict_window(windows: tuple[WindowView, ...], wanted_seconds: float) -> WindowView | None:
    """The window a verdict is given for: the first with acceptance data that is at least as long as the
    configured one (monitoring config windows.verdict), else the longest with acceptance data."""
    with_data = [w for w in windows if w.has_acceptance]
    return next((w for w in with_data if w.window.seconds >= wanted_seconds), with_data[-1] if with_data else None)


def evidence(view: WindowView | None) -> Evidence:
    if view is None or view.acceptance is None:
        return Evidence(None, None)
    stats, observed, versus = view.acceptance, view.observed, view.against_control
    costs = ((versus.preemptions_per_request_increase, versus.throughput_ratio) if versus is not None
             else (None, None))
    if observed is None or observed.mean is None:
        return Evidence(stats.acceptance_ratio, stats.expected_speedup, None, None, None, None, *costs)
    return Evidence(stats.acceptance_ratio, stats.expected_speedup, observed.mean, observed.p50, observed.p99,
                    observed.baseline, *costs)


# A standstill of the drafted-token counter proves a stop only where the drafting before it would have drafted at
# least this many tokens over the tokens generated since (a Poisson count of 10 is 0 with probability 5e-5).
MIN_EXPECTED_DRAFT_TOKENS = 10.0
CONFIGURED_CUT_OFF = ("a batch-size cut-off the deployment configured (vLLM's --speculative-disable-by-batch-size, or "
                      "a batch-size schedule at k = 0: vLLM's num_speculative_tokens_per_batch_size, TensorRT-LLM's "
                      "draft_len_schedule), not a fault")
UNEXPLAINED_STOP = ("nothing on the engine's page shows it configured; causes: an acceptance gate (TensorRT-LLM "
                    "switches speculation off for good once the mean acceptance rate over acceptance_rate_window_size "
                    "iterations is below acceptance_rate_threshold), a drafter that finds nothing "
                    "(ngram), a batch-size schedule at k = 0 on a page without the running batch (TensorRT-LLM's "
                    "draft_len_schedule), or a config change")


class Speculation(NamedTuple):
    """Whether a series still speculates, in words (status page, `check`, /api/v1/status, the verdict)."""

    state: str  # "speculating", "stopped" (it drafted before, generates now without), "too little traffic"
    window: str
    share: float | None  # the speculative token share over the window
    reason: str
    since: float | None = None  # stopped: the last collection that counted drafted tokens; speculating: resumed
    configured: bool | None = None  # stopped: whether the engine's page shows the stop configured (a cut-off)
    verdict: str | None = None  # stopped: the verdict's reason ("not speculating" + "since …: …")


class Stop(NamedTuple):
    """A standstill of the drafted-token counter long and large enough to say speculation stopped."""

    since: float | None  # the last collection that counted drafted tokens (None: none since the sidecar started)
    collections: int  # collections since then that counted generated tokens and no drafted one
    configured: str | None  # how the engine's page shows it configured, in words; None: it does not


def stop_of(drafting: Drafting, latest: Totals, window_steps: tuple[float, ...]) -> Stop | None:
    """The stop the drafted-token counter's standstill proves, and whether the engine's page shows it configured;
    None while it drafts, or before the standstill proves anything."""
    if drafting.idle < STANDSTILL_COLLECTIONS:
        return None
    before = drafting.at_last or latest
    per_generated = (before.draft_tokens if before.draft_tokens is not None else before.drafts) or 0.0
    if before.generated_tokens and drafting.idle_generated * per_generated / before.generated_tokens \
            < MIN_EXPECTED_DRAFT_TOKENS:
        return None
    return Stop(drafting.last_at, drafting.idle, configured_stop(drafting, latest, window_steps))


def configured_stop(drafting: Drafting, latest: Totals, window_steps: tuple[float, ...]) -> str | None:
    """How the engine's page shows a stop configured, in words: the scheduled-steps counter at k = 0 since drafting
    stopped (else over the window), or a running batch above every one it drafted at; None where it does not."""
    steps = positions_minus(latest.scheduled_steps, drafting.at_last.scheduled_steps) if drafting.at_last \
        else window_steps
    if steps and sum(steps) > 0 and steps[0] / sum(steps) >= 0.5:
        return (f"the batch-size schedule chose k = 0 for {steps[0] / sum(steps):.0%} of the scheduler steps "
                "since it stopped (vLLM's num_speculative_tokens_per_batch_size, configured at this batch size): "
                "not a fault")
    if (drafting.idle_running is not None and drafting.drafting_running is not None
            and drafting.idle_running > drafting.drafting_running):
        return (f"it stopped drafting when the running batch rose to {drafting.idle_running:.0f} requests (it "
                f"drafted at up to {drafting.drafting_running:.0f}): {CONFIGURED_CUT_OFF}")
    return None


def speculation(windows: tuple[WindowView, ...], drafted_ever: bool, settings: SpeculationStopped,
                drafting: Drafting = NOTHING_DRAFTED_YET, moment: Moment = CLOCK_START, latest: Totals | None = None
                ) -> Speculation | None:
    """Stopped as soon as the drafted-token counter stands still at STANDSTILL_COLLECTIONS collections in a row
    that generated (a series that drafted before), for as long as it does; speculating from the first collection
    that drafts. Else, over the shortest window that counted generated tokens: too little traffic to tell, or
    stopped where its speculative token share is below share_below and the last collection drafted nothing (a
    standstill too short to prove a stop: `check`, a sidecar just started), else speculating."""
    view = next((w for w in windows if w.capacity is not None and w.capacity.generated_tokens is not None), None)
    if view is None or view.capacity is None or not drafted_ever:
        return None
    capacity = view.capacity
    rate = capacity.generated_tokens_per_second or 0.0
    share = capacity.speculative_token_share
    if share is None and capacity.draft_tokens == 0:
        share = 0.0  # a source without an emitted-token count that drafted nothing while it generated
    name = view.window.name
    stop = stop_of(drafting, latest, capacity.scheduled_steps) if latest is not None else None
    if stop is not None:
        return _stopped(stop, view, share, moment)
    if rate < settings.min_generated_tokens_per_second:
        return Speculation("too little traffic", name, share, f"{rate:.1f} generated tokens/s over {name}: too "
                           "little to tell whether it speculates")
    if share is not None and share < settings.share_below and drafting.idle and latest is not None:
        # Too short a standstill to prove a stop (`check`, a sidecar just started), but the window shows one, as
        # SpecDecodeSpeculationStopped does.
        return _stopped(Stop(drafting.last_at, drafting.idle, configured_stop(drafting, latest,
                                                                                capacity.scheduled_steps)),
                        view, share, moment)
    again = drafting.resumed_at if drafting.resumed_at is not None and \
        moment.now - drafting.resumed_at <= view.window.seconds else None
    stopped_for = again - drafting.stopped_at if again is not None and drafting.stopped_at is not None else None
    resumed = "" if again is None else (f"speculating again since {moment.words(again)}"
                                        f"{f', after {ago(stopped_for)} without drafting' if stopped_for else ''}; ")
    if share is None:  # no emitted tokens to weigh the drafts with
        return None if capacity.draft_tokens is None else Speculation(
            "speculating", name, None, f"{resumed}drafting over {name} ({rate:.0f} generated tokens/s)", again)
    return Speculation("speculating", name, share, f"{resumed}speculative steps produced {share:.0%} of {rate:.0f} "
                       f"generated tokens/s over {name}", again)


def _stopped(stop: Stop, view: WindowView, share: float | None, moment: Moment) -> Speculation:
    capacity, name = view.capacity, view.window.name
    rate = (capacity.generated_tokens_per_second if capacity is not None else None) or 0.0
    when = f"since {moment.words(stop.since)}" if stop.since is not None else "since before the first collection"
    cause = stop.configured or UNEXPLAINED_STOP
    last = "the last collection" if stop.collections == 1 else f"the last {stop.collections} collections"
    reason = (f"stopped speculating {when}: {rate:.0f} generated tokens/s over {name} and none drafted at {last}, "
              f"though it drafted before; {cause}")
    verdict = (f"{when}: it generates without drafting, so nothing is judged; "
               f"{stop.configured or 'the engine shows no configured cause'}")
    return Speculation("stopped", name, share, reason, stop.since, stop.configured is not None, verdict)


def schedule_of(views: tuple[tuple[WindowView, WindowSpan], ...], ctx: SeriesContext
                ) -> tuple[LazySchedule | None, str | None]:
    """The batch-size schedule over the longest window with a per-position curve and running-batch data."""
    for view, span in reversed(views):
        stats, lat = view.acceptance, view.latency
        if stats is None or not stats.position_acceptance_ratios or lat is None or lat.running is None:
            continue
        calibration = (Calibration(view.calibrated_cost, lat.running) if view.calibrated_cost is not None
                       else None)
        return LazySchedule(span.start.batch_bins, span.end.batch_bins, stats.position_acceptance_ratios,
                            ctx.config.cost, calibration), view.window.name
    return None, None


def series_view(state: SeriesState, now: float, no_data: str | None, ctx: SeriesContext) -> SeriesView:
    """The series' view at ``now``; ``no_data``: why its windows are stale (they are then left out), in words."""
    reading, config = state.last_reading, ctx.config
    k = config.num_speculative_tokens or (reading.num_speculative_tokens if reading else None)
    computed: list[tuple[WindowView, WindowSpan]] = []
    if no_data is None:
        for window in ctx.app.windows:
            span = state.window_span(now, window.seconds, ctx.slack)
            view = window_view(window, span, state.key.model_name, k, ctx) if span else None
            if view is not None and span is not None:
                computed.append((view, span))
    windows = tuple(view for view, _ in computed)
    judged = verdict_window(windows, _seconds(ctx.app.verdict_window))
    has_tokens = state.totals.draft_tokens is not None
    return SeriesView(
        state.key, state.totals, state.histogram, windows, k, reading.reported if reading else (), state.restarts,
        judged.window.name if judged else None,
        SeriesAdvice(tuple(computed), judged, ctx, has_tokens, bool(state.totals.draft_tokens), state.drafting,
                     no_data),
        config.method or (reading.method if reading else None),
        config.cost.break_even_acceptance_ratio if has_tokens else None,
        config.spec_decode,
        reading.latency.kv_cache_usage if reading is not None and reading.latency is not None else None,
    )
