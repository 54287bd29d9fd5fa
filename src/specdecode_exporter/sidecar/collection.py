"""The collection loop: per target, fetch → select → detect engine → decode → store → derive → view.

After each collection the loop publishes an immutable TargetView; /metrics and the status pages only
read the latest views, so serving never waits on a collection and never sees a half-updated state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar
from urllib.parse import urlsplit

import certifi
import httpx

from specdecode_exporter.core.contract.failure import FailureReason
from specdecode_exporter.core.contract.verdict import HeldVerdict, hold
from specdecode_exporter.core.process.log import event
from specdecode_exporter.pipeline import capacity, latency
from specdecode_exporter.pipeline.capacity import CapacityStats
from specdecode_exporter.pipeline.engines import (
    ALL_PREFIXES,
    Decoder,
    DecodeResult,
    DecoderOptions,
    Engine,
    FetchTiming,
    detect_engine,
    no_engine_detail,
    vllm_v1,
)
from specdecode_exporter.pipeline.latency import BaselineLatency
from specdecode_exporter.pipeline.parse import LineCache, ParseError, Sample, Selection, select
from specdecode_exporter.pipeline.scrape import FetchResult, fetch, http_client, valid_bearer_token
from specdecode_exporter.pipeline.store import SeriesKey, Store
from specdecode_exporter.sidecar.config import Config, TargetConfig, Window
from specdecode_exporter.sidecar.discover import served_model
from specdecode_exporter.sidecar.series import (
    BaselineFor,
    ControlFor,
    Moment,
    SeriesContext,
    SeriesView,
    WindowView,
    series_view,
)

LOG_REPEAT_SECONDS = 60.0
# Failed collections in a row through which a target's windowed figures are kept: one timed-out collection leaves
# every gauge in place (a scrape that found one missing would reset the `for:` of the tickets that read it), the
# second in a row drops them, as exporters do for targets they cannot read. Counters and specdecode_up stay.
WINDOW_GRACE_FAILURES = 1
HISTORY_SECONDS = 3600.0  # what the status page's charts show
HISTORY_STEP_SECONDS = 30.0


class HistoryPoint(NamedTuple):
    """A series over its shortest window with data, at one moment (the collector's clock): for the charts."""

    at: float
    acceptance_ratio: float | None
    tpot_mean: float | None
    observed_speedup: float | None
    expected_speedup: float | None = None  # modelled, charted beside the observed one


class PendingPoint:
    """A series' newest history point, its values worked out at the first read: every collection makes one, but
    only the status page reads the newest, and only one a step (HISTORY_STEP_SECONDS) is kept (then worked out)."""

    __slots__ = ("_point", "_window", "at")

    def __init__(self, at: float, window: WindowView) -> None:
        self.at, self._window = at, window
        self._point: HistoryPoint | None = None

    def point(self) -> HistoryPoint:
        if self._point is None:
            view = self._window
            acceptance, latency_stats = view.acceptance, view.latency
            self._point = HistoryPoint(self.at, acceptance.acceptance_ratio if acceptance else None,
                                       latency_stats.tpot_mean if latency_stats else None,
                                       view.observed.mean if view.observed else None,
                                       acceptance.expected_speedup if acceptance else None)
        return self._point


def history_window(series: SeriesView) -> WindowView | None:
    """The window the charts follow: the shortest with acceptance or latency figures (checked without working
    them out); None when there is none (no point this time)."""
    return next((w for w in series.windows if w.has_acceptance or w.has_latency), None)


class Timed(Protocol):
    @property
    def at(self) -> float: ...


P = TypeVar("P", bound=Timed)


def extended(points: tuple[P, ...], point: P) -> tuple[P, ...]:
    """The history with one more point: about one per step, none older than HISTORY_SECONDS, and always the
    latest (it replaces the previous latest until a step has passed since the point before), so a chart reaches
    up to now. Immutable: the status page (another thread) may be reading the previous tuple."""
    if len(points) >= 2 and point.at - points[-2].at < HISTORY_STEP_SECONDS:
        points = points[:-1]
    first = 0  # points are in time order: only the oldest can have expired (no pass over all, per series)
    while first < len(points) and point.at - points[first].at > HISTORY_SECONDS:
        first += 1
    return (*points[first:], point)


class History(Mapping[SeriesKey, tuple[HistoryPoint, ...]]):
    """Each series' history as a view publishes it: the points kept, and the newest worked out when first read."""

    __slots__ = ("_points", "_read")

    def __init__(self, points: dict[SeriesKey, tuple[HistoryPoint | PendingPoint, ...]]) -> None:
        self._points = points
        self._read: dict[SeriesKey, tuple[HistoryPoint, ...]] = {}

    def __getitem__(self, key: SeriesKey) -> tuple[HistoryPoint, ...]:
        read = self._read.get(key)
        if read is None:
            read = self._read[key] = tuple(p.point() if isinstance(p, PendingPoint) else p for p in self._points[key])
        return read

    def __iter__(self) -> Iterator[SeriesKey]:
        return iter(self._points)

    def __len__(self) -> int:
        return len(self._points)


@dataclass(frozen=True, slots=True)
class TargetView:
    config: TargetConfig
    up: bool
    collect_duration: float | None
    errors: tuple[tuple[str, int], ...]
    api: str | None
    series: tuple[SeriesView, ...]
    dropped_series: int
    interval: float
    last_success_wall: float | None = None
    last_error: str | None = None
    last_success_monotonic: float | None = None
    history: Mapping[SeriesKey, tuple[HistoryPoint, ...]] = field(default_factory=dict)
    failed_in_a_row: int = 0  # collections that failed since the last success

    @property
    def windows_stale(self) -> bool:
        """Whether its windowed figures went stale: more failed collections in a row than the grace."""
        return self.failed_in_a_row > WINDOW_GRACE_FAILURES

    @property
    def method(self) -> str:
        return self.config.method or next((s.method for s in self.series if s.method), None) or "unknown"


class ModelNameNeeded(Exception):
    """The engine's metrics name no model and none is known yet: look it up, then ingest again."""


class CollectionFailure(Exception):
    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def body_text(result: FetchResult) -> str:
    """Decode and sanity-check a fetched body; raises CollectionFailure(parse)."""
    assert result.body is not None
    if "html" in result.content_type.lower():
        raise CollectionFailure(FailureReason.PARSE, f"got {result.content_type}, not a metrics exposition")
    try:
        return result.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CollectionFailure(FailureReason.PARSE, f"body is not UTF-8 (byte {exc.start})") from None


def control_baseline(view: TargetView, model: str | None, window: Window) -> BaselineLatency | None:
    """A control target's TPOT for ``model`` over ``window``, pooled over its engines. A control serving one
    model is the baseline of that model whatever its served name."""
    models = {s.key.model_name for s in view.series}
    series = [s for s in view.series if s.key.model_name == model or len(models) == 1]
    windows = [s.window(window.name) for s in series]
    histograms = [w.latency.time_per_output_token for w in windows
                  if w is not None and w.latency is not None and w.latency.time_per_output_token is not None]
    tpot = latency.pooled(histograms)
    if tpot is None or latency.mean(tpot) is None:
        return None
    return BaselineLatency(latency.mean(tpot), latency.quantile(0.5, tpot), latency.quantile(0.99, tpot),
                           f'the control target "{view.config.name}"')  # reads well whatever the name


def baseline_provider(config: TargetConfig, peer_view: Callable[[str], TargetView | None]) -> BaselineFor:
    """What the target's series are compared with: its configured baseline, as a function of model and window."""
    baseline = config.baseline
    if baseline is None:
        return lambda model, window: None
    if baseline.target is not None:
        control = baseline.target

        def from_control(model: str | None, window: Window) -> BaselineLatency | None:
            view = peer_view(control)
            return control_baseline(view, model, window) if view is not None else None

        return from_control
    measured = BaselineLatency(baseline.time_per_output_token_seconds, baseline.p50, baseline.p99,
                               "the measured baseline")
    return lambda model, window: measured


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """What a reload changed for one target."""

    changed: bool
    new_source: bool  # the URL changed: its state started afresh
    reconnect: bool  # the URL or TLS settings changed: its loop needs a new client


def control_capacity(view: TargetView, model: str | None, window: Window) -> tuple[str, CapacityStats] | None:
    """A control target's generation, preemptions and KV usage for ``model`` over ``window``, its engines pooled
    (as control_baseline picks its series)."""
    models = {s.key.model_name for s in view.series}
    windows = [s.window(window.name) for s in view.series if s.key.model_name == model or len(models) == 1]
    stats = capacity.pooled([w.capacity for w in windows if w is not None and w.capacity is not None])
    return None if stats is None else (f'the control target "{view.config.name}"', stats)


def control_provider(config: TargetConfig, peer_view: Callable[[str], TargetView | None]) -> ControlFor:
    """The control target's capacity, where the target's baseline is one."""
    control = config.baseline.target if config.baseline is not None else None
    if control is None:
        return lambda model, window: None

    def from_control(model: str | None, window: Window) -> tuple[str, CapacityStats] | None:
        view = peer_view(control)
        return control_capacity(view, model, window) if view is not None else None

    return from_control


@dataclass
class TargetCollector:
    config: TargetConfig
    app: Config
    store: Store
    clock: Callable[[], float] = time.monotonic
    engine: Engine | None = None
    decoder: Decoder | None = None
    decoder_options: DecoderOptions | None = None
    discovered_model: str | None = None
    next_model_lookup: float = float("-inf")
    line_cache: LineCache = field(default_factory=LineCache)
    errors: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in FailureReason})
    last_failure: tuple[str, str] | None = None
    last_failure_logged: float = float("-inf")
    last_success_wall: float | None = None
    last_success_monotonic: float | None = None
    peer_view: Callable[[str], TargetView | None] = lambda name: None  # another target's latest view
    # Each series' history: the points kept, then the newest (pending: worked out when read or kept).
    history: dict[SeriesKey, tuple[HistoryPoint | PendingPoint, ...]] = field(default_factory=dict)
    failed_in_a_row: int = 0  # collections that failed since the last success
    verdicts: dict[SeriesKey, HeldVerdict] = field(default_factory=dict)  # each series' verdict in force
    _published: TargetView | None = field(default=None, init=False)

    @property
    def view(self) -> TargetView | None:
        """The latest published view; None before the first collection."""
        return self._published

    def latest(self) -> TargetView:
        """The latest view, or a down one that says no collection has run yet."""
        if self._published is not None:
            return self._published
        return TargetView(self.config, False, None, tuple(self.errors.items()), None, (), 0, self.interval,
                          last_error="no collection yet")

    def unready_reason(self, now: float) -> str | None:
        """Why this target is not ready (no success within three intervals), or None when it is."""
        last = self.last_success_monotonic
        if last is None:
            return f"target {self.config.name}: no successful collection yet"
        if now - last > max(3 * self.interval, self.interval + self.config.timeout):
            return f"target {self.config.name}: last success {now - last:.0f}s ago"
        return None

    @property
    def interval(self) -> float:
        limit = self.engine.max_collect_interval if self.engine else None
        return min(self.app.collect.interval, limit) if limit else self.app.collect.interval

    def _bearer_token(self) -> str | None:
        path = self.config.bearer_token_file
        if not path:
            return None
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8"
            raise CollectionFailure(FailureReason.CONNECT, f"cannot read bearer_token_file: {reason}") from None
        if not valid_bearer_token(token):  # never echo the token itself
            raise CollectionFailure(FailureReason.CONNECT, "bearer_token_file: empty, or characters not allowed "
                                    "in an HTTP header")
        return token

    async def collect(self, client: httpx.AsyncClient) -> TargetView:
        started = time.perf_counter()  # durations are real time even when tests drive a fake clock
        try:
            result = await fetch(client, self.config.url, self.config.timeout, self.app.collect.max_body_size,
                                 self._bearer_token(), self.clock,
                                 sni_hostname=self.config.tls.server_name if self.config.tls else None)
            if result.failure is not None:
                raise CollectionFailure(result.failure, result.detail)
            text, selection = self.selected(result)
            try:
                decoded = self.decode_selection(text, selection, result)
            except ModelNameNeeded:
                await self._discover_model(client)
                decoded = self.decode_selection(text, selection, result)
            self.store_decoded(decoded)
        except CollectionFailure as failure:
            return self.fail(failure, time.perf_counter() - started)
        except Exception as exc:  # a bug must not stop this target's loop; say so loudly, keep going
            event(logging.ERROR, "collection crashed", target=self.config.name, error=type(exc).__name__,
                  detail=str(exc)[:200])
            crash = CollectionFailure(FailureReason.PARSE, f"internal error {type(exc).__name__}")
            return self.fail(crash, time.perf_counter() - started)
        self._recovered()
        self.last_success_wall = time.time()
        self.last_success_monotonic = self.clock()
        return self.publish(up=True, duration=time.perf_counter() - started)

    def ingest(self, result: FetchResult) -> None:
        """A fetched body into the store: select, decode, update. Raises CollectionFailure, or ModelNameNeeded
        when the series need a model name nobody has looked up yet (see looked_up_model)."""
        self.store_decoded(self.decoded(result))

    def decoded(self, result: FetchResult) -> DecodeResult:
        """A fetched body's series: select, decode (raises as ingest does)."""
        return self.decode_selection(*self.selected(result), result)

    def selected(self, result: FetchResult) -> tuple[str, Selection]:
        """A fetched body's text and the lines of the engine it speaks (raises CollectionFailure)."""
        text = body_text(result)
        try:
            # Only the known engine's lines: each other dialect's prefixes would cost one more pass over the text.
            return text, select(text, self.engine.prefixes if self.engine else ALL_PREFIXES, self.line_cache)
        except ParseError as exc:
            raise CollectionFailure(FailureReason.PARSE, str(exc)) from None

    def decode_selection(self, text: str, selection: Selection, result: FetchResult) -> DecodeResult:
        """The series of a body's selected lines (raises as ingest does)."""
        try:
            # Same lines as last time: same engine, and the decoder needs no parsing.
            decoded = self.decoder.decode_known(selection, result.timing) if self.decoder else None
            if decoded is None:
                if self.engine is not None and not self._still_speaks(self.engine, selection.samples()):
                    selection = select(text, ALL_PREFIXES, self.line_cache)  # the target changed dialect
                decoded = self.decode(selection, result.timing)
        except ParseError as exc:
            raise CollectionFailure(FailureReason.PARSE, str(exc)) from None
        if decoded.unreadable is not None:
            raise CollectionFailure(FailureReason.NO_SPEC_METRICS, decoded.unreadable)
        return decoded

    def store_decoded(self, decoded: DecodeResult) -> None:
        for warning in decoded.warnings:
            event(logging.DEBUG, "series not decodable this time", target=self.config.name, detail=warning)
        self.store.update(self.config.name, decoded.series, decoded.pending, self.clock())

    def _options(self, engine: Engine) -> DecoderOptions:
        """What the decoder is told: k from config, and the model name where the exposition has none (from
        config, else the server's /v1/models: ModelNameNeeded asks collect() to look it up, at most once a
        minute until it answers)."""
        model = self.config.model_name or self.discovered_model
        if model is None and not engine.labels_model and self.clock() >= self.next_model_lookup:
            raise ModelNameNeeded()
        return DecoderOptions(num_speculative_tokens=self.config.num_speculative_tokens,
                              model_name=model if not engine.labels_model else None,
                              adaptive_verification=self.config.adaptive_verification)

    async def _discover_model(self, client: httpx.AsyncClient) -> None:
        model, detail = await served_model(client, self.config.url, self.config.timeout, self._bearer_token(),
                                           self.clock, self.config.tls.server_name if self.config.tls else None)
        if model is None:
            event(logging.WARNING, "model name unknown: the metrics have no model label", target=self.config.name,
                  detail=detail, hint="set model_name on the target")
        self.looked_up_model(model)

    def looked_up_model(self, model: str | None) -> None:
        """What the server's model list said (None: nothing usable); the next lookup waits a minute."""
        self.next_model_lookup = self.clock() + LOG_REPEAT_SECONDS
        self.discovered_model = model

    def _still_speaks(self, engine: Engine, samples: Sequence[Sample]) -> bool:
        if engine.detect(samples):
            return True
        return engine is vllm_v1.ENGINE and not self.config.spec_decode and vllm_v1.ENGINE.detect_latency(samples)

    def decode(self, selection: Selection, timing: FetchTiming) -> DecodeResult:
        """Decode by the engine the lines show, with a new decoder when the engine or its options changed."""
        samples = selection.samples()
        engine = detect_engine(samples)
        if engine is None and not self.config.spec_decode:  # a control target: its latency is what is wanted
            if not vllm_v1.ENGINE.detect_latency(samples):
                raise CollectionFailure(FailureReason.NO_LATENCY_METRICS,
                                        "a control target (spec_decode: false) without vLLM's latency histograms")
            engine = vllm_v1.ENGINE
        if engine is None:
            raise CollectionFailure(FailureReason.NO_SPEC_METRICS, no_engine_detail(samples))
        options = self._options(engine)
        if engine is not self.engine or self.decoder is None or options != self.decoder_options:
            if self.engine is not None and engine is not self.engine:
                event(logging.WARNING, "target changed metrics dialect", target=self.config.name,
                      old_api=self.engine.api, new_api=engine.api)
            self.engine, self.decoder, self.decoder_options = engine, engine.new_decoder(options), options
        return self.decoder.decode(selection, timing)

    def fail(self, failure: CollectionFailure, duration: float) -> TargetView:
        """Count and log a failed collection, expire what went stale, and publish a down view."""
        self.errors[failure.reason.value] += 1
        self.failed_in_a_row += 1
        now = self.clock()
        signature = (failure.reason.value, failure.detail)
        if signature != self.last_failure or now - self.last_failure_logged >= LOG_REPEAT_SECONDS:
            event(logging.WARNING, "collection failed", target=self.config.name, url=self.config.url,
                  reason=failure.reason.value, detail=failure.detail)
            self.last_failure_logged = now
        self.last_failure = signature
        self.store.expire(self.config.name, now)
        return self.publish(up=False, duration=duration, error=f"{failure.reason.value}: {failure.detail}")

    def _recovered(self) -> None:
        self.failed_in_a_row = 0
        if self.last_failure is not None:
            event(logging.INFO, "collection recovered", target=self.config.name,
                  api=self.engine.api if self.engine else None)
            self.last_failure = None
            self.last_failure_logged = float("-inf")

    def publish(self, up: bool, duration: float, error: str | None = None) -> TargetView:
        """Build the view from the store under the config in force and make it the latest one."""
        self._published = self._view(up, duration, error)
        return self._published

    def republish(self) -> None:
        """The latest view again, from the store under the config in force now (after a reload)."""
        view = self._published
        if view is not None:
            self.publish(up=view.up, duration=view.collect_duration or 0.0, error=view.last_error)

    def reconfigure(self, target: TargetConfig, app: Config) -> Reconfigured:
        """Switch to a reloaded config. A new URL is a new source: its series and engine start afresh. New verdict
        bands or window are a real change: the verdict in force is dropped, not held through the hysteresis."""
        if (self.app.verdict, self.app.verdict_window) != (app.verdict, app.verdict_window):
            self.verdicts = {}
        self.app = app
        previous, self.config = self.config, target
        if previous == target:
            return Reconfigured(changed=False, new_source=False, reconnect=False)
        new_source = previous.url != target.url
        if new_source:
            self.store.drop_target(target.name)
            self.engine = self.decoder = None
            self.discovered_model = None
            self.next_model_lookup = float("-inf")
        elif (previous.model_name, previous.adaptive_verification) != (target.model_name, target.adaptive_verification):
            # The decoder names the series (llama.cpp) or withholds the drafted tokens (vLLM's adaptive
            # verification): a new one, from the slow path, which builds it from the options.
            self.decoder = None
        return Reconfigured(changed=True, new_source=new_source,
                            reconnect=(previous.url, previous.tls) != (target.url, target.tls))

    def _view(self, up: bool, duration: float, error: str | None) -> TargetView:
        now = self.clock()
        return self._assembled(now, tuple(self._series_views(now)), up, duration, error)

    def _series_views(self, now: float) -> Iterator[SeriesView]:
        """Each series' view at ``now``."""
        interval = self.interval
        peers = self._peers_as_now()
        moment = Moment(now)
        context = SeriesContext(self.config, self.app, interval / 2, baseline_provider(self.config, peers),
                                control_provider(self.config, peers), moment)
        for state in self.store.for_target(self.config.name):
            yield series_view(state, now, self._no_data(state.times, moment), context)

    def _no_data(self, times: list[float], moment: Moment) -> str | None:
        """Since when and why a series' windows are stale, in words (the "no data" verdict's reason); None while they
        are not: within WINDOW_GRACE_FAILURES failed collections in a row, and the series in a collection within two
        intervals and a timeout."""
        if not times:
            return "not collected yet"
        late = moment.now - times[-1] > 2 * self.interval + self.config.timeout
        if self.failed_in_a_row > WINDOW_GRACE_FAILURES or (late and self.failed_in_a_row):
            failure, count = self.last_failure[0] if self.last_failure else "unknown", self.failed_in_a_row
            failed = f"the last {count} collections" if count > 1 else "the last collection"
            return f"since {moment.words(self.last_success_monotonic or times[-1])}: {failed} failed ({failure})"
        if late:
            return f"since {moment.words(times[-1])}: the series was missing from the latest collections"
        return None

    def _peers_as_now(self) -> Callable[[str], TargetView | None]:
        """The peers' views as published now: a window view worked out later (its parts are, at their first
        read) reads what this collection saw, not a newer collection of the control target."""
        control = self.config.baseline.target if self.config.baseline is not None else None
        view = self.peer_view(control) if control is not None else None
        return lambda name: view if name == control else None

    def _assembled(self, now: float, series: tuple[SeriesView, ...], up: bool, duration: float,
                   error: str | None) -> TargetView:
        series = self._held(now, series)
        self._remember(now, series)
        return TargetView(
            config=self.config,
            up=up,
            collect_duration=duration,
            errors=tuple(self.errors.items()),
            api=self.engine.api if self.engine else None,
            series=series,
            dropped_series=self.store.dropped_series.get(self.config.name, 0),
            interval=self.interval,
            last_success_wall=self.last_success_wall,
            last_error=error,
            last_success_monotonic=self.last_success_monotonic,
            history=History(dict(self.history)),
            failed_in_a_row=self.failed_in_a_row,
        )

    def _held(self, now: float, series: tuple[SeriesView, ...]) -> tuple[SeriesView, ...]:
        """Each series with its verdict in force after this collection's judgement (core.contract.verdict.hold)."""
        bands, before = self.app.verdict, self.verdicts
        self.verdicts = {view.key: hold(before.get(view.key), view.advice.evidence, bands, now) for view in series}
        return tuple(view._replace(held=self.verdicts[view.key]) for view in series)

    def _remember(self, now: float, series: tuple[SeriesView, ...]) -> None:
        live = {s.key for s in series}
        for key in [k for k in self.history if k not in live]:
            del self.history[key]
        for view in series:
            window = history_window(view)
            if window is not None:
                points = extended(self.history.get(view.key, ()), PendingPoint(now, window))
                kept = points[-2] if len(points) >= 2 else None
                if isinstance(kept, PendingPoint):  # kept from now on: its values now, its window let go
                    points = (*points[:-2], kept.point(), points[-1])
                self.history[view.key] = points


