"""The fuzz target shared by hypothesis and atheris: one fetched body through the whole ingest path
(UTF-8 → selective parse → engine detection → decode → store → views → our /metrics exposition).

The only exception allowed out of ``_ingest`` is CollectionFailure (a typed, counted failure); and whatever
went in, the sidecar's own exposition must stay valid Prometheus text."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specdecode_exporter.pipeline.engines.base import FetchTiming
from specdecode_exporter.pipeline.scrape import FetchResult
from specdecode_exporter.pipeline.store import Store
from specdecode_exporter.sidecar.collection import CollectionFailure, ModelNameNeeded, TargetCollector
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.sidecar.expose import SpecDecodeCollector

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CONTENT_TYPES = ("text/plain; version=0.0.4; charset=utf-8", "application/openmetrics-text; version=1.0.0",
                 "text/html", "")


def seeds() -> list[bytes]:
    return [p.read_bytes() for p in sorted(FIXTURES.glob("*.prom"))]


class Target:
    """A collector that lives across inputs (the decoders are stateful), on a simple clock."""

    def __init__(self) -> None:
        config = Config(targets=(TargetConfig("fuzz", "http://127.0.0.1:1/metrics"),),
                        windows=parse_windows("1m,5m", "windows"), collect=CollectSection(max_series_per_target=50))
        self.now = 1000.0
        self.store = Store(keep_seconds=400, stale_after=120,
                           max_series_per_target=config.collect.max_series_per_target)
        self.collector = TargetCollector(config.targets[0], config, self.store, clock=lambda: self.now)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(SpecDecodeCollector(lambda: [self.collector.view] if self.collector.view else []))

    def feed(self, body: bytes, content_type: str = CONTENT_TYPES[0], render: bool = True) -> bool:
        """True when the body was accepted. Raises anything but CollectionFailure: that is a finding."""
        self.now += 5.0
        result = FetchResult(FetchTiming(self.now - 0.01, self.now), body=body, content_type=content_type)
        try:
            try:
                self.collector.ingest(result)
            except ModelNameNeeded:  # collect() would ask /v1/models; here nothing answers, as when that fails
                self.collector.looked_up_model(None)
                self.collector.ingest(result)
            ok = True
        except CollectionFailure:
            ok = False
        self.collector.publish(up=ok, duration=0.01)
        if render:
            text = generate_latest(self.registry).decode()
            for _ in text_string_to_metric_families(text):  # our output parses, whatever came in
                pass
        return ok
