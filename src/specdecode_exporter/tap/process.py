"""The request tap in a process of its own, so that nothing the exporter does (a collection of a 1 MB target, a
page render, a full GC pass) holds the interpreter while a client's tokens are waiting to be relayed.

The sidecar binds the tap's socket and starts ``python -m specdecode_exporter.tap`` with it and one end of
a socket pair. Over that pair, length-prefixed pickles (the two processes are one program):

  sidecar → tap   TapProcessSettings (first: the validated TapSettings as they are, tap/settings.py), ("snapshot",),
                  ("break_even", table), ("stop", grace)
  tap → sidecar   ("ready", port), ("snapshot", TapSnapshot), ("stopped",)

The tap process runs the relay, the recorder and the router; a scrape asks it for a snapshot of their counters.
It stops when told to (draining its requests), and also when the pair closes: a sidecar that died leaves no tap
behind. It ignores SIGINT and SIGTERM: its lifetime is the sidecar's. A tap process that dies is started again on
the same socket (clients that connect meanwhile wait in its backlog), its last counters carried over, so that what
the sidecar exports never goes down.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import pickle
import signal
import socket
import statistics
import struct
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple, cast

from specdecode_exporter.core.process.log import event, setup_logging
from specdecode_exporter.tap.model import Observer, TapRequest, TapResult
from specdecode_exporter.tap.relay import Tap, TapStats, start_tap
from specdecode_exporter.tap.request_stats import NO_REQUESTS, RequestRecorder, RequestsView, combined
from specdecode_exporter.tap.route import ClassRouter, RoutesView
from specdecode_exporter.tap.settings import TapSettings

_LENGTH = struct.Struct("!I")
MAX_MESSAGE = 64 * 1024 * 1024
START_TIMEOUT = 30.0  # a fresh interpreter importing the tap: ~0.3 s idle, seconds on a loaded node
RESTART_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # after the tap process died, by the deaths in a row
UNANSWERED_LIMIT = 5  # snapshot requests in a row the tap process leaves unanswered before it is taken for stuck
STOP_MARGIN = 5.0  # past the drain's grace, how long the tap process may take to exit before it is killed

# The tapped target's spec-decode series as (model name, break-even α in force): the router's threshold.
BreakEvens = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class TapProcessSettings:
    """What the tap process needs: the tap's settings as the sidecar validated them, and what the rest of the
    config says of it: whether vLLM's per-request draft counts are withheld (RequestRecorder.withheld), how to log."""

    tap: TapSettings
    withheld: str | None
    log_level: str
    log_format: str


class TapSnapshot(NamedTuple):
    """The tap's counters at one moment, for one scrape."""

    requests: RequestsView
    routes: RoutesView | None
    stats: TapStats | None


NO_SNAPSHOT = TapSnapshot(NO_REQUESTS, None, None)


def break_even_for(table: BreakEvens, model: str) -> float | None:
    """The break-even α in force for ``model``, averaged over its engines. A target serving one model answers for
    it whatever name the clients use. None before the first collection with draft counters."""
    if len({name for name, _ in table}) > 1:
        table = tuple(row for row in table if row[0] == model)
    return statistics.fmean(value for _, value in table) if table else None


