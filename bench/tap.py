"""Request tap bench: what a relay in front of vLLM adds, against calling the upstream directly in the same run.

    .venv/bin/python bench/tap.py                 # 64 and 256 streams, every variant, ~3 minutes
    .venv/bin/python bench/tap.py --rounds 3      # interleaved repeats, medians (the machine is shared and noisy)
    .venv/bin/python bench/tap.py --streams 64 --seconds 5 --variants tap-uvloop,raw-relay-uvloop

`make bench` runs it through bench/run.py (section 6 of bench/results.md) in one of the sizes below (QUICK; LONG
with --long; SMOKE with --smoke, for tests/bench), every figure set against baselines measured in the same run.

Three processes per run, loopback only: a fake upstream (raw asyncio on uvloop) that answers each streamed
completion with one vLLM-sized SSE event every 5 ms per stream; the relay under test (absent for "direct"); a load
generator (raw asyncio on uvloop) holding N keep-alive connections, each sending one streamed request (100 events)
after another, stream starts spread over one stream's length (independent arrivals). The client does not ask for
usage, so the tap injects `stream_options.include_usage` and strips the usage event again (its costliest path).

Figures: time to first byte on kept-alive connections (p50, p99, and what the relay adds to direct's; a
connection's first request is reported apart, as ttfb_first_p50, in the JSON lines); the relay's CPU per forwarded
chunk (utime + stime from /proc over the load window / chunks received); stalls (a gap over 50 ms between two events
of one stream, which the upstream sends 5 ms apart); the CPU other jobs used meanwhile.

Variants: tap-uvloop (specdecode_exporter.tap on uvloop: the design); raw-relay-uvloop (bytes relayed both ways,
nothing parsed: the floor); checked-relay-uvloop (the floor, each upstream read also passed through the tap's own
per-chunk check: what no relay that finds the events it rewrites goes below); tap-asyncio (specdecode_exporter.tap
on the default loop); aiohttp (client + server on uvloop; needs `pip install aiohttp`); httpx-starlette (httpx
client + Starlette StreamingResponse on uvicorn with uvloop and httptools: the obvious FastAPI-style proxy). Results
and discussion: docs/tap-design.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from bench.common import CLK_TCK, free_port, markdown_table, proc_cpu_seconds, proc_rss_mb  # noqa: E402

INTERVAL = 0.005  # one SSE event per stream every 5 ms
EVENTS_PER_STREAM = 100  # 0.5 s streams, so each connection measures many first bytes
STALL_GAP = 0.050
VARIANTS = ("tap-uvloop", "raw-relay-uvloop", "checked-relay-uvloop", "tap-routing-uvloop", "tap-asyncio", "aiohttp",
            "httpx-starlette")
BASELINE = "direct"  # the upstream called without any relay: what TTFB is compared with
FLOOR = "raw-relay-uvloop"  # bytes relayed, nothing parsed: what the relays' CPU per chunk is compared with
CHECKED = "checked-relay-uvloop"  # the floor plus the tap's per-chunk check on each upstream read: what a relay that
# must find the events it rewrites cannot go below, measured in the same rounds as the tap
TAP = "tap-uvloop"  # the tap without routing: what the tap with routing on is compared with
ROUTING = "tap-routing-uvloop"  # the tap with routing on (tap.route, enforce): the class is routed after 5
# requests, so 95 % of them go to the fallback (the same fake vLLM, on connections of their own) and 5 % stay
# (the canary): every request takes a decision, and keep-alive connections switch pools.


@dataclass(frozen=True)
class BenchSize:
    """One configuration of the bench: how many concurrent streams, for how long, how often, which relays."""

    streams: tuple[int, ...]
    seconds: float
    rounds: int
    quiet_wait: float  # at most this long, wait for a nearly idle second before each measurement
    variants: tuple[str, ...]

    def describe(self) -> str:
        return (f"{'/'.join(map(str, self.streams))} streams, {self.seconds:g} s per measurement, {self.rounds} "
                f"interleaved round{'s' if self.rounds > 1 else ''}, variants {', '.join(self.variants)}")


# bench/run.py's sizes. SMOKE only proves the bench works end to end (tests/bench): its figures mean nothing.
SMOKE = BenchSize((4,), 0.6, 1, 0.0, ("tap-uvloop", FLOOR, CHECKED, ROUTING))
QUICK = BenchSize((64,), 5.0, 3, 3.0, ("tap-uvloop", FLOOR, CHECKED, ROUTING, "tap-asyncio"))
LONG = BenchSize((64, 256), 6.0, 3, 20.0, VARIANTS)
_EVENT = (
    b'data: {"id":"cmpl-8c79809def3acc5c","object":"text_completion","created":1795364486,"model":"tiny",'
    b'"choices":[{"index":0,"text":" robami","logprobs":null,"finish_reason":null,"stop_reason":null,'
    b'"prompt_token_ids":null,"token_ids":null}]}\n\n'
)
_TERMINAL = _EVENT.replace(b'"finish_reason":null', b'"finish_reason":"length"')
_USAGE = (
    b'data: {"id":"cmpl-8c79809def3acc5c","object":"text_completion","created":1795364486,"model":"tiny",'
    b'"choices":[],"usage":{"prompt_tokens":31,"total_tokens":71,"completion_tokens":40},'
    b'"system_fingerprint":"vllm-0.32.0-03d32f27","metrics":{"time_to_first_token_ms":61.7,'
    b'"speculative_decoding":{"mean_acceptance_length":3.27,"draft_acceptance_rate":0.76,'
    b'"acceptance_histogram":[2,1,0,8],"num_spec_steps":11,"num_accepted_draft_tokens":25,'
    b'"num_draft_tokens":33,"num_spec_tokens":3}}}\n\n'
)
_FINGERPRINT = b',"system_fingerprint":"vllm-0.32.0-03d32f27"'


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


# ---- the fake upstream -----------------------------------------------------------------------------------------


class _UpstreamConn(asyncio.Protocol):
    """Answers each POST with a stream: head and first event at once, then one event per INTERVAL."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0]) if b"content-length:" in head else 0
        if len(self.buffer) < end + 4 + length:
            return
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        usage = b'"include_usage":true' in body.replace(b" ", b"")
        start = b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        assert self.transport is not None
        self.transport.write(start + b"transfer-encoding: chunked\r\n\r\n" + _chunk(_EVENT))
        self.loop.call_at(self.loop.time() + INTERVAL, self.tick, 1, self.loop.time(), usage)

    def tick(self, sent: int, started: float, usage: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        if sent < EVENTS_PER_STREAM - 1:
            transport.write(_chunk(_EVENT))
            self.loop.call_at(started + (sent + 1) * INTERVAL, self.tick, sent + 1, started, usage)
            return
        # The end, written the way uvicorn writes vLLM's last events: one write each.
        if usage:
            transport.write(_chunk(_TERMINAL))
            transport.write(_chunk(_USAGE))
        else:
            transport.write(_chunk(_TERMINAL[: _TERMINAL.rindex(b"}")] + _FINGERPRINT + b"}\n\n"))
        transport.write(_chunk(b"data: [DONE]\n\n"))
        transport.write(b"0\r\n\r\n")


async def _serve_upstream(port: int) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_server(_UpstreamConn, "127.0.0.1", port, backlog=2048)
    await asyncio.Event().wait()


# ---- relays under test -------------------------------------------------------------------------------------------


class _CountingObserver:
    def __init__(self) -> None:
        self.count = 0

    def observe(self, request: object, result: object) -> None:
        self.count += 1


async def _serve_tap(port: int, upstream: str, routing: bool = False) -> None:
    from specdecode_exporter.tap import start_tap
    from specdecode_exporter.tap.request_stats import RequestRecorder
    from specdecode_exporter.tap.route import ClassRouter
    from specdecode_exporter.tap.settings import ENFORCE, RouteSettings, TapSettings

    settings = TapSettings(listen_address=f"127.0.0.1:{port}", upstream=upstream, target="vllm")
    if not routing:
        await start_tap("127.0.0.1", port, settings, _CountingObserver())
    else:
        # The fake vLLM's α is 0.76: a break-even of 0.9 routes its one class after min_requests.
        settings = replace(settings, route=RouteSettings(upstream, mode=ENFORCE, min_requests=5))
        assert settings.route is not None
        router = ClassRouter(settings.route, RequestRecorder(settings).band_key, lambda model: 0.9)
        await start_tap("127.0.0.1", port, settings, router, router=router)
    await asyncio.Event().wait()


class _RawRelay(asyncio.Protocol):
    """The floor: bytes relayed both ways, nothing parsed (what any HTTP-aware relay costs more than)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = cast(asyncio.Transport, transport)
        asyncio.get_running_loop().create_task(self.connect())

    def back_protocol(self) -> asyncio.Protocol:
        """The upstream connection's protocol: each read written to the client as it came."""
        relay = self

        class Back(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                assert relay.client is not None
                relay.client.write(data)

            def connection_lost(self, exc: Exception | None) -> None:
                assert relay.client is not None
                relay.client.close()

        return Back()

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self.upstream, _ = await loop.create_connection(self.back_protocol, "127.0.0.1", self.upstream_port)
        self.upstream.write(b"".join(self.pending))

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


class _CheckedRelay(_RawRelay):
    """The raw relay, each upstream read also passed through the tap's own per-chunk check (the usage stripper's
    ``passes``: its marks searched for, its chunk framing walked) before it is written as it came: the least any
    relay that must find the events it rewrites pays per chunk in Python, with none of the tap's other work."""

    passed = 0

    def back_protocol(self) -> asyncio.Protocol:
        from specdecode_exporter.tap.sse import UsageStripper

        relay, check = self, UsageStripper(limit=256 * 1024).passes

        class Back(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                assert relay.client is not None
                relay.passed += check(data)  # counted only: the floor writes every read as it came
                relay.client.write(data)

            def connection_lost(self, exc: Exception | None) -> None:
                assert relay.client is not None
                relay.client.close()

        return Back()


async def _serve_raw_relay(port: int, upstream: str, relay: type[_RawRelay] = _RawRelay) -> None:
    upstream_port = int(upstream.rsplit(":", 1)[1])
    await asyncio.get_running_loop().create_server(lambda: relay(upstream_port), "127.0.0.1", port, backlog=2048)
    await asyncio.Event().wait()


async def _serve_aiohttp(port: int, upstream: str) -> None:
    import aiohttp
    from aiohttp import web

    hop = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        async with session.request(request.method, upstream + request.path_qs, headers=headers, data=body) as up:
            response = web.StreamResponse(
                status=up.status, headers={k: v for k, v in up.headers.items() if k.lower() not in hop}
            )
            await response.prepare(request)
            async for piece in up.content.iter_any():
                await response.write(piece)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", relay)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
    await asyncio.Event().wait()


def _serve_httpx_starlette(port: int, upstream: str) -> None:
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, timeout=None, limits=httpx.Limits(max_connections=None))
    hop = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}

    async def relay(request: Request) -> StreamingResponse:
        headers = {k: v for k, v in request.headers.items() if k not in hop}
        upstream_request = client.build_request(
            request.method, request.url.path, headers=headers, content=await request.body()
        )
        up = await client.send(upstream_request, stream=True)
        return StreamingResponse(
            up.aiter_raw(),
            status_code=up.status_code,
            headers={k: v for k, v in up.headers.items() if k not in hop},
            background=BackgroundTask(up.aclose),
        )

    app = Starlette(routes=[Route("/{path:path}", relay, methods=["GET", "POST"])])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        backlog=2048,
    )


