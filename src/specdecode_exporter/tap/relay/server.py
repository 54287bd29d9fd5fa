"""The tap's listening side: start it, read its figures, stop it with a grace for the requests in flight."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from specdecode_exporter.core.process.log import event
from specdecode_exporter.tap.model import Observer, Router
from specdecode_exporter.tap.relay.fallback_watch import FALLBACK_CHECK_INTERVAL, FALLBACK_CHECK_TIMEOUT, FallbackWatch
from specdecode_exporter.tap.relay.link import Link
from specdecode_exporter.tap.relay.pools import FALLBACK_POOL
from specdecode_exporter.tap.relay.shared import Shared
from specdecode_exporter.tap.settings import TapSettings

DEFAULT_MAX_INSPECT_BODY = 8 * 1024 * 1024
DRAIN_POLL_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class TapStats:
    connections: int
    buffered_bytes: int  # bytes held by the relay: transport write buffers plus events held back
    fallback_available: bool | None = None  # routing: whether the fallback is tried (None: no routing)


class Tap:
    """A running tap. ``url`` is its base URL; ``close()`` stops listening, lets the requests in flight finish
    for up to ``grace`` seconds, and then drops every connection."""

    def __init__(self, server: asyncio.Server, host: str, port: int, shared: Shared,
                 fallback_watch: FallbackWatch | None = None) -> None:
        self._server = server
        self._links = shared.links
        self._shared = shared
        self._fallback_watch = fallback_watch
        self.host = host
        self.port = port
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def stats(self) -> TapStats:
        return TapStats(len(self._links), sum(link.buffered_bytes() for link in self._links),
                        self._shared.health.fallback_available() if self._shared.router is not None else None)

    async def close(self, grace: float = 0.0) -> None:
        self._server.close()
        if self._fallback_watch is not None:
            await self._fallback_watch.stop()
        # The grace is a promise in real (monotonic) time. uvloop's loop.time() is the loop's cached, millisecond-
        # truncated clock and asyncio may wake a timer up to its resolution early, so the deadline is kept and
        # checked on time.monotonic(): a stream is never cut before the grace has passed.
        deadline = time.monotonic() + grace
        in_flight = sum(not link.idle() for link in self._links)
        while True:
            for link in list(self._links):
                if link.idle():  # between requests: closed now (after what it still has to write)
                    link.close_client()
            left = deadline - time.monotonic()
            if not self._links or left <= 0:
                break
            await asyncio.sleep(min(DRAIN_POLL_SECONDS, left))
        cut = len(self._links)
        for link in list(self._links):
            link.abort()
        await self._server.wait_closed()
        event(logging.WARNING if cut else logging.INFO, "request tap stopped", port=self.port,
              in_flight_at_stop=in_flight, cut=cut)


async def start_tap(
    host: str,
    port: int,
    settings: TapSettings,
    observer: Observer,
    *,
    max_inspect_body: int = DEFAULT_MAX_INSPECT_BODY,
    sock: socket.socket | None = None,
    router: Router | None = None,
    fallback_check: tuple[float, float] = (FALLBACK_CHECK_INTERVAL, FALLBACK_CHECK_TIMEOUT),
) -> Tap:
    """Listen on host:port (0: any free port) and relay to ``settings.upstream`` (http://host:port) on the running
    event loop, as ``settings`` say (workload_header, connect_timeout); ``observer.observe`` is called on that loop
    for every inspected request.

    With a ``router``, each inspected request goes where ``router.route`` says: the upstream, or
    ``settings.route.fallback_upstream`` (a pool without speculative decoding); everything else goes to the
    upstream. The fallback's health is checked every ``fallback_check[0]`` seconds, each given ``fallback_check[1]``."""
    pools = [parse_upstream(settings.upstream)]
    if router is not None:
        if settings.route is None:
            raise ValueError("a routing tap needs a fallback upstream (tap.route.fallback_upstream)")
        pools.append(parse_upstream(settings.route.fallback_upstream))
    shared = Shared(
        pools=tuple(pools),
        router=router,
        observer=observer,
        workload_header=settings.workload_header.lower().encode("latin-1"),
        connect_timeout=settings.connect_timeout,
        max_inspect_body=max_inspect_body,
    )
    loop = asyncio.get_running_loop()
    # A socket the caller bound already (the sidecar binds at start, so a taken port is one line and exit 1).
    server = (await loop.create_server(lambda: Link(shared), sock=sock, backlog=1024) if sock is not None
              else await loop.create_server(lambda: Link(shared), host, port, backlog=1024))
    bound_port = int(server.sockets[0].getsockname()[1])
    event(
        logging.INFO,
        "request tap listening",
        address=f"{host}:{bound_port}",
        upstream=":".join(map(str, pools[0])),
        **({"fallback": ":".join(map(str, pools[1]))} if router is not None else {}),
    )
    watch = None
    if router is not None:
        def abandon() -> None:
            for link in list(shared.links):
                link.abandon_fallback()

        watch = FallbackWatch(pools[FALLBACK_POOL], shared.health, abandon, *fallback_check)
        watch.start()
    return Tap(server, host, bound_port, shared, watch)


def parse_upstream(base_url: str) -> tuple[str, int]:
    """(host, port) of an http:// base URL without a path; ValueError (naming no credentials) otherwise."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError("the tap's upstream must be an http://host:port URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the tap's upstream URL must not carry credentials: the tap forwards the client's own")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("the tap's upstream URL must not have a path: paths are forwarded as the client sent them")
    return parts.hostname, parts.port or 80
