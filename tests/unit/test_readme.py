"""The README is the front door; docs/ holds the rest. The metric reference in docs/metrics.md is generated from
the code, the README's install paths are the ones `make test` runs, and no link or anchor in the Markdown breaks."""

from __future__ import annotations

import re
from pathlib import Path

from devtools.check_links import check, tracked_markdown
from specdecode_exporter.core.contract.metrics import CONTRACT, reference_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
METRICS = ROOT / "docs" / "metrics.md"


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


def test_readme_names_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "## Two commands" in text
    assert "make demo" in text and "make test" in text


def test_the_readme_stays_a_front_door() -> None:
    """A few hundred lines: what it is, the two commands, install, the first page, the metrics and alerts at a
    glance, links. Everything else lives in docs/."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 450


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


def test_the_install_paths_in_the_readme_are_the_ones_make_test_runs() -> None:
    """"Install" gives the pip path, the image and the manifests with the commands the tests run: when one changes,
    the README must follow."""
    readme = README.read_text(encoding="utf-8")
    install = readme[readme.index("## Install"):readme.index("## The first page you see")]
    make_test = re.search(r"^test:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert make_test is not None
    for step in ("scripts/runtime-venv.sh", "scripts/build-image.sh --local-base --smoke"):
        assert step in make_test.group(1), step
    assert "scripts/build-image.sh --local-base --smoke" in install
    # The bare install runs the sidecar with these flags; the README's pip path shows the same.
    bare = (ROOT / "tests" / "packaging" / "test_bare_install.py").read_text(encoding="utf-8")
    for flag in ('"run", "--target"', '"--tap.listen-address"'):
        assert flag in bare, flag
    assert re.search(r"specdecode-exporter run --target \S+ --tap.listen-address", install)
    # The smoke runs the image as Kubernetes does; the README runs it with the same restrictions.
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
