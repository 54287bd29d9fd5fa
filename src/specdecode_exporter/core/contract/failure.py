"""Why a collection failed: the values of the ``reason`` label of ``specdecode_collect_errors_total``
(core/contract/metrics.py's COLLECT_ERRORS), part of the metric contract; the fetch, the collection and the rules
use them."""

from __future__ import annotations

from enum import StrEnum


class FailureReason(StrEnum):
    CONNECT = "connect"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"
    TOO_LARGE = "too_large"
    PARSE = "parse"
    NO_SPEC_METRICS = "no_spec_metrics"
    NO_LATENCY_METRICS = "no_latency_metrics"  # a control target (spec_decode: false) without TPOT histograms
