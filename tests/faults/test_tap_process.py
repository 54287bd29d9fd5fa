"""The request tap relays in a process of its own (tap/process.py), against the real sidecar process and the
simulator's vLLM API. The sidecar reads the tap's counters at each scrape, starts the tap again when it dies or is
stuck (its counters carried over: nothing exported goes down), and stops it with itself; a sidecar killed
outright leaves no tap process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from devtools.procs import Process, child_pids, exporter_command, free_port, running, tail
from tests.helpers import Exposition

pytestmark = pytest.mark.timeout(180)
REQUESTS = "specdecode_requests_total"


def children(pid: int) -> list[int]:
    return [p for p in child_pids(pid) if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def tap_process(sidecar: Process) -> int:
    (pid,) = [p for p in children(sidecar.popen.pid)
              if b"specdecode_exporter.tap" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return pid


def wait_for(check: Callable[[], object], timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.05)
    raise AssertionError("not reached in time")


class Tapped:
    def __init__(self, sidecar: Process, tap_port: int) -> None:
        self.sidecar = sidecar
        self.tap_url = f"http://127.0.0.1:{tap_port}"

    def send(self, count: int) -> None:
        with httpx.Client(base_url=self.tap_url, timeout=10) as client:
            for _ in range(count):
                client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 8}).raise_for_status()

    def requests(self) -> float:
        text = httpx.get(f"{self.sidecar.url}/metrics", timeout=5).text
        return sum(Exposition.parse(text).all(REQUESTS).values())


def sidecar_with_tap(tmp: Path, simulator_url: str, tap_port: int) -> Callable[[int], list[str]]:
    return lambda port: [*exporter_command(), "run", "--target", f"{simulator_url}/metrics", "--web.listen-address",
                         f"127.0.0.1:{port}", "--tap.listen-address", f"127.0.0.1:{tap_port}",
                         "--collect.interval", "1s"]


@pytest.fixture(scope="module")
def simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp = tmp_path_factory.mktemp("tap-process")
    with running("simulator", lambda p: [*exporter_command(), "simulate", "--web.listen-address",
                                         f"127.0.0.1:{p}", "--acceptance-rate", "0.7", "--pace", "false"],
                 tmp, "/health") as sim:
        yield sim


@pytest.fixture
def tapped(simulator: Process, tmp_path: Path) -> Iterator[Tapped]:
    tap_port = free_port()
    with running("sidecar", sidecar_with_tap(tmp_path, simulator.url, tap_port), tmp_path, "/healthz") as sidecar:
        yield Tapped(sidecar, tap_port)


def test_the_tap_relays_in_its_own_process_and_a_scrape_reads_its_counters_at_once(tapped: Tapped) -> None:
    pid = tap_process(tapped.sidecar)
    assert pid != tapped.sidecar.popen.pid
    listening = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert any(link.startswith("socket:") for link in listening)
    before = tapped.requests()
    tapped.send(7)
    assert tapped.requests() == before + 7  # the very next scrape: it asks the tap process for its counters


def test_a_killed_tap_process_is_started_again_and_no_count_goes_down(tapped: Tapped) -> None:
    tapped.send(5)
    counted = tapped.requests()
    first = tap_process(tapped.sidecar)
    os.kill(first, signal.SIGKILL)
    second = wait_for(lambda: next((p for p in children(tapped.sidecar.popen.pid) if p != first), None))
    assert second and tapped.sidecar.alive()
    assert tapped.requests() >= counted  # carried over from the process that died
    tapped.send(3)  # served by the new tap process
    assert tapped.requests() == counted + 3
    log = tapped.sidecar.log.read_text()
    assert "request tap process exited; starting it again" in log and "Traceback" not in log, tail(
        tapped.sidecar.log, 20)


def test_a_stuck_tap_process_is_noticed_killed_and_started_again(tapped: Tapped) -> None:
    tapped.send(2)
    counted = tapped.requests()
    stuck = tap_process(tapped.sidecar)
    os.kill(stuck, signal.SIGSTOP)  # alive, answering nothing: as a relay caught in a loop would be
    for _ in range(5):  # each scrape waits 1 s for the tap's counters, then serves the last ones
        assert tapped.requests() == counted
    wait_for(lambda: not _alive(stuck))
    wait_for(lambda: [p for p in children(tapped.sidecar.popen.pid) if p != stuck])
    tapped.send(1)
    assert tapped.requests() == counted + 1
    log = tapped.sidecar.log.read_text()
    assert "request tap process did not answer; serving its last counters" in log
    assert "request tap process is stuck; killing it to start it again" in log


def test_a_killed_sidecar_leaves_no_tap_process(simulator: Process, tmp_path: Path) -> None:
    tap_port = free_port()
    with running("sidecar", sidecar_with_tap(tmp_path, simulator.url, tap_port), tmp_path, "/healthz") as sidecar:
        Tapped(sidecar, tap_port).send(1)
        pid = tap_process(sidecar)
        sidecar.popen.send_signal(signal.SIGKILL)  # the sidecar alone: its tap is not in the signal's way
        sidecar.popen.wait(10)
        wait_for(lambda: not _alive(pid))  # the tap's end of the pair closed: it drains and exits


def test_sigterm_to_the_group_drains_through_the_sidecar_and_both_exit(tapped: Tapped) -> None:
    pid = tap_process(tapped.sidecar)
    tapped.send(1)
    tapped.sidecar.stop()  # SIGTERM to the whole process group, as a terminal's Ctrl-C or `kill -- -PGID` does
    assert tapped.sidecar.popen.returncode == 0, tail(tapped.sidecar.log, 20)
    assert not _alive(pid)
    log = tapped.sidecar.log.read_text()
    assert "request tap stopped" in log and "starting it again" not in log, tail(tapped.sidecar.log, 20)


def test_the_tap_process_run_by_hand_says_what_it_is_in_one_line() -> None:
    result = subprocess.run([sys.executable, "-m", "specdecode_exporter.tap"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "--tap.listen-address" in result.stderr
