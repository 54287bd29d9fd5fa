"""Pure functions: what generation produced and what it cost over a window, and the same against a control target
(the same model with spec decode off): the speculative token share, generated tokens per second, preemptions per
finished request, mean KV-cache usage and requests waiting.

Every function returns None when its inputs cannot support an answer (no generation, no finished requests, no
control target).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from specdecode_exporter.pipeline.derive import speculative_token_share
from specdecode_exporter.pipeline.latency import ratio
from specdecode_exporter.pipeline.store import WindowSpan, optional_minus, positions_minus


class CapacityStats(NamedTuple):
    """One series (or a control target's engines pooled) over one window: the window's counts, and what they make."""

    seconds: float
    emitted_tokens: float | None  # by speculative steps: drafts + accepted
    generated_tokens: float | None
    preemptions: float | None
    finished_requests: float | None
    kv_cache_usage: float | None  # mean over the window, 1 = full (pooled: the engines' mean)
    requests_waiting: float | None  # mean over the window (pooled: per engine)
    engines: int = 1
    scheduled_steps: tuple[float, ...] = ()  # scheduler steps by the k a batch-size schedule chose (index = k)
    draft_tokens: float | None = None  # drafted over the window (None: not counted at both ends)

    @property
    def speculative_token_share(self) -> float | None:
        return speculative_token_share(self.emitted_tokens, self.generated_tokens)

    @property
    def generated_tokens_per_second(self) -> float | None:
        """Per engine."""
        if self.generated_tokens is None or self.seconds <= 0:
            return None
        return self.generated_tokens / self.seconds / self.engines

    @property
    def preemptions_per_request(self) -> float | None:
        return ratio(self.preemptions, self.finished_requests)


def _per_second(amount: float | None, seconds: float) -> float | None:
    return amount / seconds if amount is not None and seconds > 0 else None


def has_capacity(span: WindowSpan) -> bool:
    """Whether the source counts generated tokens, preemptions or KV usage over the span (capacity_stats has
    something to say), without working it out."""
    start, end = span.start, span.end
    return ((end.generated_tokens is not None and start.generated_tokens is not None)
            or (end.preemptions is not None and start.preemptions is not None)
            or (end.kv_cache_seconds is not None and start.kv_cache_seconds is not None))


def capacity_stats(span: WindowSpan) -> CapacityStats | None:
    """None when the source counts neither generated tokens, preemptions nor KV usage."""
    if not has_capacity(span):
        return None
    start, end, seconds = span.start, span.end, span.seconds
    generated = optional_minus(end.generated_tokens, start.generated_tokens)
    preemptions = optional_minus(end.preemptions, start.preemptions)
    kv_seconds = optional_minus(end.kv_cache_seconds, start.kv_cache_seconds)
    finished = None
    if end.time_per_output_token is not None and start.time_per_output_token is not None:
        finished = end.time_per_output_token.observations - start.time_per_output_token.observations
    return CapacityStats(seconds, optional_minus(end.emitted_tokens, start.emitted_tokens), generated, preemptions,
                         finished, _per_second(kv_seconds, seconds),
                         _per_second(optional_minus(end.waiting_seconds, start.waiting_seconds), seconds), 1,
                         positions_minus(end.scheduled_steps, start.scheduled_steps),
                         optional_minus(end.draft_tokens, start.draft_tokens))


def _sum(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def pooled(stats: Sequence[CapacityStats]) -> CapacityStats | None:
    """Several engines (a control target's) as one: counts summed (rates stay per engine), gauges averaged."""
    if not stats:
        return None
    return CapacityStats(max(s.seconds for s in stats), _sum([s.emitted_tokens for s in stats]),
                         _sum([s.generated_tokens for s in stats]), _sum([s.preemptions for s in stats]),
                         _sum([s.finished_requests for s in stats]), _mean([s.kv_cache_usage for s in stats]),
                         _mean([s.requests_waiting for s in stats]), sum(s.engines for s in stats))


class AgainstControl(NamedTuple):
    """A spec-decode series against its control target over the same window."""

    preemptions_per_request_increase: float | None  # this series' minus the control's
    throughput_ratio: float | None  # generated tokens/s over the control's per engine, only while this one queues
    kv_cache_usage: float | None
    control_kv_cache_usage: float | None
    control: str  # in words: the control target "vllm-nospec"


def against_control(spec: CapacityStats, control: CapacityStats, control_name: str,
                    min_waiting_requests: float) -> AgainstControl:
    """At comparable load: the throughput ratio counts only while the spec-decode series had at least
    ``min_waiting_requests`` waiting on average (it ran at its capacity, so serving fewer tokens per second than the
    control is capacity it lost, not demand it did not get)."""
    increase = (spec.preemptions_per_request - control.preemptions_per_request
                if spec.preemptions_per_request is not None and control.preemptions_per_request is not None else None)
    queued = spec.requests_waiting is not None and spec.requests_waiting >= min_waiting_requests
    throughput = ratio(spec.generated_tokens_per_second, control.generated_tokens_per_second) if queued else None
    return AgainstControl(increase, throughput, spec.kv_cache_usage, control.kv_cache_usage, control_name)
