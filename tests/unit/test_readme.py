"""The README is the front door; docs/ holds the rest. The metric reference in docs/metrics.md is generated from
the code, the install paths (docs/install.md, the README's quickstart) are the ones `make test` runs, and no link or
anchor in the Markdown breaks."""

from __future__ import annotations

import re
from pathlib import Path

from devtools.check_links import check, tracked_markdown
from specdecode_exporter.core.contract.metrics import CONTRACT, reference_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
METRICS = ROOT / "docs" / "metrics.md"
INSTALL = ROOT / "docs" / "install.md"


def test_metric_reference_matches_the_code() -> None:
    text = METRICS.read_text(encoding="utf-8")
    block = re.search(r"<!-- metric-reference:start -->\n(.*?)\n<!-- metric-reference:end -->", text, re.DOTALL)
    assert block is not None, "docs/metrics.md lost its metric-reference markers"
    assert block.group(1) == reference_table(), "run `make generate` to refresh docs/metrics.md"


def test_every_contract_metric_is_in_the_metric_reference() -> None:
    text = METRICS.read_text(encoding="utf-8")
    for spec in CONTRACT:
        assert f"`{spec.exposed_name}`" in text


def test_the_readme_names_only_metrics_the_code_exports() -> None:
    """The README's metrics at a glance are a selection of the contract, each under its exposed name."""
    text = README.read_text(encoding="utf-8")
    glance = text[text.index("## Metrics at a glance"):text.index("\n## ", text.index("## Metrics at a glance") + 3)]
    exposed = {spec.exposed_name for spec in CONTRACT}
    named = {name for row in glance.splitlines() if row.startswith("| `specdecode_")
             for name in re.findall(r"`(specdecode_[a-z_]+)", row.split(" | ")[0])}
    assert len(named) >= 10, named
    assert named <= exposed, named - exposed


def _quickstart(readme: str) -> str:
    return readme[readme.index("## Quickstart"):readme.index("\n## ", readme.index("## Quickstart") + 3)]


def test_the_quickstart_gives_both_commands_and_says_ci_runs_make_test() -> None:
    """`make demo` to see it, `make test` to test it, and CI (`.ci/run`) runs exactly `make test`."""
    quickstart = _quickstart(README.read_text(encoding="utf-8"))
    assert "make demo" in quickstart and "make test" in quickstart
    assert "`.ci/run` runs exactly `make test`" in quickstart
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["make test"], ci


def test_make_demo_is_not_said_to_need_root_and_make_test_is() -> None:
    """Only `make test` installs Debian packages (its `tools` prerequisite); `make demo` builds a venv."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo = re.search(r"^demo:([^#\n]*)", makefile, re.M)
    test = re.search(r"^test:([^#\n]*)", makefile, re.M)
    assert demo is not None and test is not None
    assert "tools" not in demo.group(1).split() and "tools" in test.group(1).split()
    quickstart = _quickstart(README.read_text(encoding="utf-8"))
    paragraphs = quickstart.split("\n\n")
    for paragraph in paragraphs:
        if "make demo" in paragraph and "make test" not in paragraph:
            assert "root" not in paragraph.replace("no root", "").replace("as any user", ""), paragraph
    assert any("make test" in p and "root" in p and "sudo" in p for p in paragraphs)


def _prose_paragraphs(text: str) -> list[list[str]]:
    """Runs of prose lines: not code blocks, tables, headings or list items' continuation-free lines."""
    paragraphs: list[list[str]] = [[]]
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            paragraphs.append([])
        elif fenced or not line.strip() or line.startswith(("|", "#", "- ")):
            paragraphs.append([])
        else:
            paragraphs[-1].append(line)
    return [p for p in paragraphs if p]


def test_the_readme_is_a_front_door() -> None:
    """Under 200 lines; within the first 60 what it is and why, the quickstart (the demo, pip install and `run
    --target`) and links; no prose paragraph over six lines. Everything else lives in docs/."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 200, len(lines)
    head = "\n".join(lines[:60])
    for shown in ("**Why.**", "## Quickstart", "make demo", "pip install", "specdecode-exporter run --target",
                  "](docs/demo.md)", "](docs/install.md)"):
        assert shown in head, shown
    long = [p for p in _prose_paragraphs("\n".join(lines)) if len(p) > 6]
    assert not long, long


def test_the_readme_pip_path_is_the_bare_installs() -> None:
    """The quickstart's pip path runs the sidecar with the flags the bare-install test runs it with."""
    quickstart = _quickstart(README.read_text(encoding="utf-8"))
    bare = (ROOT / "tests" / "packaging" / "test_bare_install.py").read_text(encoding="utf-8")
    for flag in ('"run", "--target"', '"--tap.listen-address"'):
        assert flag in bare, flag
    assert "pip install ." in quickstart
    assert re.search(r"specdecode-exporter run --target \S+ --tap.listen-address", quickstart)


