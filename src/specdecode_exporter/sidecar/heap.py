"""When the sidecar's cyclic garbage collector runs: right after a scrape has been answered, when the next one is
furthest away.

A pass of the collector holds the event loop, and a scrape that arrives meanwhile waits it out. A 1 MB target's
store holds ~100k tracked objects once its 1h window has filled: a young pass took 12-24 ms and a middle one
25-80 ms (measured in-process, two shared cores), most of what made a scrape's p99 miss 10 ms. Prometheus scrapes
each target at a fixed interval, so the moment after it has been answered is when a pause delays nobody.

The passes follow CPython's own schedule (a middle pass every ``threshold1``-th, a full one every
``threshold1 × threshold2``-th), only made at that moment. The automatic collector stays on as the safety net of a
sidecar nobody scrapes, at a young threshold that scrapes keep it under.
"""

from __future__ import annotations

import asyncio
import gc

# Without scrapes nothing waits on the loop; with them the young generation never gets this far.
AUTOMATIC_YOUNG_THRESHOLD = 50_000
# Fewer new objects than this since the last pass (scrapes back to back): no pass.
SCRAPE_YOUNG_MINIMUM = 100
SEND_GRACE_SECONDS = 0.05  # for the loop to send the rest of a response; scrapers come seconds apart
# A response this small goes to the socket in its one write (Linux's smallest default send buffer is 16 KiB):
# nothing is left for the loop to send, and the pass runs at once instead of in a wakeup of its own.
SENT_AT_ONCE_BYTES = 16 * 1024


def tune_gc() -> None:
    """Move everything alive at start (modules, config) out of the collector's way for good, and leave the passes
    to collect_after_scrape."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(AUTOMATIC_YOUNG_THRESHOLD, middle, old)


def collect_after_scrape() -> int | None:
    """The pass the automatic collector would make next, made now: the generation collected, or None when too few
    objects are new to be worth one."""
    young, middle, old = gc.get_count()
    if young < SCRAPE_YOUNG_MINIMUM:
        return None
    _, middle_threshold, old_threshold = gc.get_threshold()
    generation = 0
    if middle + 1 >= middle_threshold:
        generation = 2 if old + 1 >= old_threshold else 1
    gc.collect(generation)
    return generation


async def collect_after_response(body_bytes: int) -> None:
    """collect_after_scrape as a response's background task, on the event loop (Starlette would hand a plain
    function to a thread, where the pass would hold the interpreter all the same). After a large body it waits a
    moment first: what the socket did not take at once (a 1 MB target's gzipped page is ~90 KB) is sent by the
    loop, after the task has begun."""
    if body_bytes > SENT_AT_ONCE_BYTES:
        await asyncio.sleep(SEND_GRACE_SECONDS)
    collect_after_scrape()
