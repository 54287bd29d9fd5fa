"""The /metrics page, rendered once per scrape in slices that yield to the event loop, served as bytes.

The sidecar's event loop also serves scrapes, so nothing on it may hold the interpreter for long: a 1 MB target's
page (~2 MB, 20k samples) took prometheus_client ~100 ms to render in one piece, and a scrape arriving meanwhile
waited that long. Here a render is a generator of small steps (one series' families, then a few hundred sample
lines), driven by ``run_sliced`` (core/slices.py), which hands the loop back every ``SLICE_SECONDS``.

The page is written by the project's one exposition writer (core/exposition.py), which remembers each sample
line's ``name{labels} `` part from one render to the next; a render then only formats the values. The
spec-decode families go straight from the views to lines (PageLines); the live families (prometheus_client's
process, platform and GC collectors, the reload and tap families) follow, written fresh at every scrape.
"""

from __future__ import annotations

import asyncio
import functools
import math
import operator
import re
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as openmetrics

from specdecode_exporter.core.exposition import UNDERSCORES, LineFormat, TextFormat
from specdecode_exporter.core.slices import run_sliced
from specdecode_exporter.sidecar.collection import TargetView
from specdecode_exporter.sidecar.expose import PageLines, fill_families

Encoder = Callable[..., bytes]  # prometheus_client's generate_latest for one of the two text formats
IDLE_UNTIL_A_SCRAPE = 60.0  # keep_fresh's sleep while no scrape is expected; a scrape ends it at once
GZIP_LEVEL = 3  # a 1 MB target's 2.1 MB page: 7.8 ms and 88 KB, against 28 ms and 77 KB at zlib's default 6


class Compressor(Protocol):
    """What zlib.compressobj returns, as far as the page uses it."""

    def compress(self, data: bytes, /) -> bytes: ...
    def flush(self, mode: int = ..., /) -> bytes: ...
    def copy(self) -> Compressor: ...


def text_format(encoder: Encoder) -> TextFormat:
    """The format an encoder chosen by prometheus_client's choose_encoder writes (the page is written by
    core/exposition.py, not by the encoder): OpenMetrics or the text format, and the name escaping asked for."""
    func, keywords = (encoder.func, encoder.keywords) if isinstance(encoder, functools.partial) else (encoder, {})
    return TextFormat(openmetrics=func is openmetrics.generate_latest,
                      escaping=str(keywords.get("escaping", UNDERSCORES)))


OPENMETRICS_VERSION = "1.0.0"  # the version the page is written in, whatever a client names
_NEGOTIATED: dict[TextFormat, tuple[Encoder, str]] = {}


def negotiate(accept: str) -> tuple[Encoder, str]:
    """The encoder and content type for an Accept header: one encoder object per format the page can be written
    in (2 formats × 4 escapings), which the page's caches key on. prometheus_client's choose_encoder returns a new
    encoder at every call and echoes any OpenMetrics version from 1.0.0 up that a client names: keyed as given,
    every scrape (and every made-up version) would have cached a page of its own."""
    encoder, content_type = choose_encoder(accept)
    page_format = text_format(encoder)
    known = _NEGOTIATED.get(page_format)
    if known is None:
        if isinstance(encoder, functools.partial) and "version" in encoder.keywords:
            encoder = functools.partial(encoder.func, *encoder.args,
                                        **{**encoder.keywords, "version": OPENMETRICS_VERSION})
            content_type = re.sub(r"version=[^;]*", f"version={OPENMETRICS_VERSION}", content_type, count=1)
        known = _NEGOTIATED[page_format] = (encoder, content_type)
    return known


def new_gzip() -> Compressor:
    return zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: gzip framing


def compressed_steps(text: bytes, gzip: Compressor, piece: int = 16 * 1024) -> Iterator[bytes]:
    """gzip of ``text`` in pieces (~0.06 ms each at GZIP_LEVEL), leaving ``gzip`` open for what follows. It ends
    with a sync flush: the last block of the text is written out here, once, not by every scrape's final flush
    (0.2 ms of Huffman coding a 2 MB page's last block each time); the stream stays one gzip member."""
    for start in range(0, len(text), piece):
        yield gzip.compress(text[start:start + piece])
    yield gzip.flush(zlib.Z_SYNC_FLUSH)


