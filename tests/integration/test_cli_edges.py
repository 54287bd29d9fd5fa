"""The command line's edges as a user meets them, against real processes on loopback: a control target declared
with a flag, the probe given the /metrics URL that `check` and `run` take, POST /-/reload in the demo."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.procs import child_env, exporter_command, free_port, running
from specdecode_exporter.cli import main
from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.server import serve_in_thread

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def simulator(spec: ModelSpec) -> Iterator[str]:
    server, url = serve_in_thread(Simulator(steady_scenario(spec)))
    try:
        yield url
    finally:
        server.stop()


def scrape_until(url: str, wanted: tuple[str, ...], timeout: float = 30) -> str:
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        text = httpx.get(url, timeout=5).text
        if all(line in text for line in wanted):
            return text
        time.sleep(0.5)
    raise AssertionError(f"not all of {wanted} in:\n{text}")


def test_a_control_target_declared_on_the_command_line_is_collected_as_one_and_compared_with(tmp_path: Path) -> None:
    """`--target ctl=URL` for a vLLM without spec decode exported specdecode_up{target="ctl"} 0 (no_spec_metrics),
    and only the config file's spec_decode: false made a control; --control-target does it from the flags, and
    every --target takes it as its baseline."""
    with simulator(ModelSpec(acceptance_rate=0.75, drafts_per_second=300)) as spec, \
            simulator(ModelSpec(spec_decode=False, drafts_per_second=300)) as control, \
            running("sidecar", lambda port: [*exporter_command(), "run", "--web.listen-address", f"127.0.0.1:{port}",
                                             "--collect.interval", "500ms", "--target", f"spec={spec}/metrics",
                                             "--control-target", f"ctl={control}/metrics"],
                    tmp_path, "/healthz", env=child_env()) as sidecar:
        text = scrape_until(f"{sidecar.url}/metrics", (
            'specdecode_up{target="ctl"} 1.0', 'specdecode_up{target="spec"} 1.0',
            'specdecode_baseline_info{baseline="",role="control",target="ctl"} 1.0',
            'specdecode_baseline_info{baseline="ctl",role="speculative",target="spec"} 1.0',
            "specdecode_observed_speedup{"))
    assert 'specdecode_collect_errors_total{reason="no_spec_metrics",target="ctl"} 0.0' in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--control-target", "a=http://127.0.0.1:9/metrics", "--control-target", "b=http://127.0.0.1:10/metrics"],
         "--control-target: one control target on the command line; pair several with their targets in the config "
         "file (spec_decode: false, baseline.target)"),
        (["--control-target", "ctl=127.0.0.1:9"], "--control-target: expected an http(s) URL"),
    ],
)
def test_a_bad_control_target_is_one_line_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run([*exporter_command(), "run", *args], capture_output=True, text=True, timeout=30,
                            env=child_env())
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert message in line


def test_a_control_target_without_targets_beside_a_config_file_says_what_to_give(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("targets:\n  - name: spec\n    url: http://127.0.0.1:9/metrics\n")
    result = subprocess.run([*exporter_command(), "run", "--config.file", str(config), "--control-target",
                             "http://127.0.0.1:10/metrics"], capture_output=True, text=True, timeout=30,
                            env=child_env())
    assert result.returncode == 2
    assert result.stderr == ("specdecode-exporter: config error: --control-target: give the targets it is the control "
                             "of with --target too, or declare the control in the config file (spec_decode: false)\n")


def test_the_probe_takes_the_metrics_url_that_check_and_run_take(capsys: pytest.CaptureFixture[str]) -> None:
    """`probe --url http://host:8000/metrics` asked for …/metrics/v1/models and failed on a 404 with no hint."""
    with simulator(ModelSpec(drafts_per_second=0.0, acceptance_rate=0.8)) as url:
        code = main(["probe", "--url", f"{url}/metrics", "--temperatures", "0", "--requests", "2", "--warmup", "0",
                     "--max-tokens", "20", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"acceptance_ratio"' in out


def test_reload_in_the_demo_answers_as_under_run(tmp_path: Path) -> None:
    """POST /-/reload answered 404 in the demo; it re-applies the demo's built-in configuration."""
    port = free_port()
    proc = subprocess.Popen([*exporter_command(), "demo", "--web.listen-address", f"127.0.0.1:{port}",
                             "--duration", "60s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=child_env())
    try:
        deadline, answer = time.monotonic() + 30, None
        while time.monotonic() < deadline and answer is None:
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.post(f"http://127.0.0.1:{port}/-/reload", timeout=5)
            time.sleep(0.3)
        assert answer is not None
        assert (answer.status_code, answer.text) == (200, "ok: no changes\n")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "specdecode_config_last_reload_successful 1.0" in metrics
    finally:
        proc.terminate()
        proc.wait(15)
