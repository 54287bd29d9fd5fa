"""The /metrics page: the sidecar's families in a prometheus_client registry, rendered by prometheus_client's own
encoders when a scrape comes, off the event loop.

Negotiation: prometheus_client's ``choose_encoder`` reads each Accept entry, tried in the order of their q-values
(it reads a header in the order written); the page is one of a fixed set of formats (``PAGE_FORMATS``), labelled
with the version its body is in. Nothing a client sends is kept.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, CONTENT_TYPE_PLAIN_1_0_0, choose_encoder
from prometheus_client.exposition import generate_latest as text_encoder
from prometheus_client.openmetrics.exposition import ALLOWUTF8, DOTS, UNDERSCORES, VALUES
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE_OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_encoder
from prometheus_client.registry import Collector

from specdecode_exporter.sidecar.collection import TargetView
from specdecode_exporter.sidecar.expose import RequestsCollector, SpecDecodeCollector
from specdecode_exporter.sidecar.proxy import TapRuntime
from specdecode_exporter.sidecar.reload import ReloadCollector, Reloader
from specdecode_exporter.tap.request_stats import NO_REQUESTS

# Measured on the pages (docs/performance.md): 3 costs what 1 does (0.23 ms at a real vLLM page's 31 KiB, 5.1 ms at
# a 1 MB target's 2.2 MB) for 3-13 % less; 6 takes 2.5-3 times the CPU for 10-14 % less, 9 up to 7 times.
GZIP_LEVEL = 3
ESCAPINGS = (UNDERSCORES, DOTS, VALUES, ALLOWUTF8)


@dataclass(frozen=True)
class PageFormat:
    """One way the page is written: an encoder of prometheus_client's and the Content-Type of what it writes."""

    content_type: str
    encode: Callable[[Collector], bytes]


def _page_formats() -> dict[str, PageFormat]:
    """Every format the page is written in, by the media type and name escaping they answer: Prometheus text
    0.0.4; text 1.0.0 under the four escapings Prometheus 3 may ask for; OpenMetrics 1.0.0 under two of them.
    prometheus_client 0.26's OpenMetrics encoder escapes a sample's whole name under dots and values escaping
    (``specdecode__up__bucket``, ``U__specdecode__up``) where # TYPE names its family (``specdecode__up``,
    ``specdecode_up``; client_python #1177): pages a strict parser rejects. A scraper asking for those gets its
    next choice (Prometheus: text 1.0.0 with the same escaping, which the text encoder writes consistently)."""
    formats = {"text/plain": PageFormat(CONTENT_TYPE_PLAIN_0_0_4, text_encoder)}
    for escaping in ESCAPINGS:
        formats[f"text/plain;{escaping}"] = PageFormat(f"{CONTENT_TYPE_PLAIN_1_0_0}; escaping={escaping}",
                                                       partial(text_encoder, escaping=escaping))
    for escaping in (UNDERSCORES, ALLOWUTF8):
        formats[f"application/openmetrics-text;{escaping}"] = PageFormat(
            f"{CONTENT_TYPE_OPENMETRICS}; escaping={escaping}",
            partial(openmetrics_encoder, escaping=escaping, version="1.0.0"))
    return formats


PAGE_FORMATS = _page_formats()
TEXT = PAGE_FORMATS["text/plain"]
# What choose_encoder answers with its default (text 0.0.4): taken only for an entry that asked for one of these.
TEXT_RANGES = frozenset({"text/plain", "text/*", "*/*"})


def quality(entry: str) -> float:
    """An Accept or Accept-Encoding entry's q-value (1 when it has none; 0, not acceptable, when it cannot be
    read)."""
    for param in entry.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 < q <= 1.0 else 0.0
    return 1.0


def by_quality(header: str) -> list[str]:
    """A header's acceptable entries, the preferred first (by q-value, then as written)."""
    entries = [(quality(entry), index, entry) for index, entry in enumerate(header.split(","))]
    return [entry for q, _, entry in sorted(entries, key=lambda e: (-e[0], e[1])) if q > 0]


