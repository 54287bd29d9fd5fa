"""The routing fallback's liveness, checked apart from the requests: a fallback that accepts connections but never
answers (a stopped process, a wedged server) passes every connect, so connect failures alone would let it hold each
request routed to it until the client gave up. A health check that goes unanswered takes it out of routing, and
the requests it holds without an answer go to the speculative pool, as when it closes them itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from specdecode_exporter.tap.relay.pools import PoolHealth
from specdecode_exporter.tap.relay.upstream import connect_failure

FALLBACK_CHECK_INTERVAL = 5.0  # seconds between health checks of the fallback
FALLBACK_CHECK_TIMEOUT = 2.0  # seconds a check waits for the status line, the connect included
HEALTH_PATH = "/health"  # vLLM's; any status below 500 says the server answers


async def check_fallback(host: str, port: int, timeout: float) -> str | None:
    """None when the server answers ``GET /health`` with an HTTP status below 500 within ``timeout``; else why not
    (one line)."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 literal in brackets
                writer.write(f"GET {HEALTH_PATH} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
                             .encode("latin-1"))
                status_line = await reader.readline()
            finally:
                writer.close()
    except TimeoutError:
        return f"no answer to a health check within {timeout:g} s"
    except OSError as exc:
        return f"health check failed: {connect_failure(exc)}"
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return "health check answered with something that is not HTTP"
    if int(parts[1]) >= 500:
        return f"health check answered {int(parts[1])}"
    return None


class FallbackWatch:
    """Checks the fallback every ``interval`` seconds while the tap runs; on a failed check, marks it unresponsive
    and calls ``abandon`` (which closes the connections whose requests it has not started answering)."""

    def __init__(self, address: tuple[str, int], health: PoolHealth, abandon: Callable[[], None],
                 interval: float = FALLBACK_CHECK_INTERVAL, timeout: float = FALLBACK_CHECK_TIMEOUT) -> None:
        self._address = address
        self._health = health
        self._abandon = abandon
        self._interval = interval
        self._timeout = timeout
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="fallback health check")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        host, port = self._address
        while True:
            await asyncio.sleep(self._interval)
            failure = await check_fallback(host, port, self._timeout)
            self._health.fallback_checked(failure)
            if failure is not None:
                self._abandon()

