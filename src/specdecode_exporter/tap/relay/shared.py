"""What every connection of one tap shares: its settings, its pools' health, its observer, the set of its links."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Protocol

from specdecode_exporter.core.process.log import event
from specdecode_exporter.tap.model import Observer, Router, TapRequest, TapResult
from specdecode_exporter.tap.relay.pools import PoolHealth

WRITE_HIGH_WATER = 64 * 1024  # per direction and connection: reading the other side pauses above this
WRITE_LOW_WATER = 16 * 1024


class Connection(Protocol):
    """What the tap asks of one of its client connections."""

    def idle(self) -> bool: ...
    def close_client(self) -> None: ...
    def abort(self) -> None: ...
    def buffered_bytes(self) -> int: ...
    def abandon_fallback(self) -> None: ...


class Shared:
    """Settings and state shared by every connection of one tap."""

    def __init__(
        self,
        *,
        pools: tuple[tuple[str, int], ...],
        router: Router | None,
        observer: Observer,
        workload_header: bytes,
        connect_timeout: float,
        max_inspect_body: int,
    ) -> None:
        self.pools = pools  # (host, port) of the upstream, and of the fallback when routing
        self.router = router
        self.health = PoolHealth(router)
        self.observer = observer
        self.workload_header = workload_header
        self.connect_timeout = connect_timeout
        self.max_inspect_body = max_inspect_body
        self.links: set[Connection] = set()
        self.observer_errors = 0

    def observe(self, request: TapRequest, result: TapResult) -> None:
        try:
            self.observer.observe(request, result)
        except Exception as exc:  # an observer bug must not break the data path
            self.observer_errors += 1
            if self.observer_errors & (self.observer_errors - 1) == 0:  # 1st, 2nd, 4th, 8th ...
                event(
                    logging.ERROR, "request tap observer failed", error=type(exc).__name__, count=self.observer_errors
                )


def tune(transport: asyncio.Transport) -> None:
    """Every relayed connection: no Nagle delay, and the write buffer limits flow control works with."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
