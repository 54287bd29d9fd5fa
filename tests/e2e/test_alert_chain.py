"""The real alert chain, end to end (issue #6 A): fake vLLM → sidecar → Debian's Prometheus with the generated
rules (python -m specdecode_exporter.monitoring.build --profile e2e) → Debian's Alertmanager with the example
routing tree → a webhook.

One chain per module; the tests run in file order on it (each waits for the state it needs first):

1. a vLLM restart (counters back to 0) does not page and produces no bogus low α;
2. a short blip (α 0.35 for less than the page's `for:`) does not page;
3. α 0.75 → 0.35: the critical page reaches the pager webhook with the right labels and annotations, within
   the bound below; α recovers: the resolved notification arrives;
4. a dip that does cross the threshold but recovers within `for:` goes pending and does not page.

Detection delay (test 3). t_cross = the timestamp of the first sample of the page's recording rule
(model:specdecode_acceptance_ratio:rate<short window>) below the threshold, read back from Prometheus after the
fact, so it is the evaluation time, not a poll time. Then:

    Prometheus firing − t_cross  <= for + 2 × evaluation_interval
        (one interval: the alert group evaluates after the recording group; one: `for:` rounds up to a tick)
    webhook received − t_cross    <= for + 2 × evaluation_interval + group_wait + DELIVERY_SLACK_S
        (Alertmanager waits group_wait before the first notification of a new group; the slack covers two
        loopback HTTP hops on a loaded CI machine)

The delay from the switch of α is also reported, not bounded: from a window full of α = 0.75 the windowed α needs
window × (0.75 − 0.5) / (0.75 − 0.35) ≈ 37.5 s of a 1m window to cross; here less, as the blip of test 2 is still in
the window (the report prints the windowed α at the switch).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools import chain as c

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LOW_ALPHA = 0.35
DELIVERY_SLACK_S = 2.0
NS = f'namespace="{c.NAMESPACE}"'


def vllm_draft_tokens(text: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "vllm:spec_decode_num_draft_tokens_total")


def observe(chain: c.Chain, seconds: float, forbid: set[str]) -> tuple[float, float]:
    """Poll for `seconds`: the page alert never in a state of `forbid`; returns (min, max) of the page's α."""
    lo, hi = 1.0, 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        chain.check_alive()
        states = chain.page_states()
        assert not states & forbid, f"{c.PAGE_ALERT} is {states}\n{chain.diagnostics()}"
        alpha = chain.alpha()
        if alpha is not None:
            lo, hi = min(lo, alpha), max(hi, alpha)
        time.sleep(0.25)
    return lo, hi


def first_at_or_after(samples: list[tuple[float, float]], pred: Any) -> float | None:
    return next((t for t, v in samples if pred(v)), None)


def report(record: list[dict[str, Any]], line: str, **figures: Any) -> None:
    print("\n" + line, flush=True)
    record.append({"line": line, **figures})


def test_vllm_restart_does_not_page(chain: c.Chain, record: list[dict[str, Any]]) -> None:
    chain.wait_healthy(min_history_s=10)
    before = vllm_draft_tokens(chain.vllm_metrics())
    t0 = time.time()
    chain.restart_vllm()
    after = vllm_draft_tokens(chain.vllm_metrics())
    assert after < before, f"the fake vLLM's counters did not go back to 0 ({before} → {after})"

    # A bogus α would show within a collection + a scrape + an evaluation; "never pending" is what rules out a page.
    observe_s = 10.0
    lo, hi = observe(chain, observe_s, forbid={"pending", "firing"})

    rng = f"{int(time.time() - t0) + 5}s"
    # The sidecar's counters stay monotonic across vLLM's restart, so Prometheus sees no counter reset ...
    for name in ("specdecode_drafts_total", "specdecode_draft_tokens_total", "specdecode_accepted_tokens_total"):
        resets = chain.query(f"resets({name}{{{NS}}}[{rng}])")
        assert resets, f"no {name} in Prometheus"
        assert all(float(r["value"][1]) == 0 for r in resets), f"{name} reset: {resets}"
    # ... no collection interval around the restart was observed as low α ...
    low = chain.query(f'increase(specdecode_interval_acceptance_ratio_bucket{{{NS}, le="0.5"}}[{rng}])')
    assert low, "no specdecode_interval_acceptance_ratio_bucket{le=\"0.5\"} in Prometheus"
    assert all(float(r["value"][1]) == 0 for r in low), f"intervals with α <= 0.5 after the restart: {low}"
    # ... and neither the sidecar's windowed α nor the fleet α the page uses moved.
    for expr in (chain.alpha_record + chain.model_selector, f'specdecode_acceptance_ratio{{{NS}, window="1m"}}'):
        values = [v for _, v in chain.samples(expr, t0)]
        assert values, f"no samples of {expr} after the restart"
        assert min(values) >= c.HEALTHY_ALPHA - 0.05 and max(values) <= c.HEALTHY_ALPHA + 0.05, (expr, values)
    assert chain.alert_transitions(t0) == {}
    assert not chain.webhook.find(receiver="/pager", since=t0)
    report(record, f"vLLM restart: no page, {c.PAGE_ALERT} never pending; α stayed {lo:.3f}..{hi:.3f} "
                   f"over {observe_s:g}s, no counter reset, no interval with α <= 0.5",
           scenario="restart", alpha_min=lo, alpha_max=hi)


