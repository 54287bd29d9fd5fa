"""The sidecar as a process: bad config → one line and exit 2; SIGTERM → stops within seconds; SIGHUP or
POST /-/reload → new config without losing window state; TLS and basic auth from --web.config.file."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest

from specdecode_exporter.core.contract import metrics
from specdecode_exporter.sidecar.collection import Exporter
from specdecode_exporter.sidecar.config import Config, TargetConfig, config_from_mapping, parse_windows
from specdecode_exporter.sidecar.reload import Reloader
from specdecode_exporter.sidecar.webconfig import BCRYPT_THREADS
from tests.faults.certs import Certs, leaf
from tests.faults.conftest import PASSWORD, write
from tests.faults.hostile import HostileServer, closed_port, scripted, serve, silent, v1_body
from tests.helpers import Exposition, FakeClock

EXE = [sys.executable, "-m", "specdecode_exporter.cli"]


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECODE_")}
    return subprocess.run([*EXE, *args], capture_output=True, text=True, timeout=timeout, env=env)


# ---------- bad configuration: one line, exit code 2 ----------

@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read config file"),
     ("targets: [\n", "invalid YAML at line"),
     ("collect:\n  intervall: 5s\n", "collect.intervall: unknown key (did you mean 'interval'?)"),
     ("targets:\n  - url: http://127.0.0.1:8000/metrics\n    tls_config: {ca_file: /nonexistent/ca.crt}\n",
      "targets[0].tls_config: cannot load"),
     ("windows: 1m,1m\n", "windows must be distinct"),
     ("web:\n  config_file: /nonexistent/web.yml\n", "cannot read web config file"),
     ("targets: []\n", "targets: no target configured"),
     ("targets:\n  - url: http://127.0.0.1:9/metrics\n  - url: http://127.0.0.1:10/metrics\n",
      "targets[0]: a target without a name is called 'vllm', as is targets[1]; give each target its own name")],
)
def test_bad_config_is_one_line_and_exit_code_2(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "config.yml"
    if content is not None:
        write(path, content)
    result = run_cli("run", "--config.file", str(path), "--web.listen-address", f"127.0.0.1:{closed_port()}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0] and "Traceback" not in result.stderr


def test_bad_web_config_flag_is_exit_code_2(tmp_path: Path) -> None:
    web = write(tmp_path / "web.yml", "basic_auth_users:\n  u: hunter2\n")
    result = run_cli("run", "--web.config.file", str(web), "--web.listen-address", f"127.0.0.1:{closed_port()}")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "bcrypt hash" in result.stderr
    assert "hunter2" not in result.stderr  # a would-be password is not echoed


def test_the_tap_pointed_at_itself_is_one_line_and_exit_code_2() -> None:
    """--tap.upstream the tap's own address: refused at the start, not a loop of requests to itself."""
    tap = closed_port()
    try:
        result = run_cli("run", "--web.listen-address", f"127.0.0.1:{closed_port()}", "--target",
                         f"http://127.0.0.1:{closed_port()}/metrics", "--tap.listen-address", f"127.0.0.1:{tap}",
                         "--tap.upstream", f"http://127.0.0.1:{tap}", timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the sidecar started with its tap relaying to itself")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"specdecode-exporter: config error: --tap.upstream: http://127.0.0.1:{tap} is the "
                             f"tap's own address (--tap.listen-address 127.0.0.1:{tap}): the tap would relay every "
                             "request to itself; point it at vLLM\n")


# ---------- a running sidecar process ----------

