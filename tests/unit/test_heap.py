"""The sidecar's garbage-collection schedule (sidecar/heap.py): the passes CPython would make, made right after a
scrape is answered."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from specdecode_exporter.sidecar.heap import (
    SCRAPE_YOUNG_MINIMUM,
    SENT_AT_ONCE_BYTES,
    collect_after_response,
    collect_after_scrape,
)


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


@pytest.mark.parametrize(("body_bytes", "at_once"), [(SENT_AT_ONCE_BYTES, True), (SENT_AT_ONCE_BYTES + 1, False)])
def test_the_pass_after_a_small_response_runs_in_its_turn_of_the_loop(thresholds: None, body_bytes: int,
                                                                      at_once: bool) -> None:
    """A body the socket took in its one write leaves nothing for the loop to send: the pass runs in the turn
    that sent it, not in a wakeup of its own SEND_GRACE_SECONDS later (a larger body's rest is sent first)."""

    async def one_turn() -> bool:
        kept = [[] for _ in range(2 * SCRAPE_YOUNG_MINIMUM)]
        task = asyncio.ensure_future(collect_after_response(body_bytes))
        await asyncio.sleep(0)  # the task's first step
        done = task.done() and gc.get_count()[0] < SCRAPE_YOUNG_MINIMUM
        await task
        assert kept and gc.get_count()[0] < SCRAPE_YOUNG_MINIMUM  # made either way
        return done

    assert asyncio.run(one_turn()) is at_once
