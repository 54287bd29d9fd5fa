"""The request tap: a byte-for-byte relay in front of vLLM's OpenAI API that reports each completion's
per-request metrics to an Observer (docs/architecture.md §8; docs/tap-design.md)."""

from specdecode_exporter.tap.model import Observer, TapRequest, TapResult
from specdecode_exporter.tap.relay import Tap, TapStats, start_tap

__all__ = ["Observer", "Tap", "TapRequest", "TapResult", "TapStats", "start_tap"]