def test_short_blip_does_not_page(chain: c.Chain, record: list[dict[str, Any]]) -> None:
    chain.wait_healthy(min_history_s=30)
    blip_s = chain.page_for_s * 2 / 3
    t0 = time.time()
    chain.phase(acceptance_rate=LOW_ALPHA)
    try:
        lo1, _ = observe(chain, blip_s, forbid={"pending", "firing"})
    finally:
        chain.phase(resume=True)
    # The windowed α is lowest when the blip ends; a collection, a scrape and an evaluation later it shows.
    settle_s = c.COLLECT_INTERVAL_S + c.SCRAPE_INTERVAL_S + 2 * c.EVALUATION_INTERVAL_S + c.GROUP_WAIT_S
    lo2, _ = observe(chain, settle_s, forbid={"pending", "firing"})
    lo = min(lo1, lo2)
    assert lo < c.HEALTHY_ALPHA - 0.02, f"the blip did not show in {chain.alpha_record} (min {lo:.3f})"
    assert chain.alert_transitions(t0) == {}, "the page alert went pending/firing during the blip"
    assert not chain.webhook.find(receiver="/pager", since=t0)
    report(record, f"blip: α {LOW_ALPHA} for {blip_s:g}s (< for: {chain.page_for_s:g}s): no page, never pending; "
                   f"{chain.alpha_record} dipped to {lo:.3f}",
           scenario="blip", blip_s=blip_s, alpha_min=lo)


def test_page_fires_and_resolves(chain: c.Chain, record: list[dict[str, Any]]) -> None:
    window_s = c.seconds(chain.page_window)
    for_s, thr, ev = chain.page_for_s, chain.page_threshold, c.EVALUATION_INTERVAL_S
    # A full window of history, as on a real server; α >= threshold + 0.1 rather than back at 0.75, so the test does
    # not wait for the blip's samples to leave the window (the delay under test is measured from the crossing).
    chain.wait_healthy(min_alpha=thr + 0.1, min_history_s=window_s)
    alpha_at_switch = chain.alpha()
    t_switch = time.time()
    chain.phase(acceptance_rate=LOW_ALPHA)
    page = chain.webhook.wait_for(window_s + for_s + 60, receiver="/pager", alertname=c.PAGE_ALERT,
                                  status="firing", since=t_switch)
    assert page is not None, f"no page within {window_s + for_s + 60:g}s\n{chain.diagnostics()}"

    alpha_samples = chain.samples(chain.alpha_record + chain.model_selector, t_switch)
    t_cross = first_at_or_after(alpha_samples, lambda v: v < thr)
    assert t_cross is not None, f"{chain.alpha_record} never read < {thr}: {alpha_samples[-5:]}"
    states = chain.alert_transitions(t_switch)
    assert {"pending", "firing"} <= set(states), states
    pending_to_firing = states["firing"] - states["pending"]
    prom_delay = states["firing"] - t_cross
    delay = page.received - t_cross
    prom_bound = for_s + 2 * ev
    bound = prom_bound + c.GROUP_WAIT_S + DELIVERY_SLACK_S
    assert pending_to_firing >= for_s - 0.01, f"fired {pending_to_firing:.2f}s after pending, before for: {for_s}s"
    assert prom_delay <= prom_bound, f"Prometheus fired {prom_delay:.2f}s after α crossed; bound {prom_bound:g}s"
    assert delay <= bound, f"page arrived {delay:.2f}s after α crossed; bound {bound:g}s\n{chain.diagnostics()}"

    # What the person paged sees.
    assert page.payload["receiver"] == "pager"
    (alert,) = page.alerts(c.PAGE_ALERT, "firing")
    assert alert["labels"] == {"alertname": c.PAGE_ALERT, "severity": "critical", "namespace": c.NAMESPACE,
                               "model_name": c.MODEL}, alert["labels"]
    ann = alert["annotations"]
    assert ann["summary"] == f"Speculative decoding acceptance rate for {c.MODEL} is below {thr:.0%}", ann
    assert c.MODEL in ann["description"] and f"(namespace {c.NAMESPACE})" in ann["description"], ann
    value = re.search(r"accepted only ([0-9.]+)%", ann["description"])
    assert value is not None and LOW_ALPHA * 100 <= float(value.group(1)) < thr * 100, ann["description"]
    assert ann["runbook_url"].endswith("/alerts/runbook.md#" + c.PAGE_ALERT.lower()), ann
    assert not chain.webhook.find(receiver="/ticket", alertname=c.PAGE_ALERT), "the page was routed to the tickets"

    # Recovery.
    t_resume = time.time()
    chain.phase(resume=True)
    resolved = chain.webhook.wait_for(window_s + 60, receiver="/pager", alertname=c.PAGE_ALERT, status="resolved",
                                      since=t_resume)
    assert resolved is not None, f"no resolved notification within {window_s + 60:g}s\n{chain.diagnostics()}"
    assert resolved.alerts(c.PAGE_ALERT, "resolved")[0]["labels"] == alert["labels"]
    t_recross = first_at_or_after(chain.samples(chain.alpha_record + chain.model_selector, t_resume),
                                  lambda v: v >= thr)
    assert t_recross is not None
    resolve_delay = resolved.received - t_recross
    resolve_bound = 2 * ev + c.GROUP_INTERVAL_S + DELIVERY_SLACK_S
    assert resolve_delay <= resolve_bound, f"resolved {resolve_delay:.2f}s after α recovered; bound {resolve_bound:g}s"
    pages = chain.webhook.find(receiver="/pager", alertname=c.PAGE_ALERT, status="firing", since=t_switch)
    assert len(pages) == 1, f"{len(pages)} firing pages for one incident"

    report(record,
           f"page: α {c.HEALTHY_ALPHA} → {LOW_ALPHA} at t=0 (windowed α then {alpha_at_switch:.3f}); "
           f"{chain.alpha_record} < {thr:g} at "
           f"+{t_cross - t_switch:.1f}s; pending +{states['pending'] - t_switch:.1f}s; firing "
           f"+{states['firing'] - t_switch:.1f}s; page at webhook +{page.received - t_switch:.1f}s.\n"
           f"  detection delay (α crossed → page received): {delay:.1f}s (bound: for {for_s:g}s + 2×{ev:g}s eval "
           f"+ group_wait {c.GROUP_WAIT_S:g}s + {DELIVERY_SLACK_S:g}s = {bound:g}s); Prometheus firing "
           f"{prom_delay:.1f}s after the crossing (bound {prom_bound:g}s).\n"
           f"  recovery: resume at +{t_resume - t_switch:.1f}s; α >= {thr:g} +{t_recross - t_resume:.1f}s later; "
           f"resolved at webhook {resolve_delay:.1f}s after that (bound {resolve_bound:g}s).",
           scenario="page", alpha_at_switch=alpha_at_switch, switch_to_cross_s=t_cross - t_switch,
           detection_delay_s=delay,
           switch_to_page_s=page.received - t_switch, prometheus_delay_s=prom_delay,
           pending_to_firing_s=pending_to_firing, resolve_delay_s=resolve_delay, bound_s=bound)


