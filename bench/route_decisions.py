"""Routing's false-decision rates and power, by simulation (docs/routing.md quotes this table).

    .venv/bin/python bench/route_decisions.py            # ~1 minute: 4000 blocks per cell
    .venv/bin/python bench/route_decisions.py --blocks 500

Each request of a class has its own α (prompts differ): Beta-distributed around the class's α with a standard
deviation `spread`, 20–200 drafted tokens, each accepted with the request's α. A block is `min_requests` such
requests (the default 50); pipeline/ratio_test.decide judges it as the router does. For each α relative to the
break-even (0.5 here; the rates depend on the distance, not on the level), the share of blocks that route an
unrouted class, and that bring a routed class back (judged on its canary's block).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from bench.common import markdown_table  # noqa: E402
from specdecode_exporter.pipeline import ratio_test  # noqa: E402
from specdecode_exporter.pipeline.ratio_test import RatioSums  # noqa: E402

BREAK_EVEN = 0.5
OFFSETS = (-0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2)
SPREADS = (0.05, 0.15, 0.25)


def request(rng: random.Random, alpha: float, spread: float) -> tuple[int, int]:
    """(drafted, accepted) of one request whose own α is Beta around ``alpha`` with sd ``spread``."""
    k = max(alpha * (1 - alpha) / spread**2 - 1, 1e-3)
    own = rng.betavariate(alpha * k, (1 - alpha) * k)
    drafted = rng.randint(20, 200)
    accepted = min(drafted, max(0, round(rng.gauss(drafted * own, math.sqrt(drafted * own * (1 - own))))))
    return drafted, accepted


def share(alpha: float, spread: float, routed: bool, blocks: int, size: int, rng: random.Random) -> float:
    """The share of blocks after which the class changes state."""
    changed = 0
    for _ in range(blocks):
        sums = RatioSums()
        for _ in range(size):
            sums = sums.added(*request(rng, alpha, spread))
        changed += ratio_test.decide(routed, sums, BREAK_EVEN, size) != routed
    return changed / blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=4000)
    parser.add_argument("--min-requests", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for offset in OFFSETS:
        alpha = BREAK_EVEN + offset
        cells = [f"{offset:+.2f}"]
        for spread in SPREADS:
            route = share(alpha, spread, False, args.blocks, args.min_requests, rng)
            back = share(alpha, spread, True, args.blocks, args.min_requests, rng)
            cells.append(f"{route:.2%} / {back:.2%}")
        rows.append(cells)
    print(f"Blocks of {args.min_requests} requests, {args.blocks} blocks per cell (seed {args.seed}); levels: route "
          f"{ratio_test.ROUTE_LEVEL:g}, return {ratio_test.RETURN_LEVEL:g}. Cells: share of blocks that route an "
          "unrouted class / bring a routed class back.\n")
    header = ["α − break-even", *(f"per-request sd {s:g}" for s in SPREADS)]
    print("\n".join(markdown_table(header, rows)))


if __name__ == "__main__":
    main()