# ---- load generator ----------------------------------------------------------------------------------------------


class _LoadConn(asyncio.Protocol):
    """One keep-alive connection sending streamed requests back to back until the deadline."""

    def __init__(self, stats: dict[str, Any], deadline: float, done: asyncio.Future[None]) -> None:
        self.stats, self.deadline, self.done = stats, deadline, done
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.sent_at = 0.0
        self.last = 0.0
        self.first = True
        self.tail = b""
        self.sent = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.send()

    def send(self) -> None:
        body = b'{"model":"tiny","prompt":"lin mire ren","max_tokens":100,"stream":true}'
        assert self.transport is not None
        self.first, self.tail = True, b""
        self.sent += 1
        self.sent_at = time.perf_counter()
        self.transport.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body)
        )

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        stats = self.stats
        if self.first:
            self.first = False
            # A connection's first request also pays for opening connections: kept apart.
            stats["ttfb" if self.sent > 1 else "ttfb_first"].append(now - self.sent_at)
        elif now - self.last > STALL_GAP:
            stats["stalls"] += 1
        self.last = now
        stats["events"] += data.count(b"data: ")
        self.tail = (self.tail + data)[-7:]
        if self.tail.endswith(b"\r\n0\r\n\r\n"):
            stats["requests"] += 1
            if now < self.deadline:
                self.send()
            elif not self.done.done():
                self.stats["open"] -= 1
                if self.stats["open"] == 0:
                    self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stats["errors"] += 1


