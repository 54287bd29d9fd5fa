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


def test_the_passes_follow_scrapes_not_the_automatic_threshold(sidecar: Process) -> None:
    start = gc_passes(sidecar)  # its own pass follows it
    time.sleep(SCRAPES * 0.6)  # collections go on; nobody scrapes
    quiet = gc_passes(sidecar) - start
    for _ in range(SCRAPES):
        time.sleep(0.6)  # a collection or more in between
        gc_passes(sidecar)
    time.sleep(0.3)  # the last one's pass runs once its response is sent
    busy = gc_passes(sidecar) - start - quiet
    # Without scrapes, only the pass after the first read: the automatic collector waits for 50,000 new objects.
    assert quiet <= 1, f"{quiet} passes while nobody scraped"
    # With them, a pass after every scrape that found heap.SCRAPE_YOUNG_MINIMUM new tracked objects. The count is
    # net (CPython's own trigger counts the same): in steady state a collection frees the views the one before
    # made, so now and then a scrape finds fewer new and rightly makes none (82 against 400-500, measured).
    assert busy >= SCRAPES // 2, f"{busy} passes after {SCRAPES + 1} scrapes"