class Process:
    def __init__(self, args: list[str], base_url: str, verify: object = True, auth: tuple[str, str] | None = None
                 ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECODE_")}
        self.proc = subprocess.Popen([*EXE, "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.base_url = base_url
        self.client = httpx.Client(verify=verify, auth=auth, timeout=5)  # type: ignore[arg-type]

    def wait_until(self, check: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sidecar exited: {self.proc.communicate()[1]}")
            try:
                if check():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("condition not reached in time")

    def metrics(self) -> Exposition:
        response = self.client.get(self.base_url + "/metrics")
        response.raise_for_status()
        return Exposition.parse(response.text)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.client.close()
        return self.proc.communicate()[1]


@pytest.fixture
def servers() -> Iterator[Callable[..., HostileServer]]:
    started: list[HostileServer] = []

    def start(behaviour: Callable[[HostileServer], object], **kwargs: object) -> HostileServer:
        server = serve(behaviour, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


class Counting:
    """A vLLM whose counters grow by 300/200 tokens per request."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> bytes:
        self.n += 1
        return v1_body(300 * self.n, 200 * self.n)


def config_text(targets: dict[str, str], windows: str = "1m") -> str:
    lines = ["collect:", "  interval: 200ms", "  timeout: 1s", f"windows: {windows}", "targets:"]
    lines += [f"  - name: {name}\n    url: {url}" for name, url in targets.items()]
    return "\n".join(lines) + "\n"


def test_sigterm_stops_within_seconds_even_with_a_hanging_target(tmp_path: Path,
                                                                  servers: Callable[..., HostileServer]) -> None:
    hang = servers(silent())
    port = closed_port()
    config = write(tmp_path / "c.yml", config_text({"hang": hang.url}).replace("timeout: 1s", "timeout: 30s"))
    sidecar = Process(["--config.file", str(config), "--web.listen-address", f"127.0.0.1:{port}"],
                      f"http://127.0.0.1:{port}")
    try:
        sidecar.wait_until(lambda: sidecar.client.get(sidecar.base_url + "/healthz").status_code == 200)
        sidecar.wait_until(lambda: len(hang.requests) == 1)  # a collection is stuck right now
        started = time.monotonic()
        sidecar.proc.send_signal(signal.SIGTERM)
        code = sidecar.proc.wait(10)
        elapsed = time.monotonic() - started
    finally:
        stderr = sidecar.stop()
    assert code == 0, stderr
    assert elapsed < 3.0, f"took {elapsed:.1f}s"
    assert "msg=stopped" in stderr and "Traceback" not in stderr


def _sidecar_reading(tmp_path: Path, targets: dict[str, str]) -> tuple[Path, Process]:
    """A config file of ``targets`` (name: URL), and a real sidecar reading it on a free port."""
    port = closed_port()
    config = write(tmp_path / "c.yml", config_text(targets))
    return config, Process(["--config.file", str(config), "--web.listen-address", f"127.0.0.1:{port}"],
                           f"http://127.0.0.1:{port}")


def test_sighup_and_post_reload_keep_window_state(tmp_path: Path, servers: Callable[..., HostileServer]) -> None:
    a = servers(scripted(Counting()))
    b = servers(scripted(Counting()))
    config, sidecar = _sidecar_reading(tmp_path, {"a": a.url})
    try:
        sidecar.wait_until(lambda: (sidecar.metrics().get("specdecode_interval_acceptance_ratio_count",
                                                          target="a") or 0) >= 5)
        before = sidecar.metrics()
        assert before.get("specdecode_config_last_reload_successful") == 1
        assert (before.get("specdecode_config_last_reload_success_timestamp_seconds") or 0) > time.time() - 600
        assert [before.helps[spec.name] for spec in metrics.RELOAD] == [spec.help for spec in metrics.RELOAD]

        # SIGHUP: add target b and a window; a keeps its counters, histogram and windows.
        write(config, config_text({"a": a.url, "b": b.url}, windows="1m,5m"))
        sidecar.proc.send_signal(signal.SIGHUP)
        # The new window shows from a's next collection on; b must have been collected too.
        sidecar.wait_until(
            lambda: sidecar.metrics().get("specdecode_up", target="b") == 1
            and sidecar.metrics().get("specdecode_acceptance_ratio", target="a", window="5m") is not None
        )
        after = sidecar.metrics()
        for name in ("specdecode_interval_acceptance_ratio_count", "specdecode_draft_tokens_total"):
            assert after.get(name, target="a") >= before.get(name, target="a")  # type: ignore[operator]
        assert after.get("specdecode_source_restarts_total", target="a") == 0
        assert after.get("specdecode_acceptance_ratio", target="a", window="5m") == pytest.approx(2 / 3)

        # A bad config is rejected: the gauge says so, the old config keeps running.
        write(config, "collect:\n  intervall: 1s\n")
        sidecar.proc.send_signal(signal.SIGHUP)
        sidecar.wait_until(lambda: sidecar.metrics().get("specdecode_config_last_reload_successful") == 0)
        requests_a = len(a.requests)
        sidecar.wait_until(lambda: len(a.requests) > requests_a + 2 and len(b.requests) > 2)
        response = sidecar.client.post(sidecar.base_url + "/-/reload")
        assert response.status_code == 400 and "intervall" in response.text

        # POST /-/reload with a good config: b goes away, a stays.
        write(config, config_text({"a": a.url}))
        response = sidecar.client.post(sidecar.base_url + "/-/reload")
        assert response.status_code == 200 and "target b removed" in response.text
        final = sidecar.metrics()
        assert final.get("specdecode_config_last_reload_successful") == 1
        assert final.all("specdecode_up", target="b") == {}
        assert final.get("specdecode_draft_tokens_total", target="a") >= after.get(  # type: ignore[operator]
            "specdecode_draft_tokens_total", target="a")
        assert sidecar.client.get(sidecar.base_url + "/-/reload").status_code == 405
    finally:
        stderr = sidecar.stop()
    assert stderr.count("reload failed") == 2
    assert "Traceback" not in stderr


def test_a_reload_to_no_targets_is_rejected_and_the_targets_kept(tmp_path: Path,
                                                                   servers: Callable[..., HostileServer]) -> None:
    """`targets: []` (or `targets:` empty) on reload: rejected in one line, not the default target collected."""
    a = servers(scripted(Counting()))
    config, sidecar = _sidecar_reading(tmp_path, {"a": a.url})
    try:
        sidecar.wait_until(lambda: sidecar.metrics().get("specdecode_up", target="a") == 1)
        for empty in (config_text({}), config_text({}).replace("targets:", "targets: []")):
            write(config, empty)
            response = sidecar.client.post(sidecar.base_url + "/-/reload")
            assert response.status_code == 400 and "targets: no target configured" in response.text, response.text
        requests = len(a.requests)
        sidecar.wait_until(lambda: len(a.requests) > requests + 2)  # a is still collected
        final = sidecar.metrics()
        assert final.get("specdecode_config_last_reload_successful") == 0
        assert final.get("specdecode_up", target="a") == 1
        assert final.all("specdecode_up", target="vllm") == {}
    finally:
        stderr = sidecar.stop()
    assert stderr.count("reload failed") == 2 and "Traceback" not in stderr


def test_tls_and_basic_auth_from_the_web_config_file(tmp_path: Path, certs: Certs, password_hash: str,
                                                     servers: Callable[..., HostileServer]) -> None:
    a = servers(scripted(Counting()))
    web = write(certs.ca.parent / "web-auth.yml",
                "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS12\n"
                f"basic_auth_users:\n  prometheus: '{password_hash}'\n")
    port = closed_port()
    sidecar = Process(["--target", a.url, "--collect.interval", "200ms", "--web.config.file", str(web),
                       "--web.listen-address", f"127.0.0.1:{port}"], f"https://127.0.0.1:{port}",
                      verify=_ca_context(certs), auth=("prometheus", PASSWORD))
    try:
        sidecar.wait_until(lambda: sidecar.metrics().get("specdecode_up") == 1)
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        with pytest.raises(httpx.ConnectError):  # a client that does not trust our CA
            httpx.get(sidecar.base_url + "/metrics", timeout=5)
        assert httpx.get(sidecar.base_url + "/metrics", verify=_ca_context(certs), timeout=5).status_code == 401
        assert httpx.get(sidecar.base_url + "/healthz", verify=_ca_context(certs), timeout=5).status_code == 200
    finally:
        stderr = sidecar.stop()
    assert PASSWORD not in stderr and password_hash not in stderr


def test_mutual_tls_from_the_web_config_file(certs: Certs, servers: Callable[..., HostileServer]) -> None:
    a = servers(scripted(Counting()))
    web = write(certs.ca.parent / "web-mtls.yml",
                "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n")
    port = closed_port()
    sidecar = Process(["--target", a.url, "--web.config.file", str(web), "--web.listen-address",
                       f"127.0.0.1:{port}"], f"https://127.0.0.1:{port}",
                      verify=_ca_context(certs))
    sidecar.client = httpx.Client(verify=_client_context(certs), timeout=5)
    try:
        sidecar.wait_until(lambda: sidecar.client.get(sidecar.base_url + "/healthz").status_code == 200)
        with pytest.raises(httpx.HTTPError):  # no client certificate
            httpx.get(sidecar.base_url + "/healthz", verify=_ca_context(certs), timeout=5)
    finally:
        sidecar.stop()


def test_a_reloaded_web_certificate_is_served_to_new_connections(tmp_path: Path, certs: Certs,
                                                                 servers: Callable[..., HostileServer]) -> None:
    """uvicorn serves the sidecar's own TLS context, so a reload loads the new certificate into what is served."""
    a = servers(scripted(Counting()))
    leaf(certs.ca.parent, "server-other", "other-ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    shutil.copy(certs.server_cert, tmp_path / "tls.crt")
    shutil.copy(certs.server_key, tmp_path / "tls.key")
    web = write(tmp_path / "web.yml", "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    port = closed_port()
    sidecar = Process(["--target", a.url, "--web.config.file", str(web), "--web.listen-address",
                       f"127.0.0.1:{port}"], f"https://127.0.0.1:{port}", verify=_ca_context(certs))
    trusts_other = ssl.create_default_context(cafile=str(certs.other_ca))
    try:
        sidecar.wait_until(lambda: sidecar.client.get(sidecar.base_url + "/healthz").status_code == 200)
        with pytest.raises(httpx.ConnectError):
            httpx.get(sidecar.base_url + "/healthz", verify=trusts_other, timeout=5)
        shutil.copy(certs.ca.parent / "server-other.crt", tmp_path / "tls.crt")
        shutil.copy(certs.ca.parent / "server-other.key", tmp_path / "tls.key")
        reloaded = sidecar.client.post(sidecar.base_url + "/-/reload")
        assert reloaded.status_code == 200 and "web TLS certificate reloaded" in reloaded.text
        assert httpx.get(sidecar.base_url + "/healthz", verify=trusts_other, timeout=5).status_code == 200
        with pytest.raises(httpx.ConnectError):  # new connections get the new certificate only
            httpx.get(sidecar.base_url + "/healthz", verify=_ca_context(certs), timeout=5)
    finally:
        sidecar.stop()


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def test_a_flood_of_wrong_passwords_takes_few_threads_and_a_known_scraper_gets_in(
        tmp_path: Path, servers: Callable[..., HostileServer]) -> None:
    """24 clients with unique wrong passwords at once, against a bcrypt hash that takes ~0.3 s a check: they queue
    for BCRYPT_THREADS threads (with anyio's default pool each would take one of 40, and a core with it), and
    Prometheus's credentials, checked once and then cached, are let in while the flood is still being checked."""
    a = servers(scripted(Counting()))
    slow_hash = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=11)).decode()
    web = write(tmp_path / "web.yml", f"basic_auth_users:\n  prometheus: '{slow_hash}'\n")
    port = closed_port()
    sidecar = Process(["--target", a.url, "--web.config.file", str(web), "--web.listen-address", f"127.0.0.1:{port}"],
                      f"http://127.0.0.1:{port}", auth=("prometheus", PASSWORD))
    url = sidecar.base_url + "/metrics"

    async def flood() -> tuple[list[int], int, int, int]:
        async with httpx.AsyncClient(timeout=60) as client:
            wrong = [asyncio.ensure_future(client.get(url, auth=("prometheus", f"wrong-{i}"))) for i in range(24)]
            peak = _threads(sidecar.proc.pid)
            for _ in range(15):  # the flood reaches bcrypt
                await asyncio.sleep(0.02)
                peak = max(peak, _threads(sidecar.proc.pid))
            known = await client.get(url, auth=("prometheus", PASSWORD))
            pending = sum(not request.done() for request in wrong)
            while not all(request.done() for request in wrong):
                await asyncio.sleep(0.02)
                peak = max(peak, _threads(sidecar.proc.pid))
            return [(await request).status_code for request in wrong], known.status_code, pending, peak

    try:
        sidecar.wait_until(lambda: sidecar.metrics().get("specdecode_up") == 1)  # the first login: bcrypt, cached
        before = _threads(sidecar.proc.pid)
        statuses, known, pending, peak = asyncio.run(flood())
    finally:
        stderr = sidecar.stop()
    assert statuses == [401] * 24 and known == 200
    assert pending > 0, "the known scraper waited until the flood had been checked"
    assert peak <= before + BCRYPT_THREADS, (before, peak)
    assert stderr.count("basic auth failed") == 24 and PASSWORD not in stderr


def _ca_context(certs: Certs) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca))


def _client_context(certs: Certs) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(certs.client_cert, certs.client_key)
    return context


# ---------- reload, exactly, in process ----------

def test_apply_config_keeps_state_of_targets_that_stay(servers: Callable[..., HostileServer]) -> None:
    a, b = servers(scripted(Counting())), servers(scripted(Counting()))
    clock = FakeClock()
    windows = parse_windows("1m", "w")
    exporter = Exporter(Config(targets=(TargetConfig("a", a.url),), windows=windows), clock=clock)

    def step() -> None:
        clock.advance(5)

        async def once() -> None:
            async with httpx.AsyncClient() as client:
                await exporter.collect_all_once(client)
        asyncio.run(once())

    for _ in range(5):
        step()
    (state,) = exporter.store.series.values()
    snapshot = (len(state.times), state.histogram.observations, state.totals)
    new = config_from_mapping({"windows": "1m,5m", "targets": [{"name": "a", "url": a.url, "labels": {"x": "1"}},
                                                               {"name": "b", "url": b.url}]}, "reload")
    reloader = Reloader(exporter, lambda: new)
    ok, message = reloader.reload()
    assert ok and "target b added" in message and "target a updated" in message
    assert exporter.store.series[state.key] is state
    assert (len(state.times), state.histogram.observations, state.totals) == snapshot
    assert exporter.collectors["a"].config.labels == (("x", "1"),)
    step()
    assert state.histogram.observations == snapshot[1] + 1
    # A new URL for an existing name is a new source: its state starts afresh.
    moved = config_from_mapping({"targets": [{"name": "a", "url": b.url}]}, "reload")
    ok, message = Reloader(exporter, lambda: moved).reload()
    assert ok and "new URL" in message and "target b removed" in message
    assert list(exporter.store.series) == []


def test_reload_applies_log_level_and_format(tmp_path: Path, servers: Callable[..., HostileServer]) -> None:
    """One of two engines lacks its accepted counter: every collection logs it at debug level, so the lines
    show up exactly when a reload turns debug on, and in JSON when the reload asks for JSON."""
    body = v1_body(300, 200) + b'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 10\n'
    a = servers(scripted(lambda: body))
    port = closed_port()
    config = write(tmp_path / "c.yml", config_text({"a": a.url}))
    sidecar = Process(["--config.file", str(config), "--web.listen-address", f"127.0.0.1:{port}"],
                      f"http://127.0.0.1:{port}")
    try:
        sidecar.wait_until(lambda: len(a.requests) >= 3)
        write(config, config_text({"a": a.url}) + "log:\n  level: debug\n  format: json\n")
        response = sidecar.client.post(sidecar.base_url + "/-/reload")
        assert response.status_code == 200
        assert "log.level info → debug applied; log.format logfmt → json applied" in response.text
        requests = len(a.requests)
        sidecar.wait_until(lambda: len(a.requests) >= requests + 3)
    finally:
        stderr = sidecar.stop()
    before, _, after = stderr.partition("configuration reloaded")
    assert "series not decodable" not in before
    debug = [json.loads(line) for line in after.splitlines() if "series not decodable" in line]
    assert len(debug) >= 2 and all(d["level"] == "debug" and d["target"] == "a" for d in debug)


def test_sigterm_lets_streams_through_the_tap_finish(tmp_path: Path) -> None:
    """A pod rollout: SIGTERM while a stream runs through the request tap. The stream completes (the tap drains
    for up to tap.drain_timeout), is recorded, and the sidecar exits 0 right after."""
    from devtools.procs import exporter_command, running

    with running("simulator", lambda p: [*exporter_command(), "simulate", "--web.listen-address",
                                         f"127.0.0.1:{p}", "--acceptance-rate", "0.7"], tmp_path, "/health") as sim:
        port, tap = closed_port(), closed_port()
        config = write(tmp_path / "c.yml", config_text({"vllm": f"{sim.url}/metrics"})
                       + f"tap: {{listen_address: '127.0.0.1:{tap}', drain_timeout: 10s}}\n")
        sidecar = Process(["--config.file", str(config), "--web.listen-address", f"127.0.0.1:{port}"],
                          f"http://127.0.0.1:{port}")
        try:
            sidecar.wait_until(lambda: sidecar.client.get(sidecar.base_url + "/readyz").status_code == 200)
            body = {"prompt": "hi", "max_tokens": 120, "stream": True, "stream_options": {"include_usage": True}}
            with httpx.Client(timeout=10) as client, client.stream(
                    "POST", f"http://127.0.0.1:{tap}/v1/completions", json=body) as response:
                lines = response.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                started = time.monotonic()
                sidecar.proc.send_signal(signal.SIGTERM)
                rest = [line for line in lines if line.startswith("data: ")]
            code = sidecar.proc.wait(10)
            elapsed = time.monotonic() - started
        finally:
            stderr = sidecar.stop()
    assert code == 0, stderr
    assert first.startswith("data: {") and rest[-1] == "data: [DONE]"
    assert '"speculative_decoding"' in rest[-2], "the usage chunk with the request's metrics arrived"
    assert elapsed < 8.0, f"the sidecar waited {elapsed:.1f}s, not just until the stream ended"
    assert "request tap stopped" in stderr and "cut=0" in stderr and "in_flight_at_stop=1" in stderr, stderr
