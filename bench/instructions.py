"""Instructions per collection of the moving ~1 MB exposition, and per prometheus_client parse of it, counted by
valgrind (cachegrind, no cache simulation): a figure the shared machine's noise cannot move, for comparing two
versions of the code (an A/B of a few %), not a substitute for bench 1's CPU-time ratio (the parser runs at a
different number of instructions per cycle).

    .venv/bin/python -m bench.instructions            # this checkout's installed package
    PYTHONPATH=/tmp/old .venv/bin/python -m bench.instructions   # a copy of another version's package

Each figure is the difference between a child that does N calls and one that does none, so imports, the
simulator's renders and the warm-up cancel out. Takes a few minutes (valgrind runs Python ~50× slower).
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from bench.collect import Pipeline, baseline_parse, body_sequence

_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def _child(kind: str, calls: int, bodies_file: str) -> None:
    with open(bodies_file, "rb") as f:
        bodies: list[bytes] = pickle.load(f)
    pipeline = Pipeline(bodies)
    for _ in range(calls):
        if kind == "collection":
            pipeline()
        else:
            baseline_parse(bodies[0])


def _instructions(kind: str, calls: int, bodies_file: str) -> int:
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, "-m", "bench.instructions", "--child", kind, str(calls), bodies_file]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ.copy())
    found = _REFS.search(done.stderr)
    if found is None:
        raise SystemExit(f"valgrind gave no instruction count: {done.stderr[-300:]}")
    return int(found.group(1).replace(",", ""))


def measure(collections: int, parses: int) -> dict[str, float]:
    """Instructions per collection and per baseline parse, the four valgrind runs two at a time."""
    with tempfile.NamedTemporaryFile(suffix=".pickle") as bodies_file:
        pickle.dump(body_sequence(4, 20, 8, 12), bodies_file)
        bodies_file.flush()
        runs = {("collection", 0): 0, ("collection", collections): 0, ("baseline", 0): 0, ("baseline", parses): 0}
        with ThreadPoolExecutor(max_workers=2) as pool:
            counted = {run: pool.submit(_instructions, run[0], run[1], bodies_file.name) for run in runs}
            results = {run: future.result() for run, future in counted.items()}
    collection = (results["collection", collections] - results["collection", 0]) / collections
    baseline = (results["baseline", parses] - results["baseline", 0]) / parses
    return {"collection": collection, "baseline": baseline, "ratio": baseline / collection}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collections", type=int, default=8)
    parser.add_argument("--parses", type=int, default=2)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "CALLS", "BODIES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args.child[2])
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("bench.instructions needs valgrind (apt-get install valgrind)")
    m = measure(args.collections, args.parses)
    print(f"collection: {m['collection'] / 1e6:.1f} M instructions; prometheus_client parse: "
          f"{m['baseline'] / 1e6:.0f} M; baseline / collection: {m['ratio']:.1f}×")


if __name__ == "__main__":
    main()