SOURCES = [p for pattern in ("src/specdecode_exporter/**/*.py", "devtools/*.py", "bench/*.py", "scripts/*", "*.md",
                             "docs/*.md", "alerts/*.md", "grafana/*.md", "deploy/*.md") for p in ROOT.glob(pattern)]


def test_the_design_the_code_cites_is_in_the_repository() -> None:
    """The code and docs refer to docs/architecture.md, never to a design document outside the repository."""
    assert (ROOT / "docs" / "architecture.md").is_file()
    for path in SOURCES:
        if path.name == "engines-research.md":  # cites the shared design it was researched against, by name
            continue
        assert not re.search(r"DESIGN(\.md| §)", path.read_text(encoding="utf-8", errors="replace")), path


def test_no_link_or_anchor_in_the_markdown_is_broken() -> None:
    """What `make lint` checks (devtools/check_links.py), on every tracked Markdown file."""
    paths = tracked_markdown(ROOT)
    assert README in paths and METRICS in paths
    broken = check(paths)
    assert not broken, "\n".join(map(str, broken))


def test_the_install_paths_are_the_ones_make_test_runs() -> None:
    """docs/install.md gives the pip path, the image and the manifests with the commands the tests run: when one
    changes, the page must follow."""
    install = INSTALL.read_text(encoding="utf-8")
    make_test = re.search(r"^test:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert make_test is not None
    for step in ("scripts/runtime-venv.sh", "scripts/build-image.sh --local-base --smoke"):
        assert step in make_test.group(1), step
    assert "scripts/build-image.sh --local-base --smoke" in install
    # The bare install runs the sidecar with these flags; the page's pip path shows the same.
    bare = (ROOT / "tests" / "packaging" / "test_bare_install.py").read_text(encoding="utf-8")
    for flag in ('"run", "--target"', '"--tap.listen-address"'):
        assert flag in bare, flag
    assert re.search(r"specdecode-exporter run --target \S+ --tap.listen-address", install)
    # The smoke runs the image as Kubernetes does; the page runs it with the same restrictions.
    smoke = re.search(r"^RESTRICTED=\((.*)\)$", (ROOT / "scripts" / "build-image.sh").read_text(encoding="utf-8"),
                      re.M)
    assert smoke is not None
    restrictions = smoke.group(1).replace(" --network host", "")
    assert f"podman run --rm {restrictions}" in install, restrictions
    assert "not applied to a cluster" in install and "tests/deploy/" in install


def _bounds(values: tuple[float, ...]) -> str:
    return ", ".join(f"{v:g}" for v in values) + ", +Inf"


def test_the_metric_reference_states_the_bucket_bounds_the_code_uses() -> None:
    """The bounds are a promise (native histograms with custom buckets need them fixed): the list in
    docs/metrics.md is the code's."""
    from specdecode_exporter.core.contract.metrics import ACCEPTANCE_RATIO_BUCKETS
    from specdecode_exporter.tap.request_stats import LENGTH_BUCKETS, SPEED_BUCKETS

    text = METRICS.read_text(encoding="utf-8")
    block = re.search(r"<!-- bucket-bounds:start -->\n(.*?)\n<!-- bucket-bounds:end -->", text, re.DOTALL)
    assert block is not None, "docs/metrics.md lost its bucket-bounds markers"
    lines = dict(line.split(": ", 1) for line in block.group(1).splitlines())
    alpha = ACCEPTANCE_RATIO_BUCKETS
    assert alpha == tuple(round(0.05 * i, 2) for i in range(1, 21))
    assert lines["- `specdecode_request_acceptance_ratio`, `specdecode_interval_acceptance_ratio`"] == (
        f"{alpha[0]:g}, {alpha[1]:g}, …, {alpha[-2]:g}, {alpha[-1]:g} (every 0.05), +Inf")
    assert lines["- `specdecode_request_mean_acceptance_length`"] == _bounds(LENGTH_BUCKETS)
    assert lines["- `specdecode_request_output_tokens_per_second`"] == _bounds(SPEED_BUCKETS)
