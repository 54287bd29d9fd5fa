"""devtools.procs.start_processes: several servers started side by side (the real-vLLM tests start their pairs so)
are each ready and stay up after the threads that awaited them are gone, and one that cannot start takes the others
down with it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

from devtools.procs import Launch, StartError, start_processes


def http_server(tmp_path: Path, name: str) -> Launch:
    return Launch(name, lambda port: [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                  tmp_path / name, "/")


def test_started_side_by_side_each_is_ready_and_stays_up(tmp_path: Path) -> None:
    processes = start_processes([http_server(tmp_path, "a"), http_server(tmp_path, "b")], timeout=30)
    try:
        assert len({p.url for p in processes}) == 2 and all(p.started_seconds > 0 for p in processes)
        time.sleep(0.5)  # a child spawned from a helper thread gets its parent-death signal when that thread ends
        for process in processes:
            assert process.alive(), process.log.read_text()
            assert httpx.get(process.url + "/", timeout=5, trust_env=False).status_code == 200
    finally:
        for process in processes:
            process.stop()


def test_one_that_cannot_start_stops_the_others(tmp_path: Path) -> None:
    broken = Launch("broken", lambda port: [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "broken", "/")
    good = http_server(tmp_path, "good")
    with pytest.raises(StartError, match=r"broken not ready .*exit code 3"):
        start_processes([good, broken], timeout=30)
    # The good one was up or on its way: it is stopped, its port free again.
    log = (tmp_path / "good" / "good.0.log").read_text()
    port = int(log.split("http.server ", 1)[1].split()[0])
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=2, trust_env=False)