def frame(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


async def read_message(reader: asyncio.StreamReader) -> object:
    """The next message; EOFError when the other process has gone."""
    try:
        (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
        if length > MAX_MESSAGE:
            raise EOFError(f"message of {length} bytes")
        return pickle.loads(await reader.readexactly(length))
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise EOFError(str(exc)) from exc


# ---- in the tap process ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Observers:
    """The tap's one observer: the request figures, then the router."""

    recorder: RequestRecorder
    router: ClassRouter

    def observe(self, request: TapRequest, result: TapResult) -> None:
        self.recorder.observe(request, result)
        self.router.observe(request, result)


class _TapWorker:
    """The tap process' side: the relay, its recorder and router, answering the sidecar."""

    def __init__(self, settings: TapProcessSettings, writer: asyncio.StreamWriter) -> None:
        self.settings = settings
        self.writer = writer
        self.break_evens: BreakEvens = ()
        self.recorder = RequestRecorder(settings.tap, settings.withheld)
        self.router = (ClassRouter(settings.tap.route, self.recorder.band_key,
                                   lambda model: break_even_for(self.break_evens, model),
                                   figures=self.recorder.figures)
                       if settings.tap.route is not None else None)
        self.tap: Tap | None = None

    async def start(self, sock: socket.socket) -> None:
        router = self.router
        observer: Observer = self.recorder if router is None else _Observers(self.recorder, router)
        host = str(sock.getsockname()[0])
        self.tap = await start_tap(host, 0, self.settings.tap, observer, sock=sock, router=router)
        self.send(("ready", self.tap.port))

    def send(self, message: object) -> None:
        self.writer.write(frame(message))

    def snapshot(self) -> TapSnapshot:
        return TapSnapshot(self.recorder.view(), self.router.view() if self.router is not None else None,
                           self.tap.stats() if self.tap is not None else None)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Answer the sidecar until it says stop, or goes (then drain for the drain timeout and end)."""
        while True:
            try:
                message = await read_message(reader)
            except EOFError:
                await self.close(self.settings.tap.drain_timeout)
                return
            match message:
                case ("snapshot",):
                    self.send(("snapshot", self.snapshot()))
                case ("break_even", tuple() as table):
                    self.break_evens = cast(BreakEvens, table)
                case ("stop", float() as grace):
                    await self.close(grace)
                    self.send(("stopped",))
                    with contextlib.suppress(ConnectionError):
                        await self.writer.drain()
                    return

    async def close(self, grace: float) -> None:
        if self.tap is not None:
            tap, self.tap = self.tap, None
            await tap.close(grace)


async def _run_worker(listen: socket.socket, control: socket.socket) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=control)
    settings = await read_message(reader)
    if not isinstance(settings, TapProcessSettings):
        raise SystemExit("specdecode-exporter tap: the first message was not the settings")
    setup_logging(settings.log_level, settings.log_format)
    worker = _TapWorker(settings, writer)
    await worker.start(listen)
    gc.freeze()  # the modules and settings: out of the collector's way
    await worker.serve(reader)


def main(argv: list[str]) -> int:
    """``python -m specdecode_exporter.tap LISTEN_FD CONTROL_FD``: started by the sidecar, not by users."""
    # The sidecar stops the tap (draining it) when it is stopped itself; a signal to the whole group (Ctrl-C, a
    # kill of the process group) would otherwise cut the requests in flight before the sidecar could drain them.
    if len(argv) != 3 or not all(arg.isdigit() for arg in argv[1:]):
        print("specdecode-exporter tap: the sidecar starts this process (specdecode-exporter run "
              "--tap.listen-address ...); it is not a command", file=sys.stderr)
        return 2
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    listen, control = (socket.socket(fileno=int(fd)) for fd in argv[1:3])
    try:
        import uvloop  # the relay is a few µs a chunk cheaper on it

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_run_worker(listen, control))
    return 0


# ---- in the sidecar --------------------------------------------------------------------------------------------

class TapProcess:
    """The sidecar's handle on its tap process: starts it on a bound socket, asks it for snapshots, tells it the
    break-even in force, stops it, and starts it again (counters carried over) if it dies."""

    def __init__(self, settings: TapProcessSettings, sock: socket.socket) -> None:
        self.settings = settings
        self.sock = sock
        self.latest = NO_SNAPSHOT
        self.restarts = 0
        self._carried = NO_REQUESTS  # the counters of tap processes that died
        self._current = NO_REQUESTS  # the running one's, as of its last snapshot
        self._break_evens: BreakEvens = ()
        self._process: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: asyncio.Future[TapSnapshot] | None = None
        self._ready: asyncio.Future[int] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        self._unanswered_in_a_row = 0

    async def start(self) -> None:
        """Start the tap process and wait until it listens; RuntimeError when it does not."""
        self._ready = asyncio.get_running_loop().create_future()
        self._supervisor = asyncio.create_task(self._supervise(), name="tap process")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT)
        except (TimeoutError, RuntimeError) as exc:
            await self.stop(0.0)
            why = str(exc) or f"no answer within {START_TIMEOUT:g}s"
            raise RuntimeError(f"the request tap process did not start: {why}") from exc

    async def _supervise(self) -> None:
        deaths = 0
        while not self._stopping:
            began = time.monotonic()
            code = await self._run_once()
            if self.stopping():
                return
            deaths = 1 if time.monotonic() - began > RESTART_DELAYS[-1] else deaths + 1
            delay = RESTART_DELAYS[min(deaths, len(RESTART_DELAYS)) - 1]
            self.restarts += 1
            event(logging.ERROR, "request tap process exited; starting it again", exit_code=code,
                  restart_in=f"{delay:g}s", restarts=self.restarts)
            await asyncio.sleep(delay)

    async def _run_once(self) -> int | None:
        """One tap process, from its start to its end: its exit code."""
        ours, theirs = socket.socketpair()
        with ours, theirs:
            fds = (self.sock.fileno(), theirs.fileno())
            try:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-P", "-m", "specdecode_exporter.tap", *map(str, fds),
                    pass_fds=fds, stdin=asyncio.subprocess.DEVNULL)
            except OSError as exc:
                self._fail_pending(RuntimeError(exc.strerror or str(exc)))
                return None
            theirs.close()
            reader, writer = await asyncio.open_unix_connection(sock=ours)
            self._process, self._writer = process, writer
            writer.write(frame(self.settings))
            writer.write(frame(("break_even", self._break_evens)))
            await self._read(reader)
            self._writer = None
            self._carried, self._current = combined(self._carried, self._current), NO_REQUESTS
            self.latest = NO_SNAPSHOT._replace(requests=self._carried)
            code = await process.wait()
            self._fail_pending(RuntimeError(f"it exited with code {code}"))
            return code

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                message = await read_message(reader)
            except EOFError:
                return
            match message:
                case ("ready", int() as port):
                    if self._ready is not None and not self._ready.done():
                        self._ready.set_result(port)
                case ("snapshot", TapSnapshot() as snapshot):
                    self._current = snapshot.requests
                    self.latest = snapshot._replace(requests=combined(self._carried, snapshot.requests))
                    if self._pending is not None and not self._pending.done():
                        self._pending.set_result(self.latest)
                case ("stopped",):
                    return

    def _fail_pending(self, error: BaseException) -> None:
        for future in (self._pending, self._ready):
            if future is not None and not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here: nobody may be waiting for it

    async def snapshot(self, timeout: float) -> TapSnapshot:
        """The tap's counters now; the last ones seen when it does not answer within ``timeout``."""
        if self._writer is None:
            return self.latest
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().create_future()
            self._writer.write(frame(("snapshot",)))
        try:
            snapshot = await asyncio.wait_for(asyncio.shield(self._pending), timeout)
        except RuntimeError:  # it exited meanwhile
            return self.latest
        except TimeoutError:
            self._unanswered(timeout)
            return self.latest
        self._unanswered_in_a_row = 0
        return snapshot

    def _unanswered(self, waited: float) -> None:
        """A snapshot not answered: say so; a tap process that answers none of UNANSWERED_LIMIT in a row is stuck
        (it relays nothing either), so it is killed and started again."""
        self._unanswered_in_a_row += 1
        process, count = self._process, self._unanswered_in_a_row
        stuck = count >= UNANSWERED_LIMIT and process is not None and process.returncode is None
        event(logging.ERROR if stuck else logging.WARNING,
              "request tap process is stuck; killing it to start it again" if stuck
              else "request tap process did not answer; serving its last counters",
              waited=f"{waited:g}s", unanswered_in_a_row=count)
        if stuck and process is not None:
            process.kill()
            self._unanswered_in_a_row = 0

    def set_break_evens(self, table: BreakEvens) -> None:
        if table != self._break_evens:
            self._break_evens = table
            if self._writer is not None:
                self._writer.write(frame(("break_even", table)))

    async def stop(self, grace: float) -> None:
        """Stop accepting, let requests in flight finish for up to ``grace`` seconds, and end the process."""
        self._stopping = True
        process, writer = self._process, self._writer
        if writer is not None:
            writer.write(frame(("stop", float(grace))))
        self.sock.close()  # the tap process' copy is the last: it stops listening when the drain begins
        if process is not None and process.returncode is None:
            try:
                await asyncio.wait_for(process.wait(), grace + STOP_MARGIN)
            except TimeoutError:
                event(logging.WARNING, "request tap process did not stop in time; killed", pid=process.pid)
                process.kill()
                await process.wait()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor

    def stopping(self) -> bool:
        return self._stopping