async def _load(port: int, streams: int, seconds: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    stats: dict[str, Any] = {
        "ttfb": [],
        "ttfb_first": [],
        "events": 0,
        "stalls": 0,
        "requests": 0,
        "errors": 0,
        "open": streams,
    }
    done: asyncio.Future[None] = loop.create_future()
    deadline = time.perf_counter() + seconds
    transports = []
    for index in range(streams):
        # Stream starts spread over one stream's length, so that requests then arrive evenly, as independent
        # clients' would (started together, equal streams would end and restart in lockstep waves).
        await asyncio.sleep(EVENTS_PER_STREAM * INTERVAL / streams if index else 0)
        transport, _ = await loop.create_connection(lambda: _LoadConn(stats, deadline, done), "127.0.0.1", port)
        transports.append(transport)
    await asyncio.wait_for(done, seconds + 30)
    for transport in transports:
        transport.close()
    stats["errors"] -= streams  # the closes above
    return stats


# ---- orchestration -----------------------------------------------------------------------------------------------


def spawn(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, __file__, *args], env=env)


def wait_port(port: int, timeout: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _busy_cpu_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / CLK_TCK


def _wait_for_quiet(limit: float) -> None:
    """Wait (at most ``limit`` seconds) for a second in which the machine was nearly idle: other jobs share it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = _busy_cpu_seconds()
        time.sleep(1.0)
        if _busy_cpu_seconds() - before < 0.1:
            return


def _measure(
    variant: str, upstream: subprocess.Popen[bytes], upstream_port: int, streams: int, seconds: float, quiet_wait: float
) -> dict[str, Any]:
    proxy = None
    port = upstream_port
    if variant != "direct":
        port = free_port()
        proxy = spawn(
            "--role",
            "proxy",
            "--variant",
            variant,
            "--port",
            str(port),
            "--upstream",
            f"http://127.0.0.1:{upstream_port}",
        )
        wait_port(port)
    _wait_for_quiet(quiet_wait)
    ours = [upstream, *([proxy] if proxy else [])]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        before = [proc_cpu_seconds(p.pid) for p in ours]
        busy_before, started = _busy_cpu_seconds(), time.monotonic()
        load = spawn(
            "--role",
            "load",
            "--port",
            str(port),
            "--streams",
            str(streams),
            "--seconds",
            str(seconds),
            "--out",
            out.name,
        )
        load_cpu = 0.0
        while load.poll() is None:
            with contextlib.suppress(OSError, IndexError):
                load_cpu = proc_cpu_seconds(load.pid)
            time.sleep(0.05)
        spent = [proc_cpu_seconds(p.pid) - b for p, b in zip(ours, before, strict=True)]
        elapsed = time.monotonic() - started
        # Whatever else ran on the machine meanwhile (other jobs share it): context for the latency figures.
        background = (_busy_cpu_seconds() - busy_before - sum(spent) - load_cpu) / elapsed
        cpu = spent[1] if proxy else 0.0
        stats = json.loads(Path(out.name).read_text())
    rss_peak = proc_rss_mb(proxy.pid, "VmHWM") if proxy else 0.0
    if proxy:
        stop(proxy)
    ttfb = sorted(stats["ttfb"])
    return {
        "variant": variant,
        "streams": streams,
        "requests": stats["requests"],
        "events": stats["events"],
        "stalls": stats["stalls"],
        "errors": stats["errors"],
        "ttfb_p50": statistics.median(ttfb),
        "ttfb_p99": ttfb[int(0.99 * (len(ttfb) - 1))],
        "ttfb_first_p50": statistics.median(stats["ttfb_first"]),
        "cpu_per_chunk": cpu / stats["events"] if proxy and stats["events"] else 0.0,
        "cpu_share": cpu / seconds,
        "background_cores": max(0.0, background),
        "proxy_rss_peak_mb": rss_peak,
    }


TABLE_HEADER = ["streams", "variant", "requests", "chunks", "TTFB p50", "TTFB p99", "added p99 (≤ 1 ms at 64)",
                "p99 vs direct", "relay CPU / chunk", "CPU / chunk vs raw relay", "% core per 1k chunks/s (≤ 2 %)",
                "relay peak RSS", "stalls", "errors", "other load"]


def table_cells(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The cells under TABLE_HEADER for ``rows`` as with_ratios gives them ("—" where a row has no baseline)."""

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1e3:+.2f} ms"

    def times(value: float | None) -> str:
        return "—" if value is None else f"**{value:.2f}×**"

    cells = []
    for r in rows:
        relayed = r["variant"] != BASELINE
        per_chunk = float(r["cpu_per_chunk"])
        cells.append([str(r["streams"]), str(r["variant"]), str(r["requests"]), str(r["events"]),
                      f"{float(r['ttfb_p50']) * 1e3:.2f} ms", f"{float(r['ttfb_p99']) * 1e3:.2f} ms",
                      ms(r["added_p99"]), times(r["ttfb_p99_vs_direct"]),
                      f"{per_chunk * 1e6:.1f} µs" if relayed else "—", times(r["cpu_vs_floor"]),
                      f"{per_chunk * 1e5:.1f} %" if relayed else "—",
                      f"{float(r['proxy_rss_peak_mb']):.0f} MB" if relayed else "—",
                      str(r["stalls"]), str(r["errors"]), f"{float(r['background_cores']):.2f} cores"])
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", default="bench", choices=["bench", "upstream", "proxy", "load"])
    parser.add_argument("--variant", default="tap-uvloop")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--streams", default="64,256")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=1, help="repeat, interleaved; the table shows medians")
    parser.add_argument("--quiet-wait", type=float, default=20.0, help="s to wait for an idle machine before a run")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.role != "bench":
        _run_role(args)
        return
    size = BenchSize(tuple(int(s) for s in args.streams.split(",")), args.seconds, args.rounds, args.quiet_wait,
                     tuple(args.variants.split(",")))
    rows = run(size, lambda row: print(json.dumps(row), flush=True))
    print("\n".join(markdown_table(TABLE_HEADER, table_cells(with_ratios(rows)))))
    print("\n".join(routing_lines(rows) + floor_lines(rows)))


