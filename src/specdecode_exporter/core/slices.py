"""Long work on the event loop in slices: between two, the loop serves scrapes and whatever else is waiting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TypeVar

# How long one slice may hold the loop: a scrape waits for at most about this long behind a render or a collection.
SLICE_SECONDS = 0.0005

T = TypeVar("T")


async def run_sliced(steps: Iterator[T], budget: float = SLICE_SECONDS) -> list[T]:
    """Every item of ``steps``, handing the event loop back whenever a slice has run ``budget`` seconds."""
    out: list[T] = []
    started = time.perf_counter()
    for item in steps:
        out.append(item)
        if time.perf_counter() - started >= budget:
            await asyncio.sleep(0)
            started = time.perf_counter()
    return out