def format_of(content_type: str) -> PageFormat | None:
    """The page format for the content type choose_encoder answered, by its media type and escaping (the version
    it echoes from the client, any from 1.0.0 up, is not kept: the body is OpenMetrics 1.0.0 whatever was named);
    None for a format the page is not written in."""
    media, *params = (part.strip() for part in content_type.split(";"))
    escaping = next((value for key, _, value in (p.partition("=") for p in params) if key == "escaping"), None)
    if media == "text/plain" and escaping is None:
        return TEXT
    return PAGE_FORMATS.get(f"{media};{escaping or UNDERSCORES}")


def negotiate(accept: str) -> PageFormat:
    """The page format for an Accept header: the first entry, by q-value, that choose_encoder answers with a
    format the page is written in, or that a text page satisfies; else text 0.0.4 (a scraper always gets a
    page)."""
    for entry in by_quality(accept):
        try:
            _, content_type = choose_encoder(entry)
        except (TypeError, ValueError):  # a version it cannot compare (version=1.x): not this entry
            continue
        page_format = format_of(content_type)
        if page_format is TEXT and entry.split(";")[0].strip().lower() not in TEXT_RANGES:
            continue  # choose_encoder's default for an entry it does not serve (application/json, OpenMetrics 0.0.1)
        if page_format is not None:
            return page_format
    return TEXT


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header allows gzip: its own entry decides where it has one, else ``*``'s (q=0
    forbids it; RFC 9110 §12.5.3)."""
    qualities: dict[str, bool] = {}
    for entry in accept_encoding.split(","):
        coding = entry.split(";")[0].strip().lower()
        if coding in ("gzip", "*") and coding not in qualities:
            qualities[coding] = quality(entry) > 0
    return qualities.get("gzip", qualities.get("*", False))


def tap_snapshot(tap: TapRuntime | None) -> RequestsCollector:
    """The tap's families as they are now (empty, with their HELP and TYPE, when the tap is off)."""
    if tap is None:
        return RequestsCollector(lambda: NO_REQUESTS, dict, lambda: None)
    view, labels, stats, routes, variances = tap.view(), tap.labels, tap.stats(), tap.routes(), tap.variances()
    return RequestsCollector(lambda: view, lambda: labels, lambda: stats, lambda: routes,
                             tap.config.class_histograms, lambda: variances)


class MetricsPage:
    """/metrics: the families of the views published by the time a scrape comes (so every scrape is as fresh as
    the last collection, whatever its phase), the reload's, the tap's, then the process, platform and GC ones,
    rendered per scrape in a worker thread (the event loop goes on serving meanwhile)."""

    def __init__(self, views: Callable[[], Sequence[TargetView]], reloader: Reloader | None = None,
                 tap: TapRuntime | None = None) -> None:
        self._views, self._tap = views, tap
        self._reload: tuple[Collector, ...] = (ReloadCollector(reloader),) if reloader is not None else ()
        self._process = CollectorRegistry()  # the process' own families, read when a page is rendered
        ProcessCollector(registry=self._process)
        PlatformCollector(registry=self._process)
        GCCollector(registry=self._process)

    def registry(self) -> CollectorRegistry:
        """A registry of what a scrape renders now (on the event loop: the views and the tap's counters are read
        here, not in the thread that renders them)."""
        views = tuple(self._views())
        registry = CollectorRegistry()
        for collector in (SpecDecodeCollector(lambda: views), *self._reload, tap_snapshot(self._tap), self._process):
            registry.register(collector)
        return registry

    async def render(self, accept: str, accept_encoding: str) -> tuple[bytes, dict[str, str]]:
        """The page for a scrape's Accept and Accept-Encoding headers, and the response headers that go with it."""
        page_format, compress = negotiate(accept), accepts_gzip(accept_encoding)
        if self._tap is not None:
            await self._tap.refresh()
        body = await asyncio.to_thread(encoded, self.registry(), page_format, compress)
        headers = {"Content-Type": page_format.content_type, "Vary": "Accept-Encoding"}
        return body, headers | ({"Content-Encoding": "gzip"} if compress else {})


def encoded(registry: CollectorRegistry, page_format: PageFormat, compress: bool) -> bytes:
    body = page_format.encode(registry)
    return gzip.compress(body, GZIP_LEVEL, mtime=0) if compress else body