def run(size: BenchSize, report: Callable[[dict[str, Any]], None] = lambda row: None) -> list[dict[str, Any]]:
    """Every measurement of ``size`` (direct first, then each variant, per streams and round), one row each."""
    variants = [v for v in size.variants if _available(v)]
    upstream_port = free_port()
    upstream = spawn("--role", "upstream", "--port", str(upstream_port))
    rows: list[dict[str, Any]] = []
    try:
        wait_port(upstream_port)
        for streams in size.streams:
            for round_index in range(size.rounds):
                for variant in (BASELINE, *variants):
                    row = _measure(variant, upstream, upstream_port, streams, size.seconds, size.quiet_wait)
                    row["round"] = round_index
                    report(row)
                    rows.append(row)
    finally:
        stop(upstream)
    return rows


def round_ranges(rows: Sequence[dict[str, Any]]) -> dict[tuple[int, str], dict[str, tuple[float, float]]]:
    """Per (streams, relay): the lowest and highest of each ratio when every round is set against its own round's
    baselines (the spread the medians hide)."""
    rounds: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in rows:
        rounds.setdefault((row["streams"], row.get("round", 0)), []).append(row)
    spread: dict[tuple[int, str], dict[str, list[float]]] = {}
    for group in rounds.values():
        for row in with_ratios(group):
            for key in ("cpu_vs_floor", "ttfb_p99_vs_direct", "added_p99"):
                if row[key] is not None:
                    spread.setdefault((row["streams"], row["variant"]), {}).setdefault(key, []).append(row[key])
    return {where: {key: (min(values), max(values)) for key, values in figures.items()}
            for where, figures in spread.items()}


