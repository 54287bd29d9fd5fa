"""The command line as a user meets it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.server import serve_in_thread

CLI = [sys.executable, "-m", "specdecode_exporter.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--web.listen-adress", ":1"], "unknown flag --web.listen-adress"),
        (["run", "--collect.interval", "fast"], "--collect.interval: expected a duration"),
        (["run", "--web.listen-address", "nowhere"], "--web.listen-address: expected host:port"),
        (["run", "--target", "localhost:8000"], "--target: expected an http(s) URL"),
        (["run", "--target", "http://127.0.0.1:99999/metrics"], "--target: expected a port from 1 to 65535"),
        (["run", "--log.level", "loud"], "--log.level: expected one of"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_bad_config_file_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("collect:\n  intervall: 5s\n")
    result = run_cli("run", "--config.file", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"specdecode-exporter: config error: {path}: collect.intervall: unknown key "
                                     "(did you mean 'interval'?)")


def test_env_var_is_validated_like_the_flag_and_named() -> None:
    result = run_cli("run", env={"SPECDECODE_COLLECT_INTERVAL": "never"})
    assert result.returncode == 2
    assert result.stderr == ("specdecode-exporter: config error: SPECDECODE_COLLECT_INTERVAL: expected a duration "
                             "like 5s, 1m or 500ms, got 'never'\n")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SPECDECODE_COLLECT_TIMEOUT": "soon"}, "SPECDECODE_COLLECT_TIMEOUT: expected a duration"),
        ({"SPECDECODE_TARGET": "localhost:8000"}, "SPECDECODE_TARGET: expected an http(s) URL"),
        ({"SPECDECODE_TAP_LISTEN_ADDRESS": "tap"}, "SPECDECODE_TAP_LISTEN_ADDRESS: expected host:port"),
        ({"SPECDECODE_TAP_LISTEN_ADDRESS": ":0", "SPECDECODE_TAP_ROUTE_FALLBACK_UPSTREAM": "http://127.0.0.1:9",
          "SPECDECODE_TAP_ROUTE_MODE": "always"}, "SPECDECODE_TAP_ROUTE_MODE: expected one of observe, enforce"),
    ],
)
def test_a_bad_value_in_a_variable_names_the_variable(env: dict[str, str], message: str) -> None:
    result = run_cli("run", env=env)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert message in line, line


def test_a_bad_value_in_a_tap_flag_names_the_flag() -> None:
    result = run_cli("run", "--tap.listen-address", ":0", "--tap.route.fallback-upstream", "http://127.0.0.1:9",
                     "--tap.route.mode", "always")
    assert result.returncode == 2
    assert "config error: --tap.route.mode: expected one of observe, enforce, got 'always'" in result.stderr


def test_an_unknown_variable_stops_the_start_naming_it() -> None:
    result = run_cli("run", env={"SPECDECODE_COLECT_INTERVAL": "1s"})
    assert result.returncode == 2
    assert result.stderr == ("specdecode-exporter: config error: SPECDECODE_COLECT_INTERVAL: not a variable of "
                             "specdecode-exporter run; did you mean SPECDECODE_COLLECT_INTERVAL? "
                             "(see specdecode-exporter run --help)\n")


def test_the_other_tools_variables_are_left_to_them() -> None:
    """simulate's and the test harnesses' variables share the prefix: `run` goes on to read its own (here a bad
    one, so that it stops)."""
    result = run_cli("run", env={"SPECDECODE_SIMULATE_FORMAT": "v1", "SPECDECODE_VLLM_HOME": "/nowhere",
                                 "SPECDECODE_LOG_LEVEL": "loud"})
    assert result.returncode == 2
    assert "SPECDECODE_LOG_LEVEL: expected one of" in result.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["run", "--collect.intervl", "5s"], "specdecode-exporter run: error: unknown flag --collect.intervl; did you "
         "mean --collect.interval? (see specdecode-exporter run --help)"),
        (["run", "--web.listen-adress=:1"], "specdecode-exporter run: error: unknown flag --web.listen-adress; did you "
         "mean --web.listen-address? (see specdecode-exporter run --help)"),
        (["check", "http://127.0.0.1:9/metrics", "--duraton", "1s"], "specdecode-exporter check: error: unknown flag "
         "--duraton; did you mean --duration? (see specdecode-exporter check --help)"),
        # The misspelt flag's value was taken for the URL, and the URL left over: the flag is named, not the URL.
        (["check", "--durration", "3s", "http://127.0.0.1:9/metrics"], "specdecode-exporter check: error: unknown "
         "flag --durration; did you mean --duration? (see specdecode-exporter check --help)"),
    ],
)
def test_a_wrong_flag_gets_did_you_mean_and_the_commands_help(args: list[str], line: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stderr == line + "\n"


@pytest.mark.parametrize(
    ("args", "flag", "meant"),
    [
        (["run", "--web.listen", "127.0.0.1:0"], "--web.listen", "--web.listen-address"),
        (["run", "--collect.int", "1s"], "--collect.int", "--collect.interval"),
        (["check", "--dur", "1s", "http://127.0.0.1:9/metrics"], "--dur", "--duration"),
        (["probe", "--url", "http://127.0.0.1:9", "--temperature", "0"], "--temperature", "--temperatures"),
        (["demo", "--web.listen-addr", "127.0.0.1:0"], "--web.listen-addr", "--web.listen-address"),
        (["simulate", "--acceptance", "0.5"], "--acceptance", "--acceptance-rate"),
    ],
)
def test_an_abbreviated_flag_is_refused_naming_the_whole_one(args: list[str], flag: str, meant: str) -> None:
    """argparse takes a unique prefix for the flag it begins by default: `probe --temperature 0` ran as
    --temperatures, and a flag added later could silently change what an old command line means."""
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert f"unknown flag {flag}; did you mean {meant}?" in line


def test_listen_address_in_use_is_one_line_exit_1() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("run", "--web.listen-address", f"127.0.0.1:{port}", "--target", "http://127.0.0.1:9/metrics")
    assert result.returncode == 1
    assert "cannot listen" in result.stderr
    assert 'change_with="--web.listen-address (web.listen_address in the config file)"' in result.stderr
    assert "Traceback" not in result.stderr


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("specdecode-exporter ")


def test_check_prints_a_verdict_against_the_simulator() -> None:
    server, url = serve_in_thread(Simulator(steady_scenario(ModelSpec(acceptance_rate=0.75, drafts_per_second=300))))
    try:
        result = run_cli("check", url + "/metrics", "--duration", "3s")
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    header, row, reason = [line for line in result.stdout.splitlines() if line.startswith(("meta-llama", "model"))]
    assert header.split()[:3] == ["model", "engine", "α"]
    cells = row.split()
    assert cells[0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert float(cells[2]) == pytest.approx(0.75, abs=0.01)
    assert "paying off" in row
    # S = (1 + 3·0.75) / (1 + 3·0.5) = 1.30
    assert reason == "meta-llama/Llama-3.1-8B-Instruct 0: paying off (modelled 1.30×)"
    lines = result.stdout.splitlines()
    assert "Speculation, meta-llama/Llama-3.1-8B-Instruct 0: speculative steps produced 100% of" in result.stdout
    assert any(line.startswith("Batch-size schedule, meta-llama/Llama-3.1-8B-Instruct 0 (over 3s): ") for line in lines)
    (vllm,) = [line for line in lines if line.startswith("  vLLM:")]
    pasted = json.loads(vllm.split("--speculative-config ", 1)[1].strip("'"))
    assert pasted["num_speculative_tokens_per_batch_size"][0][0] == 1
    assert any(line.startswith("  TensorRT-LLM: speculative_config: {max_draft_len: ") for line in lines)
    # The break-even in the table is the one in force (as on the status page), its basis said in words
    assert cells[8] == "0.50"
    assert ("Break-even α 0.50, meta-llama/Llama-3.1-8B-Instruct 0: from the configured cost model (c_draft + "
            "c_verify per drafted token); no measured speedup calibrates it.") in lines
    # best k 3 (the table) against k = 2 at the only batch size seen (the schedule): the difference in one line
    assert cells[9] == "3" and "5-16: k=2" in result.stdout
    (why,) = [line for line in lines if line.startswith("  best k 3 in the table is at the configured cost per")]
    assert why.endswith(": k = 2 at batch size 5-16 (cost 0.64)")

    # The page's variance: assumed here (no per-request results), k̄ = 3 from the counters: 3(¼ − 0.04) + 30·0.04.
    assert ("Page variance per drafted token, meta-llama/Llama-3.1-8B-Instruct 0: 1.83, assumed on 0 requests "
            "(monitoring config statistics: 30 drafted tokens per request, sd 0.2; k̄ 3.00 from the counters)"
            in result.stdout)


def test_check_given_the_base_url_suggests_its_metrics() -> None:
    """`probe --url` takes the server's base URL; `check` takes its /metrics: a 404 from a base URL says so."""
    server, url = serve_in_thread(Simulator(steady_scenario(ModelSpec())))
    try:
        result = run_cli("check", url, "--duration", "1s")
    finally:
        server.stop()
    assert result.returncode == 1
    assert result.stderr == (f"specdecode-exporter check: cannot collect {url}: http_status: HTTP 404 "
                             f"(did you mean {url}/metrics?)\n")


