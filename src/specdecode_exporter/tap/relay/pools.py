"""Fail-over between the tap's two pools, tap-wide: whether the upstream and the fallback answer, and where a
request goes (the router's decision, sent to the upstream while the fallback is down)."""

from __future__ import annotations

import logging
import time

from specdecode_exporter.core.process.log import event
from specdecode_exporter.tap.model import Route, Router, TapRequest

SPECULATIVE_POOL, FALLBACK_POOL = 0, 1  # the upstreams of a routing tap (one pool, the first, without routing)
FALLBACK_RETRY_MIN, FALLBACK_RETRY_MAX = 0.5, 30.0  # seconds a failed fallback is not tried again (doubling)


class PoolHealth:
    """What every connection of one tap knows of its pools. Transitions are logged, never each request: a down
    upstream must not write a line per request."""

    def __init__(self, router: Router | None) -> None:
        self.router = router
        self.upstream_down: str | None = None  # the last connect failure, until a connect succeeds
        self.router_errors = 0
        self.fallback_down: str | None = None
        self.fallback_retry_at = 0.0  # monotonic: before this, requests for the fallback go to the upstream
        self.fallback_backoff = 0.0
        self.fallback_unresponsive: str | None = None  # its last health check failed (a connect alone is no proof)

    def connect_result(self, failure: str | None, pool: int = SPECULATIVE_POOL) -> None:
        """A connect to ``pool`` succeeded (None) or failed (why)."""
        if pool == FALLBACK_POOL:
            self.fallback_result(failure)
            return
        if failure and self.upstream_down is None:
            event(logging.WARNING, "request tap upstream unavailable", reason=failure)
        elif failure is None and self.upstream_down is not None:
            event(logging.INFO, "request tap upstream reachable again")
        self.upstream_down = failure

    def fallback_result(self, failure: str | None) -> None:
        """A failed fallback is not tried again for a while (0.5 s, doubling up to 30 s): meanwhile its requests go
        to the upstream at once (fallback_down) instead of each waiting for a connect that fails."""
        was_out = self._fallback_out()
        if failure is None:
            self.fallback_down, self.fallback_backoff = None, 0.0
        elif self.fallback_down is None or time.monotonic() >= self.fallback_retry_at:
            # (a failure of an attempt begun before this pause is not counted: one failed try doubles the pause)
            self.fallback_down = failure
            self.fallback_backoff = min(FALLBACK_RETRY_MAX, max(FALLBACK_RETRY_MIN, 2 * self.fallback_backoff))
            self.fallback_retry_at = time.monotonic() + self.fallback_backoff
        self._log_fallback(was_out)

    def fallback_checked(self, failure: str | None) -> None:
        """A health check of the fallback answered (None) or did not (why): until one answers again, nothing is
        routed to it, whatever its connects do (a stopped process still completes them)."""
        was_out = self._fallback_out()
        self.fallback_unresponsive = failure
        self._log_fallback(was_out)

    def _fallback_out(self) -> bool:
        return self.fallback_down is not None or self.fallback_unresponsive is not None

    def _log_fallback(self, was_out: bool) -> None:
        """One line when the fallback goes out of routing (a failed connect or health check), one when it is back."""
        if self._fallback_out() and not was_out:
            event(logging.WARNING, "request tap fallback unavailable: its requests go to the upstream",
                  reason=self.fallback_unresponsive or self.fallback_down)
        elif was_out and not self._fallback_out():
            event(logging.INFO, "request tap fallback reachable again")

    def fallback_available(self) -> bool:
        if self.fallback_unresponsive is not None:
            return False
        return self.fallback_down is None or time.monotonic() >= self.fallback_retry_at

    def route(self, request: TapRequest) -> Route | None:
        """Where the router sends ``request``; None (the upstream) if it fails: a router bug must not break the
        data path."""
        assert self.router is not None
        try:
            route = self.router.route(request)
        except Exception as exc:
            self.router_errors += 1
            if self.router_errors & (self.router_errors - 1) == 0:
                event(logging.ERROR, "request tap router failed", error=type(exc).__name__, count=self.router_errors)
            return None
        return route.failed_over() if route.to_fallback and not self.fallback_available() else route
