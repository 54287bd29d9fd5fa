"""`specdecode-exporter probe` against the simulator over real loopback HTTP: α by temperature, per-request metrics
on and off (the counter-delta fallback), other traffic, prompt groups, a no-spec baseline and the 1.3× rule, the
output formats and the plot, the one-line faults, Ctrl-C, the bounds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.procs import free_port, ignoring_sigint
from specdecode_exporter.cli import main
from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.server import serve_in_thread

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CLI = [sys.executable, "-m", "specdecode_exporter.cli", "probe"]
QUICK = ["--requests", "8", "--max-tokens", "200", "--settle", "100ms"]
IDLE = ModelSpec(drafts_per_second=0.0)


@contextlib.contextmanager
def simulator(spec: ModelSpec = IDLE, **options: Any) -> Iterator[str]:
    sim = Simulator(steady_scenario(spec), **options)
    server, url = serve_in_thread(sim)
    try:
        yield url
    finally:
        server.stop()


def probe_json(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> list[dict[str, Any]]:
    assert main(["probe", *QUICK, "--json", *args]) == code
    out, _ = capsys.readouterr()
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def one_group(tmp_path: Path, prompts: list[dict[str, Any]] | None = None) -> str:
    path = tmp_path / "prompts.jsonl"
    items = prompts or [{"prompt": "summarize the following text please"}, {"prompt": "write a function"}]
    path.write_text("".join(json.dumps(p) + "\n" for p in items))
    return str(path)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def test_alpha_falls_with_temperature_as_the_simulator_says(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    spec = ModelSpec(drafts_per_second=0.0, acceptance_rate=0.8, temperature_sensitivity=0.5)
    with simulator(spec) as url:
        cold, hot = probe_json(capsys, "--url", url, "--temperatures", "0,1", "--prompts", one_group(tmp_path))
    assert (cold["temperature"], hot["temperature"]) == (0.0, 1.0)
    assert cold["group"] == hot["group"] == "all"
    assert cold["source"] == "per-request" and cold["tpot_source"] == "server"
    assert cold["acceptance_ratio"] == pytest.approx(0.8, abs=0.05)
    assert hot["acceptance_ratio"] == pytest.approx(0.8 * (1 - 0.5), abs=0.05)  # α·(1 − sensitivity·T)
    assert hot["acceptance_ratio"] / cold["acceptance_ratio"] == pytest.approx(0.5, abs=0.08)
    for row in (cold, hot):
        assert row["requests"] == 8 and row["completion_tokens"] == 8 * 200
        assert row["mean_acceptance_length"] == pytest.approx(1 + row["accepted_tokens"] / row["drafts"])
        positions = row["position_acceptance_ratios"]
        assert len(positions) == 3 and positions == sorted(positions, reverse=True)
        assert sum(positions) * row["drafts"] == pytest.approx(row["accepted_tokens"])
        assert row["tpot_p50_seconds"] <= row["tpot_p99_seconds"]
    assert cold["tpot_p50_seconds"] < hot["tpot_p50_seconds"]  # more tokens per step at the higher α


def test_counter_fallback_gives_the_same_alpha_on_an_idle_server(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    spec = ModelSpec(drafts_per_second=0.0, acceptance_rate=0.7)
    prompts = one_group(tmp_path)
    with simulator(spec) as url:
        exact = probe_json(capsys, "--url", url, "--temperatures", "0,0.5", "--prompts", prompts)
    with simulator(spec, per_request_metrics="none") as url:
        fallback = probe_json(capsys, "--url", url, "--temperatures", "0,0.5", "--prompts", prompts)
    assert [r["source"] for r in exact] == ["per-request"] * 2
    assert [r["source"] for r in fallback] == ["counters"] * 2
    for a, b in zip(exact, fallback, strict=True):
        assert b["shared_traffic"] is False
        assert b["acceptance_ratio"] == pytest.approx(a["acceptance_ratio"], abs=0.03)
        assert b["position_acceptance_ratios"] == pytest.approx(a["position_acceptance_ratios"], abs=0.05)
        assert b["mean_acceptance_length"] == pytest.approx(a["mean_acceptance_length"], abs=0.1)
    with simulator(spec, per_request_metrics="none") as url:
        assert main(["probe", *QUICK, "--url", url, "--temperatures", "0", "--prompts", prompts]) == 0
    table = capsys.readouterr().out
    assert "counter deltas" in table and "--per-request-spec-decode-metrics summary" in table


def test_other_traffic_is_refused_without_per_request_metrics_and_marked_with_the_flag(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    busy = ModelSpec(drafts_per_second=50.0, acceptance_rate=0.7)  # background drafts between the probe's requests
    args = ["--temperatures", "0,1", "--prompts", one_group(tmp_path)]
    with simulator(busy, per_request_metrics="none") as url:
        assert main(["probe", *QUICK, "--url", url, *args]) == 1
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 2  # the progress line of the first response, then the refusal
        refusal = err.splitlines()[-1]
        assert "other traffic" in refusal and "--allow-shared-traffic" in refusal
        assert "--per-request-spec-decode-metrics summary" in refusal
        rows = probe_json(capsys, "--url", url, *args, "--allow-shared-traffic")
    assert [(r["source"], r["shared_traffic"]) for r in rows] == [("counters, shared", True)] * 2
    assert all(r["notes"] for r in rows)


def test_per_request_alpha_ignores_other_traffic(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Exact numbers need no quiet server: a thread sends temperature-1 requests all along."""
    stop = threading.Event()
    with simulator(ModelSpec(drafts_per_second=0.0, acceptance_rate=0.8)) as url:
        def other_traffic() -> None:
            with httpx.Client() as client:
                while not stop.is_set():
                    client.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 100,
                                                               "temperature": 1.0})

        thread = threading.Thread(target=other_traffic, daemon=True)
        thread.start()
        try:
            (row,) = probe_json(capsys, "--url", url, "--temperatures", "0", "--prompts", one_group(tmp_path))
        finally:
            stop.set()
            thread.join(10)
    assert row["source"] == "per-request" and row["acceptance_ratio"] == pytest.approx(0.8, abs=0.05)


