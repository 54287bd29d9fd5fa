"""devtools/check_links.py, the link check of `make lint`: it finds a link to a missing file and an anchor that no
heading makes, one line each, and passes what GitHub resolves (its heading slugs, repeated headings, explicit
anchors, links in code left alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.check_links import anchors, check, main, slug


def _tree(root: Path, files: dict[str, str]) -> list[Path]:
    paths = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Two commands", "two-commands"),
    ("Before you ship: `specdecode-exporter probe`", "before-you-ship-specdecode-exporter-probe"),
    ("Is it paying off, measured? Baselines, load and the verdict",
     "is-it-paying-off-measured-baselines-load-and-the-verdict"),
    ("The request tap (opt-in, per-request α)", "the-request-tap-opt-in-per-request-α"),
    ("5. The break-even model", "5-the-break-even-model"),
    ("**Bold** and [a link](x.md) and snake_case", "bold-and-a-link-and-snake_case"),
    ("Rules at fleet scale — where they run", "rules-at-fleet-scale--where-they-run"),
])
def test_slugs_are_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_repeated_headings_are_numbered_and_code_blocks_make_none() -> None:
    text = "# A\n\n## Notes\n\n## Notes\n\n```sh\n# not a heading\n```\n\n<a id=\"here\"></a>\n"
    assert anchors(text) == {"a", "notes", "notes-1", "here"}


def test_good_links_pass(tmp_path: Path) -> None:
    paths = _tree(tmp_path, {
        "README.md": ("# Top\n\n## Install it\n\nSee [install](#install-it), [the page](docs/page.md#the-page-2m),"
                      " [a dir](docs/), [code](src/x.py#L3), [web](https://example.com/#nothing) and `[not](a.md)`.\n"
                      "\n```\n[inside a block](nowhere.md)\n```\n\n[ref]: docs/page.md#top-of-page\n"),
        "docs/page.md": "# Top of page\n\n## The page (2m)\n\nBack to [the README](../README.md#top).\n",
        "src/x.py": "x = 1\n",
    })
    assert check(p for p in paths if p.suffix == ".md") == []


def test_a_missing_file_and_a_missing_anchor_are_each_one_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    paths = _tree(tmp_path, {
        "README.md": "# Top\n\nSee [gone](docs/gone.md) and [the tap](docs/tap.md#the-request-tap).\n",
        "docs/tap.md": "# Tap\n\n## The request tap, moved\n\nAnd [here](#nothing-here).\n",
    })
    broken = check(paths)
    assert [(b.link.source.name, b.link.line, b.link.target) for b in broken] == [
        ("README.md", 3, "docs/gone.md"), ("README.md", 3, "docs/tap.md#the-request-tap"),
        ("tap.md", 5, "#nothing-here")]
    assert "no file docs/gone.md" in broken[0].reason
    assert "no heading #the-request-tap" in broken[1].reason

    assert main([str(p) for p in paths]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4  # one per broken link, then the count
    assert lines[0].endswith("README.md:3: broken link (docs/gone.md): no file docs/gone.md")
    assert lines[-1] == "check_links: 3 broken link(s) in 2 Markdown file(s)"