def with_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The medians of ``rows`` with each figure against its baseline of the same run and streams: TTFB against
    calling the upstream directly, CPU per chunk against the raw relay (None where that baseline was not run)."""
    merged = _medians(list(rows))
    direct = {r["streams"]: r for r in merged if r["variant"] == BASELINE}
    floor = {r["streams"]: r for r in merged if r["variant"] == FLOOR}
    out = []
    for row in merged:
        base, bare = direct.get(row["streams"]), floor.get(row["streams"])
        relayed = row["variant"] != BASELINE
        out.append({
            **row,
            "added_p50": row["ttfb_p50"] - base["ttfb_p50"] if base and relayed else None,
            "added_p99": row["ttfb_p99"] - base["ttfb_p99"] if base and relayed else None,
            "ttfb_p99_vs_direct": _ratio(row["ttfb_p99"], base["ttfb_p99"]) if base and relayed else None,
            "cpu_vs_floor": _ratio(row["cpu_per_chunk"], bare["cpu_per_chunk"]) if bare and relayed else None,
        })
    return out


def versus(rows: Sequence[dict[str, Any]], variant: str, base: str) -> dict[int, dict[str, float | None]]:
    """Per streams, ``variant`` against ``base``, both from ``rows`` (one run, medians): CPU per chunk, its ratio,
    and the TTFB p99 it adds."""
    merged = _medians(list(rows))
    bases = {r["streams"]: r for r in merged if r["variant"] == base}
    out: dict[int, dict[str, float | None]] = {}
    for row in merged:
        against = bases.get(row["streams"])
        if row["variant"] == variant and against is not None:
            cpu, base_cpu = row["cpu_per_chunk"], against["cpu_per_chunk"]
            out[row["streams"]] = {"cpu_per_chunk": cpu, "base_cpu_per_chunk": base_cpu,
                                   "cpu_ratio": _ratio(cpu, base_cpu),
                                   "added_p99": row["ttfb_p99"] - against["ttfb_p99"]}
    return out


def _versus_line(lead: str, figures: dict[str, float | None], base: str) -> str:
    ratio, added = figures["cpu_ratio"], figures["added_p99"]
    return (f"{lead}: {float(figures['cpu_per_chunk'] or 0) * 1e6:.1f} µs a chunk against "
            f"{float(figures['base_cpu_per_chunk'] or 0) * 1e6:.1f} µs for {base} in the same run: "
            f"**{'—' if ratio is None else f'{ratio:.2f}×'}**; TTFB p99 {float(added or 0) * 1e3:+.2f} ms against it.")


def routing_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per streams on the cost of routing, for the results."""
    return [_versus_line(f"Routing on ({ROUTING}, {streams} streams)", figures, "the tap without routing")
            for streams, figures in versus(rows, ROUTING, TAP).items()]