def test_dip_shorter_than_for_does_not_page(chain: c.Chain, record: list[dict[str, Any]]) -> None:
    """α crosses the threshold, so the page goes pending; it recovers before `for:` elapses: no page.

    A 1m-window α cannot climb back on its own within the e2e profile's 15s `for:` (the low samples stay in the
    window), so the recovery is a burst of fully accepted drafts (5× traffic at α = 1): it outweighs the dip at once.
    """
    thr, for_s = chain.page_threshold, chain.page_for_s
    chain.wait_healthy(min_alpha=thr + 0.03)
    t0 = time.time()
    chain.phase(acceptance_rate=0.0)
    try:
        chain.wait(lambda: "pending" in chain.page_states(), 90, f"{c.PAGE_ALERT} pending")
    finally:
        chain.phase(acceptance_rate=1.0, drafts_per_second=5 * c.DRAFTS_PER_SECOND)
    try:
        chain.wait(lambda: (chain.alpha() or 0.0) >= thr + 0.03 and not chain.page_states(), for_s,
                   f"{chain.alpha_record} back above {thr + 0.03:g} before for: elapsed")
    finally:
        chain.phase(resume=True)
    # Inactive again: a page would now need a new pending period of for:. Watch long enough for a stray notification.
    observe(chain, 2 * c.EVALUATION_INTERVAL_S + c.GROUP_WAIT_S + DELIVERY_SLACK_S, forbid={"firing"})

    pending = chain.samples(f'ALERTS{{alertname="{c.PAGE_ALERT}", alertstate="pending", {NS}}}', t0)
    assert pending, "the page alert never went pending"
    assert "firing" not in chain.alert_transitions(t0)
    assert not chain.webhook.find(receiver="/pager", since=t0)
    held = pending[-1][0] - pending[0][0] + c.EVALUATION_INTERVAL_S
    assert held < for_s
    report(record, f"dip: α crossed {thr:g}, {c.PAGE_ALERT} pending for ~{held:.0f}s (< for: {for_s:g}s), "
                   "recovered: no page", scenario="dip", pending_s=held)
