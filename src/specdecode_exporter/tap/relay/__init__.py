"""The request tap's data path: an HTTP/1.1 relay in front of vLLM's OpenAI API.

Each client connection gets its own upstream connection (opened when the client connects, closed when either side
closes), so keep-alive, pipelining and connection lifetimes are the upstream's own. Bytes are relayed as they arrive
with asyncio Protocols (no streams, no tasks per message); only the heads are parsed, and only the bodies of POST
/v1/completions and /v1/chat/completions are looked at. Anything not understood is forwarded untouched.

Its rooms, from the top: ``server`` (start, stats, close) > ``link`` (one client connection) > ``upstream`` (its
connection to the pools, routing and fail-over between them) > ``requests`` and ``responses`` (the two directions'
readers) > ``shared`` (settings, the observer) > ``pools`` (the pools' health, where a request goes) and
``exchange`` (one request and its response).
"""

from specdecode_exporter.tap.relay.server import (
    DEFAULT_MAX_INSPECT_BODY,
    Tap,
    TapStats,
    parse_upstream,
    start_tap,
)
from specdecode_exporter.tap.relay.shared import WRITE_HIGH_WATER, WRITE_LOW_WATER

__all__ = [
    "DEFAULT_MAX_INSPECT_BODY",
    "WRITE_HIGH_WATER",
    "WRITE_LOW_WATER",
    "Tap",
    "TapStats",
    "parse_upstream",
    "start_tap",
]
