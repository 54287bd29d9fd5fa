"""Every relative link in every tracked Markdown file points at a file that exists, and every #anchor at a heading
(or an explicit `id`/`name`) of its target, by GitHub's rules: `make lint` runs it, one line per broken link.

    .venv/bin/python -m devtools.check_links            # the tracked *.md of this checkout
    .venv/bin/python -m devtools.check_links FILE.md …  # only these

GitHub's anchor of a heading: its text as rendered (code spans and links by their text, no emphasis markers),
lower case, every character that is not a letter, a mark, a digit, `-`, `_` or a space dropped, spaces as `-`;
a repeated anchor gets `-1`, `-2`, … Links with a scheme (`https:`, `mailto:`) are not followed. Standard
library only: lint runs it before anything else is installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_HTML_ANCHOR = re.compile(r"""<a\s[^>]*?(?:name|id)\s*=\s*["']([^"']+)["']""", re.I)
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), target optionally <bracketed> and followed by a "title".
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(frozen=True)
class Link:
    """A relative link as written, where it is written."""

    source: Path
    line: int
    target: str


@dataclass(frozen=True)
class Broken:
    """A link that leads nowhere, and why."""

    link: Link
    reason: str

    def __str__(self) -> str:
        where = self.link.source.relative_to(ROOT) if self.link.source.is_relative_to(ROOT) else self.link.source
        return f"{where}:{self.link.line}: broken link ({self.link.target}): {self.reason}"


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
        elif fence is not None and match and match.group(1).startswith(fence) and not line.strip(" `~"):
            fence = None
        elif fence is None:
            yield number, line


def _rendered(heading: str) -> str:
    """A heading's text as GitHub renders it: code spans, links and images by their text, no emphasis or HTML."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"(\*{1,3}|_{1,3})(\S.*?)\1", r"\2", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    kept = "".join(ch for ch in _rendered(heading).strip().lower()
                   if ch in "-_ " or unicodedata.category(ch)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown text defines: its headings' slugs (repeats numbered) and explicit HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(text):
        found.update(name for name in _HTML_ANCHOR.findall(line))
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path, text: str) -> Iterator[Link]:
    """The relative links of a Markdown text (not in code blocks or code spans)."""
    for number, line in _prose_lines(text):
        prose = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        targets = [m.group(1) for m in _INLINE_LINK.finditer(prose)]
        definition = _REFERENCE_DEF.match(prose)
        if definition:
            targets.append(definition.group(1))
        for target in targets:
            target = target.strip("<>")
            if target and not _SCHEME.match(target):
                yield Link(path, number, target)


def check_link(link: Link, anchors_of: dict[Path, set[str]]) -> Broken | None:
    """Why ``link`` is broken, or None."""
    file_part, _, anchor = link.target.partition("#")
    file_part = unquote(file_part)
    if file_part.startswith("/"):
        target = ROOT / file_part.lstrip("/")
    else:
        target = (link.source.parent / file_part).resolve() if file_part else link.source
    if not target.exists():
        return Broken(link, f"no file {file_part}")
    if not anchor or target.suffix.lower() != ".md" or target.is_dir():
        return None
    if target not in anchors_of:
        anchors_of[target] = anchors(target.read_text(encoding="utf-8"))
    if unquote(anchor).lower() not in anchors_of[target]:
        name = target.relative_to(ROOT) if target.is_relative_to(ROOT) else target
        return Broken(link, f"no heading #{anchor} in {name}")
    return None


def check(paths: Iterable[Path]) -> list[Broken]:
    """Every broken relative link in ``paths``."""
    anchors_of: dict[Path, set[str]] = {}
    broken = []
    for path in paths:
        path = path.resolve()
        for link in links(path, path.read_text(encoding="utf-8")):
            problem = check_link(link, anchors_of)
            if problem is not None:
                broken.append(problem)
    return broken


def tracked_markdown(root: Path = ROOT) -> list[Path]:
    """The Markdown files git tracks under ``root``, and new ones it does not ignore (every *.md below it outside
    .venv where git is missing)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.md"],
                                cwd=root, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for p in root.rglob("*.md") if ".venv" not in p.parts and ".git" not in p.parts)
    return sorted(root / name for name in listed.stdout.decode().split("\0") if name and (root / name).is_file())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(arg) for arg in args] if args else tracked_markdown()
    broken = check(paths)
    for problem in broken:
        print(problem, file=sys.stderr)
    if broken:
        print(f"check_links: {len(broken)} broken link(s) in {len(paths)} Markdown file(s)", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
