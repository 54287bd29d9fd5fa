"""The sidecar's garbage-collection schedule (sidecar/heap.py): the passes CPython would make, made right after a
scrape is answered."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from specdecode_exporter.sidecar.heap import SCRAPE_YOUNG_MINIMUM, collect_after_scrape


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(1_000_000, 4, 3)  # no automatic pass meanwhile; a middle pass every 4th, a full every 12th
    gc.collect()
    try:
        yield
    finally:
        gc.set_threshold(*before)


def test_scrapes_make_young_middle_and_full_passes_on_cpythons_schedule(thresholds: None) -> None:
    made, kept = [], []
    for _ in range(24):
        kept.append([[] for _ in range(2 * SCRAPE_YOUNG_MINIMUM)])  # new tracked objects since the last pass
        made.append(collect_after_scrape())
        assert gc.get_count()[0] < SCRAPE_YOUNG_MINIMUM
    assert made == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2] * 2


def test_a_scrape_right_after_a_pass_makes_none(thresholds: None) -> None:
    kept = [[] for _ in range(2 * SCRAPE_YOUNG_MINIMUM)]
    assert collect_after_scrape() == 0
    assert collect_after_scrape() is None  # back to back: nothing new worth a pass
    assert kept
