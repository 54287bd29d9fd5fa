"""The requirements of the project in pyproject.toml and of the extras named, one a line, the project's own
extras (specdecode-exporter[plot,…]) expanded: what scripts/bootstrap-venv.sh installs before the wheel.

    python3 scripts/requirements.py pyproject.toml          # the runtime dependencies
    python3 scripts/requirements.py pyproject.toml test     # and the test extras'
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable, Iterator


def expand(requirements: Iterable[str], name: str, extras: dict[str, list[str]]) -> Iterator[str]:
    own = re.compile(re.escape(name) + r"\[([^\]]*)\]")
    for requirement in requirements:
        match = own.fullmatch(requirement.strip())
        if match is None:
            yield requirement
            continue
        for extra in match.group(1).split(","):
            yield from expand(extras[extra.strip()], name, extras)


def requirements(pyproject: str, wanted_extras: Iterable[str]) -> list[str]:
    with open(pyproject, "rb") as file:
        project = tomllib.load(file)["project"]
    extras = project.get("optional-dependencies", {})
    wanted = list(project["dependencies"]) + [r for extra in wanted_extras for r in extras[extra]]
    return list(dict.fromkeys(expand(wanted, project["name"], extras)))


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], sys.argv[2:])))