def test_groups_from_jsonl_and_chat(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    prompts = one_group(tmp_path, [
        {"messages": [{"role": "user", "content": "def add(a, b):"}], "group": "code"},
        {"messages": [{"role": "user", "content": "hello there"}], "group": "chat"},
        {"prompt": "def sub(a, b):", "group": "code"},
    ])
    with simulator() as url:
        rows = probe_json(capsys, "--url", url, "--chat", "--temperatures", "0.2,0.7", "--prompts", prompts,
                          "--requests", "3")
    assert [(r["temperature"], r["group"], r["requests"]) for r in rows] == [
        (0.2, "code", 3), (0.2, "chat", 3), (0.7, "code", 3), (0.7, "chat", 3)]
    assert all(r["acceptance_ratio"] is not None for r in rows)


def test_baseline_gives_the_observed_speedup_and_the_ship_rule(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    spec = ModelSpec(drafts_per_second=0.0, acceptance_rate=0.9, cost_per_draft_token=0.5)
    control = ModelSpec(drafts_per_second=0.0, spec_decode=False)
    with simulator(spec) as url, simulator(control) as baseline:
        rows = probe_json(capsys, "--url", url, "--baseline-url", baseline, "--temperatures", "0,0.4,1",
                          "--prompts", one_group(tmp_path))
    for row in rows:
        # The simulator's step is 0.02 s plain and 0.02·(1 + 3·0.5) s with 3 drafts, which emit 1 + 3α tokens.
        expected = 0.02 * (1 + 3 * row["acceptance_ratio"]) / 0.05
        assert row["speedup_p50"] == pytest.approx(expected, abs=0.08), row
        assert row["speedup_p50"] == pytest.approx(row["baseline_tpot_p50_seconds"] / row["tpot_p50_seconds"])
        assert row["speedup_p99"] is not None
    cold, warm, hot = rows
    assert cold["verdict"] == "ship" and cold["speedup_p50"] >= 1.3
    assert warm["acceptance_ratio"] > 0.65 and warm["speedup_p50"] < 1.3 and warm["verdict"] == "do not ship"
    assert hot["acceptance_ratio"] < 0.5 and hot["verdict"] == "disable"


def test_csv_and_the_plots(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png, page = tmp_path / "alpha.png", tmp_path / "alpha.html"
    with simulator() as url, simulator(ModelSpec(drafts_per_second=0.0, spec_decode=False)) as baseline:
        common = [*QUICK, "--url", url, "--baseline-url", baseline, "--temperatures", "0,1", "--requests", "3",
                  "--prompts", one_group(tmp_path)]
        assert main(["probe", *common, "--csv", "--plot", str(png)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert main(["probe", *common, "--plot", str(page)]) == 0
    assert lines[0].startswith("temperature,group,requests,failed_requests,acceptance_ratio,")
    assert len(lines) == 3 and lines[1].startswith("0.0,all,3,0,")
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and png.stat().st_size > 10_000
    html = page.read_text()
    assert html.count("<svg") == 2 and "<script" not in html.lower()
    assert "src=" not in html and "<link" not in html and "@import" not in html  # nothing fetched from elsewhere


def test_png_without_matplotlib_is_one_line() -> None:
    code = ("import sys; sys.modules['matplotlib'] = None; from specdecode_exporter.cli import main; "
            "sys.exit(main(['probe', '--url', 'http://127.0.0.1:1', '--plot', 'a.png']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "pip install 'specdecode-exporter[plot]'" in result.stderr


def one_line_fault(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 1, result.stderr
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert text in result.stderr and "Traceback" not in result.stderr


def test_faults_are_one_line() -> None:
    one_line_fault(run_cli("--url", f"http://127.0.0.1:{free_port()}"), "cannot reach http://127.0.0.1:")
    with simulator(ModelSpec(drafts_per_second=0.0, spec_decode=False)) as control:
        one_line_fault(run_cli("--url", control, "--requests", "2"), "does not run speculative decoding")
    with simulator() as url:
        one_line_fault(run_cli("--url", url, "--model", "nope"),
                       f"model 'nope' is not served at {url} (served: {MODEL})")
        one_line_fault(run_cli("--url", url, "--baseline-url", f"http://127.0.0.1:{free_port()}"),
                       "cannot reach")


@contextlib.contextmanager
def model_list_server(body: bytes) -> Iterator[str]:
    """An HTTP server whose /v1/models answers ``body`` (200, JSON), on a free loopback port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_without_a_model_list_or_with_no_model_is_one_line() -> None:
    with model_list_server(b"<html>not an API</html>") as url:
        one_line_fault(run_cli("--url", url), f"{url}/v1/models: not a model list")
    with model_list_server(b'{"object": "list", "data": []}') as url:
        one_line_fault(run_cli("--url", url), f"{url}/v1/models lists no model")


def test_bad_flags_and_the_total_request_cap_exit_2_before_any_request() -> None:
    sim = Simulator(steady_scenario(ModelSpec(drafts_per_second=0.0)))
    server, url = serve_in_thread(sim)
    try:
        for args, message in (
            (["--requests", "200"], "--max-total-requests: the plan is 3204 requests (4 temperatures × 4 groups × "
                                    "200 requests + 4 warm-up), more than 2000"),
            (["--requests", "20", "--baseline-url", url, "--max-total-requests", "100", "--warmup", "0"],
             "the plan is 640 requests ((4 temperatures × 4 groups × 20 requests + 0 warm-up) × 2 servers), more "
             "than 100"),
            (["--temperatures", "0,3"], "--temperatures: expected comma-separated numbers from 0 to 2"),
            (["--plot", "a.pdf"], "--plot a.pdf: expected a .png or .html file name"),
            (["--timeout", "soon"], "--timeout: expected a duration"),
            (["--json", "--csv"], "not allowed with argument"),
        ):
            result = run_cli("--url", url, *args)
            assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
            assert message in result.stderr
        state = sim.state()["models"][0]["series"][0]
        assert state["generation_tokens"] == 0  # nothing was sent
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--url", "http://[::1"], "--url: expected an http(s) URL like http://127.0.0.1:8000, got 'http://[::1'"),
        (["--url", "http://127.0.0.1:99999"], "--url: expected a port from 1 to 65535 in the URL, got "
                                              "'http://127.0.0.1:99999'"),
        (["--url", "garbage"], "--url: expected an http(s) URL like http://127.0.0.1:8000, got 'garbage'"),
        (["--url", "http://127.0.0.1:1?x=1"], "--url: expected an http(s) URL like http://127.0.0.1:8000"),
        (["--url", "http://127.0.0.1:1", "--baseline-url", "http://[::1]:8000:"],
         "--baseline-url: expected a port from 1 to 65535 in the URL"),
    ],
    ids=["unbalanced-bracket", "port-out-of-range", "no-scheme", "query", "baseline-bad-port"],
)
def test_a_bad_url_is_one_line_exit_2(flags: list[str], message: str) -> None:
    """--url and --baseline-url are checked as a sidecar target's URL is: one line, no traceback, exit code 2."""
    result = run_cli(*flags)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"specdecode-exporter probe: error: {message}"), result.stderr
    assert result.stderr.endswith(" (see specdecode-exporter probe --help)\n")


def test_credentials_in_the_url_are_refused_before_any_request() -> None:
    """A listening server and a URL with credentials: nothing is sent there, and the password is not printed."""
    with model_list_server(b'{"object": "list", "data": []}') as url:
        result = run_cli("--url", url.replace("http://", "http://user:s3cret@", 1))
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("specdecode-exporter probe: error: --url: credentials in the URL are not allowed; probe "
                             "sends none, and prints the URL (see specdecode-exporter probe --help)\n")
    assert "s3cret" not in result.stdout + result.stderr


@pytest.mark.parametrize(("signum", "code", "why"), [(signal.SIGINT, 130, "interrupted"),
                                                     (signal.SIGTERM, 143, "terminated")], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_prints_the_rows_so_far_and_exits_128_plus_the_signal(signum: int, code: int,
                                                                                 why: str) -> None:
    """Started as a background job is (SIGINT ignored, inherited): Ctrl-C and SIGTERM must stop it all the same."""
    paced = ModelSpec(drafts_per_second=0.0, target_step_seconds=0.004)
    with simulator(paced, pace=True) as url:
        process = subprocess.Popen(ignoring_sigint([*CLI, "--url", url, "--requests", "4", "--max-tokens", "100",
                                                    "--temperatures", "0,0.5,1"]),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert process.stderr is not None
            lines = [process.stderr.readline() for _ in range(2)]
            assert lines[1].startswith("probe: row 1/12"), lines
            process.send_signal(signum)
            out, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == code, err
    assert "Traceback" not in err and err.splitlines()[-1].startswith(f"specdecode-exporter probe: {why}: ")
    table = out.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("T "))
    assert table[header + 1].split()[:2] == ["0", "code"]  # the finished rows, not the unfinished one


def test_total_timeout_stops_with_the_rows_so_far() -> None:
    # Paced, a request takes at least 0.4 s (100 steps of 4 ms) and about half a second here: in 5 s at most 12 of
    # the 16 one-request rows can finish however fast the machine, and the first one unless it is ten times slower.
    paced = ModelSpec(drafts_per_second=0.0, target_step_seconds=0.004)
    with simulator(paced, pace=True) as url:
        result = run_cli("--url", url, "--requests", "1", "--max-tokens", "100", "--timeout", "5s", "--json",
                         "--warmup", "0")
    assert result.returncode == 1
    assert "stopped at --timeout 5s: " in result.stderr and "of 16 rows measured" in result.stderr
    rows = json.loads(result.stdout)
    assert 0 < len(rows) < 16


def test_a_first_request_past_the_request_timeout_is_one_line() -> None:
    paced = ModelSpec(drafts_per_second=0.0, target_step_seconds=0.05)
    with simulator(paced, pace=True) as url:
        result = run_cli("--url", url, "--requests", "3", "--request-timeout", "300ms", "--max-tokens", "500")
    one_line_fault(result, f"the first request to {url} failed (no answer within 0.3s): nothing to measure")
