"""Write the metric reference table (generated from exporter/metrics.py) into README.md; --check to verify."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from exporter.metrics import reference_table

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"(<!-- metric-reference:start -->\n).*?(<!-- metric-reference:end -->)", re.DOTALL)


def render(readme: str) -> str:
    if not BLOCK.search(readme):
        raise SystemExit("README.md has no <!-- metric-reference:start/end --> markers")
    return BLOCK.sub(lambda m: m.group(1) + reference_table() + "\n" + m.group(2), readme)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date")
    args = parser.parse_args()
    current = README.read_text(encoding="utf-8")
    wanted = render(current)
    if args.check:
        if current != wanted:
            print("README.md metric reference is out of date: run make generate", file=sys.stderr)
            return 1
        return 0
    README.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
