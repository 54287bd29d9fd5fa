"""Coverage-guided fuzzing of the ingest path with atheris (libFuzzer), seeded with the real expositions.

    python tests/fuzz/atheris_parser.py -runs=200000 -max_len=65536 [CORPUS_DIR]

Any exception other than CollectionFailure, and any hang (-timeout, seconds per input), is a crash."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports(include=["exporter"]):
    from tests.fuzz.target import FIXTURES, Target

TARGET = Target()


def test_one_input(data: bytes) -> None:
    TARGET.feed(data)


def main() -> None:
    args = list(sys.argv)
    if not any(not a.startswith("-") for a in args[1:]):  # no corpus given: seed one from the fixtures
        corpus = tempfile.mkdtemp(prefix="specdecode-fuzz-")
        for fixture in FIXTURES.glob("*.prom"):
            shutil.copy(fixture, corpus)
        args.append(corpus)
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
