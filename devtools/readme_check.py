"""The README's `check` example, from a real run: `specdecode-exporter check` (the installed CLI) against the
embedded simulator (α 0.72, the README's numbers), its output shown as if vLLM listened on 127.0.0.1:8000.

    .venv/bin/python -m devtools.readme_check           # rewrite the README's example block from a fresh run
    .venv/bin/python -m devtools.readme_check --print   # print the run's output only

tests/unit/test_readme_check.py holds the README's block to a fresh run's output, numbers aside (they move from
run to run): every line there, in order, and no other.
"""

from __future__ import annotations

import re
import subprocess
import sys

from devtools.procs import ROOT, child_env, exporter_command
from specdecode_exporter.simulator import ModelSpec, Simulator, steady_scenario
from specdecode_exporter.simulator.server import serve_in_thread

README = ROOT / "README.md"
SHOWN_URL = "http://127.0.0.1:8000/metrics"
OPENING = "`check` answers a newcomer's first question:\n\n```\n"
CLOSING = "```\n"
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def check_output(duration: str = "10s") -> str:
    """What `check` prints against a simulated vLLM, its URL replaced by the README's."""
    server, url = serve_in_thread(Simulator(steady_scenario(ModelSpec(acceptance_rate=0.72))))
    try:
        result = subprocess.run([*exporter_command(), "check", url + "/metrics", "--duration", duration],
                                capture_output=True, text=True, timeout=120, env=child_env(), check=True)
    finally:
        server.stop()
    return result.stdout.replace(url + "/metrics", SHOWN_URL)


def readme_block(text: str) -> tuple[int, int]:
    """Where the example's text starts and ends in the README."""
    start = text.index(OPENING) + len(OPENING)
    return start, text.index(CLOSING, start)


def shape(text: str) -> list[str]:
    """The lines with every number as N and runs of spaces as one: what a run must match."""
    return [" ".join(_NUMBER.sub("N", line).split()) for line in text.strip("\n").splitlines()]


def main() -> int:
    output = check_output()
    if "--print" in sys.argv[1:]:
        sys.stdout.write(output)
        return 0
    text = README.read_text(encoding="utf-8")
    start, end = readme_block(text)
    README.write_text(text[:start] + output + text[end:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