def test_check_on_a_vllm_without_spec_decode_says_what_it_found_and_how_to_use_it_as_a_control() -> None:
    """A control pod's page (no vllm:spec_decode_* counters) is not a failure to collect: check names what it read
    and the flag that declares it a control; it used to print only `no_spec_metrics`."""
    server, url = serve_in_thread(Simulator(steady_scenario(ModelSpec(spec_decode=False))))
    try:
        result = run_cli("check", url + "/metrics", "--duration", "1s")
    finally:
        server.stop()
    assert result.returncode == 1
    assert result.stderr == (
        f"specdecode-exporter check: {url}/metrics: nothing to judge: a vLLM page without spec-decode counters (vLLM "
        "started without --speculative-config); if this is the control pod, declare it as one: run --control-target "
        "NAME=URL, or spec_decode: false in the config file\n")


def test_check_unreachable_is_one_line_exit_1() -> None:
    result = run_cli("check", "http://127.0.0.1:9/metrics", "--duration", "1s", "--timeout", "1s")
    assert result.returncode == 1
    assert result.stdout == "", "stdout keeps only results"
    [line] = result.stderr.splitlines()  # the detail, in one line, and no log line beside it
    assert line.startswith("specdecode-exporter check: cannot collect http://127.0.0.1:9/metrics: connect"), line


