"""Long work on the event loop in slices: between two, the loop serves scrapes and whatever else is waiting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TypeVar

# How long one slice may hold the loop: a scrape waits for at most about this long behind a render or a collection.
SLICE_SECONDS = 0.0005

T = TypeVar("T")


class Slice:
    """The slice under way: ``boundary()`` hands the loop back once it has run ``budget`` seconds, and only then.
    Work done in pieces (a collection: fetch, decode, store, views) passes a boundary between two; a piece that
    came in well under the budget (a real vLLM page's, ~0.2 ms) goes on without a turn of the loop, each of which
    costs about a tenth of that page's whole collection."""

    __slots__ = ("budget", "started")

    def __init__(self, budget: float = SLICE_SECONDS) -> None:
        self.budget = budget
        self.started = time.perf_counter()

    async def boundary(self) -> None:
        if time.perf_counter() - self.started >= self.budget:
            await asyncio.sleep(0)
            self.started = time.perf_counter()


async def run_sliced(steps: Iterator[T], budget: float = SLICE_SECONDS, under_way: Slice | None = None) -> list[T]:
    """Every item of ``steps``, handing the event loop back whenever a slice has run ``budget`` seconds
    (``under_way``: the slice of the work these steps continue, which counts from where it began)."""
    out: list[T] = []
    started = time.perf_counter() if under_way is None else under_way.started
    for item in steps:
        out.append(item)
        if time.perf_counter() - started >= budget:
            await asyncio.sleep(0)
            started = time.perf_counter()
    if under_way is not None:
        under_way.started = started
    return out
