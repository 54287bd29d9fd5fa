"""The real sidecar makes its garbage-collection passes right after a scrape is answered (sidecar/heap.py), not
whenever an allocation crosses the automatic threshold (which could fall on the next scrape)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.procs import Process, exporter_command, running
from tests.helpers import Exposition

pytestmark = pytest.mark.timeout(120)
SCRAPES = 8


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Process]:
    with running("simulator", lambda p: [*exporter_command(), "simulate", "--web.listen-address", f"127.0.0.1:{p}",
                                         "--pace", "false"], tmp_path, "/health") as simulator, \
            running("sidecar", lambda p: [*exporter_command(), "run", "--target", f"{simulator.url}/metrics",
                                          "--web.listen-address", f"127.0.0.1:{p}", "--collect.interval", "0.5s"],
                    tmp_path, "/healthz") as sidecar:
        yield sidecar


def gc_passes(sidecar: Process) -> float:
    text = httpx.get(f"{sidecar.url}/metrics", timeout=5).text
    return sum(Exposition.parse(text).all("python_gc_collections_total").values())


def test_every_scrape_after_new_work_is_followed_by_a_pass(sidecar: Process) -> None:
    before = gc_passes(sidecar)
    for _ in range(SCRAPES):
        time.sleep(0.6)  # a collection or more in between: new objects
        gc_passes(sidecar)
    time.sleep(0.3)  # the last one's pass runs once its response is sent
    # One pass per scrape (the reading ones included); the automatic collector, at its threshold, would have made
    # one or two in these few seconds.
    assert gc_passes(sidecar) - before >= SCRAPES + 1