@pytest.mark.parametrize(
    ("url", "line"),
    [
        ("http://[::1/metrics", "URL: expected an http(s) URL like http://127.0.0.1:8000/metrics, got "
                                "'http://[::1/metrics'"),
        ("http://127.0.0.1:99999/metrics", "URL: expected a port from 1 to 65535 in the URL, got "
                                           "'http://127.0.0.1:99999/metrics'"),
        ("http://127.0.0.1:port/metrics", "URL: expected a port from 1 to 65535 in the URL, got "
                                          "'http://127.0.0.1:port/metrics'"),
        ("garbage", "URL: expected an http(s) URL like http://127.0.0.1:8000/metrics, got 'garbage'"),
    ],
    ids=["unbalanced-bracket", "port-out-of-range", "port-not-a-number", "no-scheme"],
)
def test_check_a_bad_url_is_a_usage_error_in_one_line(url: str, line: str) -> None:
    """check's URL is checked as run's --target is, before anything is sent: one line, exit code 2."""
    result = run_cli("check", url, "--duration", "1s", "--timeout", "1s")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == f"specdecode-exporter: config error: {line}\n"


def test_check_refuses_credentials_in_the_url_as_run_does() -> None:
    """A reachable server, a URL with credentials: check neither collects nor prints them (run refuses them too)."""
    server, url = serve_in_thread(Simulator(steady_scenario(ModelSpec())))
    try:
        with_credentials = url.replace("http://", "http://user:s3cret@", 1) + "/metrics"
        result = run_cli("check", with_credentials, "--duration", "1s")
        run = run_cli("run", "--web.listen-address", "127.0.0.1:0", "--target", with_credentials)
    finally:
        server.stop()
    assert (result.returncode, run.returncode) == (2, 2), result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr == ("specdecode-exporter: config error: URL: credentials in the URL are not allowed; check "
                             "sends none, and prints the URL\n")
    assert run.stderr == ("specdecode-exporter: config error: --target: credentials in the URL are not allowed; use "
                          "bearer_token_file\n")


def test_the_demo_sends_each_workload_at_three_temperatures_streamed_and_not() -> None:
    """What docs/demo.md says the demo sends: two workloads at temperatures 0, 0.5 and 1, streamed and not."""
    from specdecode_exporter.demo import traffic

    rounds = [traffic(i) for i in range(12)]
    assert sorted(rounds) == sorted((w, t, s) for w in ("chat", "code") for t in (0.0, 0.5, 1.0)
                                    for s in (False, True))


def test_check_says_why_the_per_position_curve_is_absent_when_the_draft_length_varies() -> None:
    """Drafts 80 % full (ngram lookups coming up short) and vLLM counts no drafted tokens per position: `check`
    prints the measured mean draft length and the reason instead of a per-position curve and a best k."""
    spec = ModelSpec(acceptance_rate=0.75, drafts_per_second=300, draft_fill=0.8)
    server, url = serve_in_thread(Simulator(steady_scenario(spec)))
    try:
        result = run_cli("check", url + "/metrics", "--duration", "3s")
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    header, row = [line for line in result.stdout.splitlines() if line.startswith(("meta-llama ", "model "))
                   or line.startswith("meta-llama/Llama-3.1-8B-Instruct  ")][:2]
    assert "draft len" in header
    assert "2.40" in row.split()  # 0.8 of k = 3, measured
    assert ("Per position, meta-llama/Llama-3.1-8B-Instruct 0: the draft length varies (drafts averaged 2.40 of "
            "k = 3 tokens)") in result.stdout