def spec_decode_steps(views: Iterable[TargetView], line_format: LineFormat) -> Iterator[str]:
    """The spec-decode families' text in pieces: empty pieces while the lines are written (one per series),
    then the text."""
    lines = PageLines(line_format)
    for _ in fill_families(lines, views):
        yield ""
    yield from lines.pieces()
    line_format.render_done()


@dataclass(frozen=True)
class Rendered:
    """The spec-decode part of the page for one set of views and one encoder (OpenMetrics' # EOF left off: the
    live families follow it)."""

    views: tuple[TargetView, ...]  # what it was rendered from; keeping them keeps their ids meaningful
    text: bytes
    # The gzip of the text, and the compressor right after it: a compressed scrape copies it to add the live
    # families, so a response is one gzip stream without compressing the large part again.
    gzipped: tuple[bytes, Compressor] | None = None

    def current(self, views: tuple[TargetView, ...], compress: bool) -> bool:
        return same_views(views, self.views) and (self.gzipped is not None or not compress)


def same_views(views: tuple[TargetView, ...], others: tuple[TargetView, ...]) -> bool:
    """The same published views (a collection publishes new view objects)."""
    return len(views) == len(others) and all(map(operator.is_, views, others))


class SpecDecodePage:
    """The spec-decode part of /metrics, per encoder: rendered once per set of views at most, in slices on the
    event loop: by ``keep_fresh``, for the scrape it expects next, where a render is slow enough to be worth it;
    by a scrape, when the page of the views published by then is not rendered yet (a fast page, no scraper
    expected, or a collection just before the scrape). Nothing is rendered for pages nobody reads."""

    def __init__(self, views: Callable[[], list[TargetView]], gzipped: tuple[Encoder, ...] = ()) -> None:
        """``gzipped``: encoders whose page is gzipped from its first render, before any scrape asks for it so
        (what Prometheus asks for)."""
        self._views = views
        # The first encoder of each format seen, which the page is keyed by: what it writes is the format (2 × 4
        # escapings), however the encoder was asked for (a new object per call, any OpenMetrics version).
        self._encoders: dict[TextFormat, Encoder] = {}
        self._formats: dict[Encoder, LineFormat] = {}
        self._rendered: dict[Encoder, Rendered] = {}
        self._rendering: dict[Encoder, asyncio.Task[Rendered]] = {}
        self._wants_gzip: set[Encoder] = {self.encoder(encoder) for encoder in gzipped}
        self.renders = 0  # spec-decode renders so far (one per set of views and encoder)
        self.last_render_seconds = 0.0  # how long the last render took, from its first step to its last (real time)
        self._scrapes: tuple[float, ...] = ()  # the last two scrapes' times (monotonic)
        self._sleeping: asyncio.Future[None] | None = None  # keep_fresh's sleep, which a scrape ends
        self._collections_wake = False  # and a collection too (within the window before a scrape)
        self._clock: Callable[[], float] = time.monotonic  # keep_fresh's
        self._published = -math.inf  # when the last collection published (keep_fresh's clock), told by wake()

    def encoder(self, encoder: Encoder) -> Encoder:
        return self._encoders.setdefault(text_format(encoder), encoder)

    def line_format(self, encoder: Encoder) -> LineFormat:
        line_format = self._formats.get(encoder)
        if line_format is None:
            line_format = self._formats[encoder] = LineFormat(text_format(encoder))
        return line_format

    async def get(self, encoder: Encoder, compress: bool) -> Rendered:
        """The part for the views published by now (gzipped too where ``compress``), rendered if need be: a scrape
        never reads a page older than the last collection. keep_fresh renders a slow one ahead of a regular scraper; any
        other scrape renders it itself, once per set of views (~2 ms at a real vLLM page, ~130 ms at 1 MB). Views
        published while it renders wait for the next call: with many targets some view is always newer."""
        encoder = self.encoder(encoder)
        if compress:
            self._wants_gzip.add(encoder)
        views = tuple(self._views())
        rendered = self._rendered.get(encoder)
        if rendered is not None and rendered.current(views, compress):
            return rendered
        task = self._rendering.get(encoder)
        if task is not None:  # a render that began before this call: maybe of older views
            rendered = await asyncio.shield(task)  # a scrape that gives up must not cancel what others wait for
            if rendered.current(views, compress):
                return rendered
            task = self._rendering.get(encoder)  # begun since this call: of these views or newer ones
        return await asyncio.shield(task if task is not None else self._start(encoder))

    def _start(self, encoder: Encoder) -> asyncio.Task[Rendered]:
        task = self._rendering[encoder] = asyncio.ensure_future(
            self._render(encoder, tuple(self._views()), self._rendered.get(encoder)))
        task.add_done_callback(lambda _: self._rendering.pop(encoder, None))
        return task

    def scraped(self, now: float) -> None:
        """A scrape came: keep_fresh renders ahead of the next one it expects (it looks again now)."""
        self._scrapes = (self._scrapes[-1], now) if self._scrapes else (now,)
        self._end_sleep()

    def due(self, now: float, lead: float) -> bool:
        """Whether a page rendered now would be the one the next scrape gets: only once two scrapes have shown
        the scrape interval, when the next scrape (one interval after the last) is at most ``lead`` away (a
        scraper every 30 s of a sidecar collecting every 5 s gets one render per scrape, not six), and not once it
        is overdue by a whole interval (the scraper went away). Before the second scrape, or after the scraper
        went away, nothing is rendered ahead: a page nobody reads is not rendered; a scrape that comes renders
        its own."""
        window = self._window(lead)
        return window is not None and window[0] <= now < window[1]

    def _window(self, lead: float) -> tuple[float, float] | None:
        """From when until when a page rendered ahead is read by the next scrape; None before two scrapes."""
        if len(self._scrapes) < 2:
            return None
        previous, last = self._scrapes
        return last + (last - previous) - lead, last + 2 * (last - previous)

    def collection_first(self, expected: float, now: float) -> bool:
        """Whether a collection expected at ``expected`` comes after ``now`` and before the next scrape: then that
        collection, not the views published by now, is what the scrape reads (rendering these is wasted)."""
        window = self._window(0.0)
        return window is not None and now < expected < window[0]

    def _idle(self, now: float, lead: float, poll: float, unexpected: float) -> float:
        """How long keep_fresh can sleep: until the window of the next scrape opens; ``poll`` within it;
        ``unexpected`` while no scrape is expected (a scrape renders its own page meanwhile)."""
        window = self._window(lead)
        if window is None or now >= window[1]:
            return unexpected
        return max(poll, window[0] - poll - now)  # a look just before it opens: what came then is not due

    def wake(self) -> None:
        """A collection has published (now: when its views came); within the window before a scrape, keep_fresh
        looks now."""
        self._published = self._clock()
        if self._collections_wake:
            self._end_sleep()

    def _end_sleep(self) -> None:
        if self._sleeping is not None and not self._sleeping.done():
            self._sleeping.set_result(None)

    async def _sleep(self, seconds: float, woken: bool, in_window: bool) -> None:
        """``seconds``, or (``woken``) until a scrape comes or, ``in_window``, a collection."""
        if not woken:
            await asyncio.sleep(seconds)
            return
        loop = asyncio.get_running_loop()
        sleeping = self._sleeping = loop.create_future()
        self._collections_wake = in_window
        timer = loop.call_later(seconds, self._end_sleep)
        try:
            await sleeping
        finally:
            timer.cancel()
            self._sleeping, self._collections_wake = None, False

    async def _render(self, encoder: Encoder, views: tuple[TargetView, ...], before: Rendered | None) -> Rendered:
        started = time.perf_counter()
        if before is not None and before.current(views, compress=False):
            text = before.text  # only the gzip is missing
        else:
            self.renders += 1
            text = "".join(await run_sliced(spec_decode_steps(views, self.line_format(encoder)))).encode("utf-8")
        gzipped = None
        if encoder in self._wants_gzip:
            gzip = new_gzip()
            gzipped = (b"".join(await run_sliced(compressed_steps(text, gzip))), gzip)
        rendered = self._rendered[encoder] = Rendered(views, text, gzipped)
        self.last_render_seconds = time.perf_counter() - started
        return rendered

    async def keep_fresh(self, poll: float, interval: float, clock: Callable[[], float] = time.monotonic,
                         rest: float | None = None, longest_sleep: float | None = None, woken: bool = False,
                         ahead_above: float = 0.0) -> None:
        """Render the page the next scrape will read, once, for each encoder scraped so far: looks every ``poll``
        seconds at what the collections published (``interval``: the collection interval) while a render may be
        due, and sleeps (outside the window at most ``longest_sleep``, default ``interval``, or when ``woken``
        IDLE_UNTIL_A_SCRAPE) while none can be. ``woken``: each
        collection calls ``wake`` and each scrape ``scraped``; then it looks when a scrape came, when the window
        before the next one opens, when a collection came within it, and ``poll`` seconds before the scrape: not
        every ``poll`` seconds nor every collection (a look, a cold wakeup of the loop, cost about what a
        collection's fetch does).

        Views are rendered when they came within one collection interval of the next scrape (no newer views are
        expected before it); views that came earlier are not: the collection in that last interval replaces them
        before anyone reads them (woken, views came when their collection called ``wake``, not when keep_fresh
        first looked at them). When none came within it (a late or failed collection), what there is is rendered
        shortly before the scrape (twice the last render's time, at least twice ``poll``), unless a collection is
        still due before the scrape (one interval after the views came): that one is rendered as it comes, or, if
        it comes too late, the scrape renders its own. Before the second scrape its time is unknown, and after the
        scraper went away nobody reads a page: nothing is rendered (a scrape renders its own). Outside the window
        before a scrape it sleeps rather than looks. After a render it rests ``rest`` seconds (interval / 2: many
        targets publish all the time; one render per rest then).

        ``ahead_above``: renders ahead only once the last render took at least this long (real time). A page that
        renders faster is rendered by the scrape that reads it: each look of keep_fresh is a cold wakeup of the
        loop (several per scrape), which costs more than the scrape's wait for a small page is worth."""
        if longest_sleep is None:
            longest_sleep = IDLE_UNTIL_A_SCRAPE if woken else interval
        self._clock = clock
        await self._keep_fresh(poll, interval, interval / 2 if rest is None else rest, clock, longest_sleep, woken,
                               ahead_above)

    async def _keep_fresh(self, poll: float, interval: float, rest: float, clock: Callable[[], float],
                          longest_sleep: float, woken: bool, ahead_above: float) -> None:
        seen: tuple[TargetView, ...] = ()
        came = render_seconds = 0.0
        while True:
            if self.last_render_seconds < ahead_above:  # cheap: the next scrape renders its own (it wakes this too)
                await self._sleep(longest_sleep, woken, in_window=False)
                continue
            now, late = clock(), max(2 * render_seconds, 2 * poll)
            # Woken: it sleeps until the window before the next scrape opens (a scrape wakes it: the window
            # moves), and within it until a collection comes or the scrape is near.
            in_window = woken and self.due(now, max(interval, late))
            idle = self._idle(now, late if in_window else max(interval, late), poll,
                              IDLE_UNTIL_A_SCRAPE if woken else interval)
            await self._sleep(idle if in_window else min(idle, longest_sleep), woken, in_window)
            now, views = clock(), tuple(self._views())
            if not same_views(views, seen):
                # Woken, each collection told when it published: views published while it slept outside the
                # window came before it, not when it woke as the window opened.
                seen, came = views, self._published if woken else now
            # Late: nothing came within the window; render what there is, unless a collection is still due first.
            late_render = self.due(now, late) and not self.collection_first(came + interval, now)
            if not (self.due(came, interval) or late_render):
                continue
            renders = self.renders
            for encoder in list(self._rendered.keys() | self._wants_gzip):
                await self.get(encoder, encoder in self._wants_gzip)
            if self.renders != renders:
                render_seconds = clock() - now
                await asyncio.sleep(rest)