def floor_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per streams on the tap against the checked relay: what the tap costs beyond the per-chunk check
    that no relay which rewrites a stream's events can skip."""
    return [_versus_line(f"The tap against the checked relay ({CHECKED}: the floor plus the tap's own per-chunk "
                         f"check; {streams} streams)", figures, CHECKED)
            for streams, figures in versus(rows, TAP, CHECKED).items()]


def _ratio(value: float, baseline: float) -> float | None:
    return value / baseline if baseline > 0 else None


def _medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (streams, variant): the median of each figure over the rounds; stalls and counts summed."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["streams"], row["variant"]), []).append(row)
    summed = ("requests", "events", "stalls", "errors")
    return [
        {
            key: (
                sum(r[key] for r in group)
                if key in summed
                else statistics.median(r[key] for r in group)
                if isinstance(group[0][key], float)
                else group[0][key]
            )
            for key in group[0]
            if key != "round"
        }
        for group in groups.values()
    ]


def _available(variant: str) -> bool:
    if variant == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
        print("aiohttp is not installed: variant skipped (.venv/bin/pip install aiohttp)", file=sys.stderr)
        return False
    return True


def _run_role(args: argparse.Namespace) -> None:
    import uvloop

    if args.role == "upstream":
        uvloop.run(_serve_upstream(args.port))
    elif args.role == "load":
        stats = uvloop.run(_load(args.port, int(args.streams), args.seconds))
        Path(args.out).write_text(json.dumps(stats))
    elif args.variant == "tap-uvloop":
        uvloop.run(_serve_tap(args.port, args.upstream))
    elif args.variant == ROUTING:
        uvloop.run(_serve_tap(args.port, args.upstream, routing=True))
    elif args.variant == "raw-relay-uvloop":
        uvloop.run(_serve_raw_relay(args.port, args.upstream))
    elif args.variant == CHECKED:
        uvloop.run(_serve_raw_relay(args.port, args.upstream, _CheckedRelay))
    elif args.variant == "tap-asyncio":
        asyncio.run(_serve_tap(args.port, args.upstream))
    elif args.variant == "aiohttp":
        uvloop.run(_serve_aiohttp(args.port, args.upstream))
    elif args.variant == "httpx-starlette":
        _serve_httpx_starlette(args.port, args.upstream)
    else:
        raise SystemExit(f"unknown variant {args.variant}")


if __name__ == "__main__":
    main()
