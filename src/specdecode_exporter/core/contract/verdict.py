"""The verdict: one definition, used by the status page, `check`, /api/v1/status and `specdecode_verdict`, and
written as PromQL (``verdictCode`` in mixin/lib/promql.libsonnet) for the dashboard's fleet view from the same
bands (the monitoring config's ``verdict`` and ``thresholds.page_acceptance_ratio``).

The speedup it judges is the observed one (baseline TPOT / current TPOT) when a baseline exists, else the
modelled one (docs/architecture.md, "Break-even model"):

* no traffic: no α over the window;
* hurting: speedup below ``hurting_below``;
* marginal: speedup below ``paying_off_from``, or α below the page threshold (the page fires), or the
  observed P99 speedup below ``hurting_below`` while the mean is above it (a tail regression), or, against a
  control target, more preemptions per request than ``capacity.max_preemptions_per_request_increase`` above the
  control's or a throughput below ``capacity.min_throughput_ratio`` of the control's at comparable load (the
  speedup costs memory or capacity: a P50 win that preempts is not paying off);
* paying off: otherwise.

Two states come before any band: "not speculating" (the series drafted before and generates now without drafting:
sidecar/series.py's speculation, from the counters' standstill; nothing is judged on latency measured while it still
speculated) and "no data" (the target could not be read for longer than the grace: its windows went stale).

The verdict in force has hysteresis (``hold``): a different band verdict replaces it only once it has been the
judgement at every evaluation for ``VerdictBands.hold_seconds``, or at once when it still holds with every figure it
is judged on moved ``VerdictBands.margin`` toward the verdict in force (it passes the band edge by that margin). The
two states above take effect at once, both ways: they are facts, not judgements near an edge.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class Verdict(StrEnum):
    NO_TRAFFIC = "no traffic"
    NOT_SPECULATING = "not speculating"
    NO_DATA = "no data"
    HURTING = "hurting"
    MARGINAL = "marginal"
    PAYING_OFF = "paying off"

    @property
    def code(self) -> int | None:
        """The number the PromQL form of the verdict evaluates to (no traffic: no sample)."""
        return _CODES[self]


_CODES = {Verdict.NO_TRAFFIC: None, Verdict.NOT_SPECULATING: None, Verdict.NO_DATA: None, Verdict.HURTING: 0,
          Verdict.MARGINAL: 1, Verdict.PAYING_OFF: 2}
VERDICT_BY_CODE = {code: verdict for verdict, code in _CODES.items() if code is not None}


@dataclass(frozen=True, slots=True)
class CapacityBounds:
    """What spec decode may cost against a control target (the monitoring config's cost_vs_control)."""

    max_preemptions_per_request_increase: float = 0.05  # preemptions per finished request above the control's
    min_throughput_ratio: float = 0.9  # generated tokens/s per engine over the control's, at comparable load
    min_waiting_requests: float = 1.0  # comparable load: the spec-decode engine queues at least this many on average


@dataclass(frozen=True, slots=True)
class VerdictBands:
    page_acceptance_ratio: float = 0.5  # α below this pages; the verdict is then at best "marginal"
    hurting_below: float = 1.0  # speedup below this: hurting
    paying_off_from: float = 1.1  # speedup from this (α not below the page threshold): paying off
    capacity: CapacityBounds = CapacityBounds()
    hold_seconds: float = 60.0  # a new band verdict replaces the one in force once it has held this long ...
    margin: float = 0.05  # ... or at once when it holds with every figure moved this much toward the one in force


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one series' verdict is judged on, over one window."""

    acceptance_ratio: float | None
    modelled_speedup: float | None
    observed_speedup: float | None = None  # mean TPOT ratio, baseline / current
    observed_speedup_p50: float | None = None
    observed_speedup_p99: float | None = None
    baseline: str | None = None  # what the observed speedup is against, in words ('the control target "x"')
    preemptions_per_request_increase: float | None = None  # against the control target
    throughput_ratio: float | None = None  # against the control target, at comparable load
    not_speculating: str | None = None  # it drafted before and generates without drafting now: why, in words
    no_data: str | None = None  # the target could not be read for longer than the grace: since when, in words


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    basis: str  # "observed", "modelled" or "none"
    reason: str  # the why, in words, for the status page and `check`

    @property
    def sample(self) -> float | None:
        """specdecode_verdict's value: 1, or none at all where the target's windows went stale ("no data")."""
        return None if self.verdict is Verdict.NO_DATA else 1.0


def judge(evidence: Evidence, bands: VerdictBands) -> Judgement:
    if evidence.no_data is not None:
        return Judgement(Verdict.NO_DATA, "none", evidence.no_data)
    if evidence.not_speculating is not None:
        return Judgement(Verdict.NOT_SPECULATING, "none", evidence.not_speculating)
    alpha = evidence.acceptance_ratio
    observed = evidence.observed_speedup is not None
    speedup = evidence.observed_speedup if observed else evidence.modelled_speedup
    if alpha is None or speedup is None:
        return Judgement(Verdict.NO_TRAFFIC, "none", "no drafted tokens in the window")
    basis = "observed" if observed else "modelled"
    said = _speedup_words(evidence, speedup)
    if speedup < bands.hurting_below:
        return Judgement(Verdict.HURTING, basis, f"{said}: below {bands.hurting_below:g}×")
    p99 = evidence.observed_speedup_p99
    if p99 is not None and p99 < bands.hurting_below:
        return Judgement(Verdict.MARGINAL, basis, f"{said}, P99 {p99:.2f}×: tail regression")
    cost = _capacity_cost(evidence, bands.capacity)
    if cost is not None:
        return Judgement(Verdict.MARGINAL, basis, f"{said}, but {cost}")
    if alpha < bands.page_acceptance_ratio:
        return Judgement(Verdict.MARGINAL, basis,
                         f"{said}, but α {alpha:.2f} is below the page threshold {bands.page_acceptance_ratio:g}")
    if speedup < bands.paying_off_from:
        return Judgement(Verdict.MARGINAL, basis, f"{said}: below {bands.paying_off_from:g}×")
    return Judgement(Verdict.PAYING_OFF, basis, said)


def _capacity_cost(evidence: Evidence, bounds: CapacityBounds) -> str | None:
    """What the speedup costs beyond the bounds, in words; None within them (or without a control)."""
    increase = evidence.preemptions_per_request_increase
    if increase is not None and increase > bounds.max_preemptions_per_request_increase:
        return (f"{increase:.2f} more preemptions per request than the control "
                f"(bound {bounds.max_preemptions_per_request_increase:g}): it costs KV-cache memory")
    throughput = evidence.throughput_ratio
    if throughput is not None and throughput < bounds.min_throughput_ratio:
        return (f"{throughput:.2f}× the control's generated tokens/s while requests wait "
                f"(bound {bounds.min_throughput_ratio:g}×): it costs capacity")
    return None


def _speedup_words(evidence: Evidence, speedup: float) -> str:
    if evidence.observed_speedup is None:
        return f"modelled {speedup:.2f}×"
    against = f" against {evidence.baseline}" if evidence.baseline else ""
    return f"observed {speedup:.2f}×{against}"


BANDS = frozenset((Verdict.HURTING, Verdict.MARGINAL, Verdict.PAYING_OFF))


@dataclass(frozen=True, slots=True)
class HeldVerdict:
    """The verdict in force for one series, and the different one waiting out the hold (if any)."""

    judgement: Judgement  # in force: its reason says what the latest evaluation found
    since: float  # when it came into force (the collector's clock)
    pending: Verdict | None = None  # the judgement at every evaluation since pending_since, different from it
    pending_since: float | None = None


def nudged(evidence: Evidence, by: float) -> Evidence:
    """The evidence with every figure the bands judge moved ``by`` toward a better verdict (negative: worse)."""

    def up(value: float | None, sign: float = 1.0) -> float | None:
        return None if value is None else value + sign * by

    return replace(evidence, acceptance_ratio=up(evidence.acceptance_ratio),
                   modelled_speedup=up(evidence.modelled_speedup), observed_speedup=up(evidence.observed_speedup),
                   observed_speedup_p99=up(evidence.observed_speedup_p99),
                   preemptions_per_request_increase=up(evidence.preemptions_per_request_increase, -1.0),
                   throughput_ratio=up(evidence.throughput_ratio))


def decisive(in_force: Verdict, found: Judgement, evidence: Evidence, bands: VerdictBands) -> bool:
    """Whether ``found`` still holds with every figure moved ``bands.margin`` toward the verdict in force."""
    found_code, in_force_code = found.verdict.code, in_force.code
    assert found_code is not None and in_force_code is not None
    toward = bands.margin if found_code < in_force_code else -bands.margin
    return judge(nudged(evidence, toward), bands).verdict is found.verdict


def hold(held: HeldVerdict | None, evidence: Evidence, bands: VerdictBands, now: float) -> HeldVerdict:
    """The verdict in force after one more evaluation of ``evidence`` at ``now``."""
    found = judge(evidence, bands)
    if held is None or found.verdict is held.judgement.verdict:
        return HeldVerdict(found, now if held is None else held.since)
    in_force = held.judgement.verdict
    if (found.verdict not in BANDS or in_force not in BANDS or decisive(in_force, found, evidence, bands)):
        return HeldVerdict(found, now)
    since = held.pending_since if held.pending is found.verdict and held.pending_since is not None else now
    if now - since >= bands.hold_seconds:
        return HeldVerdict(found, now)
    reason = (f"held: {found.reason} ({found.verdict} for {now - since:.0f} s; that takes over once it has held "
              f"{bands.hold_seconds:g} s, or at once {bands.margin:g} past the band edge)")
    return HeldVerdict(Judgement(in_force, found.basis, reason), held.since, found.verdict, since)
