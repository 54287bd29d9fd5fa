"""A hostile vLLM over real loopback HTTP: every failure is typed, counted, bounded in time and memory,
and never corrupts the counters the sidecar already has. (Table: docs/faults.md.)"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.sidecar.collection import Exporter, TargetView, new_client
from specdecode_exporter.sidecar.config import CollectSection, Config, TargetConfig, parse_windows
from specdecode_exporter.sidecar.web import build_app
from tests.faults.hostile import (
    HostileServer,
    closed_port,
    fixed,
    gzip_bomb_chunks,
    scripted,
    serve,
    silent,
    streamed,
    v1_body,
)
from tests.helpers import Exposition, FakeClock

MiB = 1 << 20
GiB = 1 << 30


@dataclass
class Sidecar:
    """One target, collections driven by the test on a fake clock, each over a fresh real HTTP client."""

    url: str
    timeout: float = 1.0
    max_body_bytes: int = 4 * MiB
    max_series_per_target: int = 1000
    clock: FakeClock = field(default_factory=FakeClock)
    exporter: Exporter = field(init=False)

    def __post_init__(self) -> None:
        config = Config(targets=(TargetConfig("vllm", self.url, timeout=self.timeout),),
                        windows=parse_windows("1m", "windows"),
                        collect=CollectSection(interval=5.0, max_body_size=self.max_body_bytes,
                                               max_series_per_target=self.max_series_per_target))
        self.exporter = Exporter(config, clock=self.clock)

    def collect(self, advance: float = 5.0) -> TargetView:
        self.clock.advance(advance)

        async def once() -> TargetView:
            collector = self.exporter.collectors["vllm"]
            async with new_client(collector.config) as client:
                return await collector.collect(client)

        return asyncio.run(once())

    def errors(self) -> dict[str, int]:
        return dict(self.exporter.collectors["vllm"].errors)

    def totals(self) -> tuple[float, float]:
        (series,) = self.exporter.store.series.values()
        return series.totals.draft_tokens, series.totals.accepted_tokens


def assert_failed(sidecar: Sidecar, view: TargetView, reason: str) -> None:
    assert view.up is False
    assert view.last_error is not None and view.last_error.startswith(reason), view.last_error
    assert sidecar.errors()[reason] == 1, sidecar.errors()
    assert sum(sidecar.errors().values()) == 1


@pytest.fixture
def hostile() -> Iterator[Callable[..., HostileServer]]:
    servers: list[HostileServer] = []

    def start(behaviour: Callable[[HostileServer], object]) -> HostileServer:
        server = serve(behaviour)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# ---------- connection-level faults ----------

def test_refused_connection_is_connect() -> None:
    sidecar = Sidecar(f"http://127.0.0.1:{closed_port()}/metrics")
    started = time.monotonic()
    assert_failed(sidecar, sidecar.collect(), "connect")
    assert time.monotonic() - started < 1.0


def test_accepts_and_never_answers_is_timeout_within_the_deadline(hostile: Callable[..., HostileServer]) -> None:
    server = hostile(silent())
    sidecar = Sidecar(server.url, timeout=0.5)
    started = time.monotonic()
    assert_failed(sidecar, sidecar.collect(), "timeout")
    assert 0.45 <= time.monotonic() - started < 1.5
    assert len(server.requests) == 1


def test_byte_by_byte_dribble_is_cut_at_the_total_deadline(hostile: Callable[..., HostileServer]) -> None:
    body = v1_body(300, 200) * 10

    async def dribble() -> AsyncIterator[bytes]:
        for i in range(len(body)):
            yield body[i:i + 1]
            await asyncio.sleep(0.02)

    server = hostile(streamed(dribble, length=len(body)))
    sidecar = Sidecar(server.url, timeout=0.5)
    started = time.monotonic()
    assert_failed(sidecar, sidecar.collect(), "timeout")
    assert time.monotonic() - started < 1.5  # a total deadline, not a per-read one
    assert 0 < server.bytes_sent < len(body)


@pytest.mark.parametrize("chunked", [False, True])
def test_close_mid_body_is_connect(hostile: Callable[..., HostileServer], chunked: bool) -> None:
    async def half() -> AsyncIterator[bytes]:
        yield v1_body(300, 200)[:50]
        raise ConnectionResetError  # the server drops the connection mid-body

    server = hostile(streamed(half, length=None if chunked else 10_000))
    sidecar = Sidecar(server.url)
    assert_failed(sidecar, sidecar.collect(), "connect")


# ---------- HTTP-level faults ----------

@pytest.mark.parametrize("status", [500, 503, 404, 401])
def test_error_status_is_http_status(hostile: Callable[..., HostileServer], status: int) -> None:
    server = hostile(fixed(status, b"Internal Server Error"))
    sidecar = Sidecar(server.url)
    view = sidecar.collect()
    assert_failed(sidecar, view, "http_status")
    assert f"HTTP {status}" in (view.last_error or "")


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirects_are_never_followed(hostile: Callable[..., HostileServer], status: int) -> None:
    elsewhere = hostile(fixed(200, v1_body(300, 200)))  # a host the sidecar must never be steered to
    server = hostile(fixed(status, b"", {"Location": elsewhere.url}))
    sidecar = Sidecar(server.url)
    view = sidecar.collect()
    assert_failed(sidecar, view, "http_status")
    assert "not followed" in (view.last_error or "")
    assert elsewhere.requests == []


@pytest.mark.parametrize(
    ("content_type", "body"),
    [("text/html; charset=utf-8", b"<html><body>vllm:spec_decode_num_drafts_total 1</body></html>"),
     ("text/plain", b"<!DOCTYPE html>\n<html><title>502 Bad Gateway</title></html>\n")],
)
def test_html_is_parse(hostile: Callable[..., HostileServer], content_type: str, body: bytes) -> None:
    server = hostile(fixed(200, body, {"Content-Type": content_type}))
    sidecar = Sidecar(server.url)
    assert_failed(sidecar, sidecar.collect(), "parse")


def test_empty_body_is_no_spec_metrics(hostile: Callable[..., HostileServer]) -> None:
    # An empty exposition is valid Prometheus text; it just has nothing we need.
    server = hostile(fixed(200, b""))
    sidecar = Sidecar(server.url)
    assert_failed(sidecar, sidecar.collect(), "no_spec_metrics")


def test_invalid_utf8_is_parse(hostile: Callable[..., HostileServer]) -> None:
    server = hostile(fixed(200, v1_body(300, 200) + b'vllm:x{a="\xff\xfe"} 1\n'))
    sidecar = Sidecar(server.url)
    view = sidecar.collect()
    assert_failed(sidecar, view, "parse")
    assert "not UTF-8" in (view.last_error or "")


def test_unknown_content_encoding_is_parse(hostile: Callable[..., HostileServer]) -> None:
    server = hostile(fixed(200, b"\x00\x01", {"Content-Encoding": "br"}))
    sidecar = Sidecar(server.url)
    assert_failed(sidecar, sidecar.collect(), "parse")


def test_corrupt_gzip_is_parse(hostile: Callable[..., HostileServer]) -> None:
    server = hostile(fixed(200, b"\x1f\x8b\x08\x00garbage-not-deflate" * 10, {"Content-Encoding": "gzip"}))
    sidecar = Sidecar(server.url)
    assert_failed(sidecar, sidecar.collect(), "parse")


# ---------- size: a 1 GiB body and a gzip bomb, capped, memory bounded ----------

def _one_gib_of_lines() -> AsyncIterator[bytes]:
    line = b'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 1\n'
    block = line * (MiB // len(line))

    async def gen() -> AsyncIterator[bytes]:
        for _ in range(GiB // len(block)):
            yield block
    return gen()


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_one_gib_body_is_too_large_and_memory_stays_bounded(hostile: Callable[..., HostileServer],
                                                             framing: str) -> None:
    length = (GiB // MiB) * MiB if framing == "content-length" else None
    server = hostile(streamed(_one_gib_of_lines, length=length))
    sidecar = Sidecar(server.url, timeout=20.0, max_body_bytes=4 * MiB)
    tracemalloc.start()
    try:
        started = time.monotonic()
        view = sidecar.collect()
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_failed(sidecar, view, "too_large")
    assert peak < 3 * 4 * MiB, f"peak {peak / MiB:.1f} MiB for a 4 MiB cap"
    assert server.bytes_sent < 64 * MiB, "the sidecar hung up long before 1 GiB"
    assert elapsed < 10


def test_gzip_bomb_is_too_large_and_memory_stays_bounded(hostile: Callable[..., HostileServer]) -> None:
    server = hostile(streamed(gzip_bomb_chunks(GiB), headers={"Content-Encoding": "gzip"}))
    sidecar = Sidecar(server.url, timeout=20.0, max_body_bytes=4 * MiB)
    tracemalloc.start()
    try:
        view = sidecar.collect()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_failed(sidecar, view, "too_large")
    # 1 GiB decoded, ~3 MB on the wire: inflation stops at the cap, whatever the compression ratio.
    assert peak < 3 * 4 * MiB, f"peak {peak / MiB:.1f} MiB for a 4 MiB cap"


def test_gzip_body_under_the_cap_is_fine(hostile: Callable[..., HostileServer]) -> None:
    server = hostile(streamed(gzip_bomb_chunks(2 * MiB), headers={"Content-Encoding": "gzip"}))
    sidecar = Sidecar(server.url, max_body_bytes=4 * MiB)
    # 2 MiB of decoded lines (a V1 drafts counter, without the token counters): decoded and parsed, not refused
    # for its size; what the decoder then says is that no series has its token counters.
    view = sidecar.collect()
    assert view.last_error is not None and view.last_error.startswith("no_spec_metrics"), view.last_error
    assert "accepted token counter missing" in view.last_error


# ---------- values ----------

def test_duplicate_series_keep_the_first_sample(hostile: Callable[..., HostileServer]) -> None:
    duplicate = b'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 999999\n'
    server = hostile(fixed(200, v1_body(300, 200) + duplicate))
    sidecar = Sidecar(server.url)
    assert sidecar.collect().up is True
    assert sidecar.totals() == (300, 200)


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "-5"])
def test_nan_inf_negative_values_are_skipped_without_corrupting_totals(
        hostile: Callable[..., HostileServer], bad: str) -> None:
    body = {"value": v1_body(300, 200)}
    server = hostile(scripted(lambda: body["value"]))
    sidecar = Sidecar(server.url)
    sidecar.collect()
    body["value"] = v1_body(600, 400).replace(b"} 600", f"}} {bad}".encode())
    view = sidecar.collect()
    assert view.up is True  # the exposition is fine; that one reading is not used
    assert sidecar.totals() == (300, 200)
    body["value"] = v1_body(900, 600)
    sidecar.collect()
    assert sidecar.totals() == (900, 600)  # nothing lost, nothing made up
    (series,) = view.series
    assert series.restarts == 0


def test_counters_that_decrease_are_a_restart_and_totals_stay_monotonic(
        hostile: Callable[..., HostileServer]) -> None:
    values = iter([v1_body(300, 200), v1_body(600, 400), v1_body(90, 60), v1_body(150, 100)])
    server = hostile(scripted(lambda: next(values)))
    sidecar = Sidecar(server.url)
    seen = []
    for _ in range(4):
        sidecar.collect()
        seen.append(sidecar.totals())
    assert seen == [(300, 200), (600, 400), (690, 460), (750, 500)]
    (series,) = sidecar.exporter.store.series.values()
    assert series.restarts == 1


def test_a_body_cut_mid_value_is_parse_not_a_restart(hostile: Callable[..., HostileServer]) -> None:
    """A vLLM dying mid-write with a Content-Length that matches what it sent: the last value is a prefix of the
    real one (600 cut to 6), which read as a counter would be a restart and inflate the totals afterwards."""
    whole = v1_body(600, 400)
    cut = whole[: whole.rindex(b" 400") + 2]  # "... 4": no newline after the last line
    values = iter([v1_body(300, 200), cut, v1_body(900, 600)])
    server = hostile(scripted(lambda: next(values)))
    sidecar = Sidecar(server.url)
    sidecar.collect()
    view = sidecar.collect()
    assert view.up is False
    assert view.last_error is not None and view.last_error.startswith("parse"), view.last_error
    assert "cut short" in view.last_error
    sidecar.collect()
    assert sidecar.totals() == (900, 600)  # the cut body added nothing
    (series,) = sidecar.exporter.store.series.values()
    assert series.restarts == 0


def test_a_lost_accepted_counter_is_no_spec_metrics_not_an_empty_up(hostile: Callable[..., HostileServer]) -> None:
    """vLLM exports its drafts but not the accepted-token counter (an upgrade renamed it, a partial exposition):
    no α can be read, so the target is down for no_spec_metrics (what SpecDecodeMetricsMissing pages on) rather
    than up with no series; with the counter back it is up again and the totals go on."""
    whole = v1_body(300, 200)
    lines = [line for line in whole.decode().splitlines() if "accepted_tokens" not in line]
    values = iter([whole, ("\n".join(lines) + "\n").encode(), v1_body(600, 400)])
    server = hostile(scripted(lambda: next(values)))
    sidecar = Sidecar(server.url)
    assert sidecar.collect().up is True
    view = sidecar.collect()
    assert view.up is False
    assert view.last_error is not None and view.last_error.startswith("no_spec_metrics"), view.last_error
    assert "accepted token counter missing" in view.last_error
    assert sidecar.errors()["no_spec_metrics"] == 1
    assert sidecar.collect().up is True
    assert sidecar.totals() == (600, 400)


def test_a_changed_created_is_a_restart_even_when_counters_grew(hostile: Callable[..., HostileServer]) -> None:
    values = iter([v1_body(300, 200, created=1.7e9), v1_body(900, 600, created=1.7e9 + 60)])
    server = hostile(scripted(lambda: next(values)))
    sidecar = Sidecar(server.url)
    sidecar.collect()
    sidecar.collect()
    # The new process counted 900 since it started: that is the increase, not 900 - 300.
    assert sidecar.totals() == (1200, 800)
    (series,) = sidecar.exporter.store.series.values()
    assert series.restarts == 1


def test_label_cardinality_explosion_is_capped_and_counted(hostile: Callable[..., HostileServer]) -> None:
    counter = {"n": 0}

    def body() -> bytes:  # every collection brings 2000 brand-new model names
        counter["n"] += 1
        return b"".join(v1_body(300, 200, model=f"m-{counter['n']}-{i}") for i in range(2000))

    server = hostile(scripted(body))
    sidecar = Sidecar(server.url, max_series_per_target=50)
    for _ in range(3):
        started = time.monotonic()
        view = sidecar.collect()
        assert time.monotonic() - started < 5
    assert view.up is True
    assert len(sidecar.exporter.store.series) == 50
    assert view.dropped_series == 3 * 2000 - 50


def test_vllm_upgrade_renaming_the_metrics_is_no_spec_metrics(hostile: Callable[..., HostileServer]) -> None:
    body = {"value": v1_body(300, 200)}
    server = hostile(scripted(lambda: body["value"]))
    sidecar = Sidecar(server.url)
    assert sidecar.collect().up is True
    body["value"] = v1_body(600, 400).replace(b"vllm:spec_decode_num_", b"vllm:speculative_decoding_")
    view = sidecar.collect()
    assert_failed(sidecar, view, "no_spec_metrics")
    assert sidecar.totals() == (300, 200)  # what was known is still reported until it goes stale


# ---------- a hanging target does not delay the others, nor /metrics ----------

def test_a_hanging_target_delays_neither_the_others_nor_metrics(hostile: Callable[..., HostileServer]) -> None:
    hang = hostile(silent())
    good = hostile(scripted(lambda: v1_body(300, 200)))
    config = Config(targets=(TargetConfig("hang", hang.url, timeout=3.0), TargetConfig("good", good.url, timeout=3.0)),
                    windows=parse_windows("1m", "windows"), collect=CollectSection(interval=0.2))
    exporter = Exporter(config)
    began = time.monotonic()
    with ThreadedServer(build_app(exporter, run_collection=True), bind_socket(), name="sidecar").start() as sidecar:
        time.sleep(2.0)
        latencies = []
        for _ in range(5):
            started = time.monotonic()
            response = httpx.get(sidecar.base_url + "/metrics", timeout=5)
            latencies.append(time.monotonic() - started)
        metrics = Exposition.parse(response.text)
    elapsed = time.monotonic() - began
    # A scrape held by the hanging fetch would take its 3 s timeout; half of it leaves room for a loaded machine's
    # stalls (one scrape of five took 0.59 s in a CI run while nothing hung it).
    assert max(latencies) < 1.5, latencies
    assert len(good.requests) >= 5, "the good target kept its 0.2 s schedule while the other hung"
    # One fetch at a time, each held to its 3 s timeout (a loaded machine can stretch the test past the first one);
    # a collection that started a fetch every 0.2 s interval regardless would have sent ten or more.
    assert 1 <= len(hang.requests) <= 1 + int(elapsed / 3.0), (len(hang.requests), elapsed)
    assert metrics.get("specdecode_up", target="good") == 1.0
    assert metrics.get("specdecode_up", target="hang") == 0.0


def test_v0_label_explosion_keeps_decoder_state_bounded(hostile: Callable[..., HostileServer]) -> None:
    counter = {"n": 0}

    def body() -> bytes:  # V0 dialect, 500 brand-new model names per collection
        counter["n"] += 1
        return b"".join(
            f'vllm:spec_decode_draft_acceptance_rate{{model_name="m-{counter["n"]}-{i}"}} 0.5\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m-{counter["n"]}-{i}"}} 5\n'
            f'vllm:spec_decode_num_draft_tokens_total{{model_name="m-{counter["n"]}-{i}"}} 10\n'.encode()
            for i in range(500))

    server = hostile(scripted(body))
    sidecar = Sidecar(server.url, max_series_per_target=50)
    for _ in range(4):
        sidecar.collect(advance=1.0)
    decoder = sidecar.exporter.collectors["vllm"].decoder
    assert len(decoder.models) <= 2 * 500  # type: ignore[union-attr]