def store_limits(config: Config) -> tuple[float, float, int]:
    """The store's keep_seconds, stale_after and max_series_per_target under ``config``."""
    collect = config.collect
    return config.longest_window + 2 * collect.interval, collect.stale_after, collect.max_series_per_target


@dataclass
class Exporter:
    """All targets, the store and the latest views; runs one collection task per target."""

    config: Config
    clock: Callable[[], float] = time.monotonic
    store: Store = field(init=False)
    collectors: dict[str, TargetCollector] = field(init=False)
    started_at: float = field(init=False)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _limit: asyncio.Semaphore | None = None
    # Called after each collection its loop ran (the tap's router hears the break-even it found).
    collected: Callable[[], None] = field(default=lambda: None)

    def __post_init__(self) -> None:
        self.started_at = self.clock()
        self.store = Store(*store_limits(self.config))
        self.collectors = {t.name: self._collector(t, self.config) for t in self.config.targets}

    def _collector(self, target: TargetConfig, config: Config) -> TargetCollector:
        return TargetCollector(target, config, self.store, self.clock, peer_view=self._view_of)

    def _view_of(self, name: str) -> TargetView | None:
        collector = self.collectors.get(name)
        return collector.view if collector is not None else None

    def views(self) -> list[TargetView]:
        return [c.latest() for c in self.collectors.values()]

    def ready(self) -> tuple[bool, str]:
        """Ready when every target has been collected successfully within the last three intervals."""
        now = self.clock()
        for collector in self.collectors.values():
            reason = collector.unready_reason(now)
            if reason is not None:
                return False, reason
        return True, "ok"

    async def collect_all_once(self, client: httpx.AsyncClient) -> list[TargetView]:
        return list(await asyncio.gather(*(c.collect(client) for c in self.collectors.values())))

    async def _loop(self, collector: TargetCollector, limit: asyncio.Semaphore, phase: float) -> None:
        try:
            client = new_client(collector.config)
        except (OSError, ssl.SSLError, ValueError) as exc:  # the TLS files went away since the config was loaded
            detail = f"tls_config: {getattr(exc, 'strerror', None) or exc}"
            while True:
                collector.fail(CollectionFailure(FailureReason.CONNECT, detail), 0.0)
                await asyncio.sleep(collector.interval)
        async with client:
            delay_once = phase  # fraction of an interval, added once after the first collection
            while True:
                started = self.clock()
                async with limit:
                    await collector.collect(client)
                self.collected()
                # Sleep to the next tick of this target's own schedule; an overrun skips ticks, never stacks them.
                interval = collector.interval
                elapsed = self.clock() - started
                await asyncio.sleep(interval - (elapsed % interval) + delay_once * interval)
                delay_once = 0.0

    def _start(self, collector: TargetCollector) -> None:
        if self._limit is None:
            return  # not running (tests drive collections themselves)
        name = collector.config.name
        # Every target is collected at once when the sidecar starts; after that, target i of N runs i/N of an
        # interval later, so many targets are spread over the interval instead of queueing in one burst.
        names = list(self.collectors)
        phase = names.index(name) / len(names)
        self._tasks[name] = asyncio.create_task(self._loop(collector, self._limit, phase), name=f"collect-{name}")

    def _stop(self, name: str) -> asyncio.Task[None] | None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        return task

    def apply_config(self, config: Config) -> list[str]:
        """Switch to a new, already validated config without losing state (a reload).

        A target that keeps its name and URL keeps its series, windows and histogram; its loop restarts
        only when its connection settings changed. A target whose URL changed is a new source: its state
        starts afresh. Removed targets stop and their series go. Returns what changed, one note each.
        """
        notes: list[str] = []
        self.config = config
        self.store.set_limits(*store_limits(config))
        wanted = {t.name: t for t in config.targets}
        for name in [n for n in self.collectors if n not in wanted]:
            self._stop(name)
            del self.collectors[name]
            self._forget(name)
            notes.append(f"target {name} removed")
        for name, target in wanted.items():
            collector = self.collectors.get(name)
            if collector is None:
                collector = self.collectors[name] = self._collector(target, config)
                self._start(collector)
                notes.append(f"target {name} added")
                continue
            change = collector.reconfigure(target, config)
            if not change.changed:
                continue
            notes.append(f"target {name} has a new URL; its state starts afresh" if change.new_source
                         else f"target {name} updated")
            if change.reconnect and self._stop(name) is not None:
                self._start(collector)
        self.republish()
        return notes

    def republish(self) -> None:
        """Build every collected target's view again from the store, under the config in force now (after a
        reload, so the verdict, windows and thresholds it changed show at once, not at the next collection)."""
        for collector in self.collectors.values():
            collector.republish()

    def _forget(self, target: str) -> None:
        self.store.drop_target(target)

    async def run(self) -> None:
        self._limit = asyncio.Semaphore(self.config.collect.concurrency)
        try:
            for collector in self.collectors.values():
                self._start(collector)
            await asyncio.Event().wait()  # until cancelled; reloads add and remove loops meanwhile
        finally:
            self._limit = None
            tasks = [self._stop(name) for name in list(self._tasks)]
            for task in tasks:
                if task is not None:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """One system-default TLS context for every target without a tls_config: each context loads the CA bundle,
    about 0.8 MB, so one per target made a sidecar with 100 targets 80 MB larger."""
    return ssl.create_default_context(cafile=certifi.where())  # httpx's own default bundle


@functools.cache
def plain_http_context() -> ssl.SSLContext:
    """The context of a plain-http target's client, which never speaks TLS: it trusts no CA (so it could verify no
    server), and loads no CA bundle (2.6 MB of RSS)."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def new_client(target: TargetConfig) -> httpx.AsyncClient:
    """One client per target: its own TLS settings and keep-alive connection, and a hanging target holds only its
    own (pipeline/scrape.py's http_client: no redirects, no proxy or .netrc from the environment)."""
    if target.tls is None and urlsplit(target.url).scheme != "https":
        return http_client(plain_http_context())
    return http_client(target.tls.ssl_context() if target.tls else default_ssl_context())
