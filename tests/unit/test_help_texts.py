"""Every family's HELP is one sentence of at most 120 characters (tests.helpers.help_text_problems says what one
sentence means); the detail lives in docs/metrics.md, and a windowed metric's HELP says where its figure comes from.
The page of the running process is checked too (tests/integration/test_metrics_page.py)."""

from __future__ import annotations

from pathlib import Path

from specdecode_exporter.core.contract import metrics as m
from tests.helpers import help_text_problems

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_the_rule_catches_what_it_names() -> None:
    assert help_text_problems("Drafted tokens, reset-safe across vLLM restarts.") == []
    assert help_text_problems("Leviathan's i.i.d. per-token acceptance probability, not α.") == []
    assert len(help_text_problems("Drafted tokens; reset-safe.")) == 1
    assert len(help_text_problems("α over the window. Absent without drafts.")) == 1
    assert len(help_text_problems("Drafted tokens")) == 1
    assert len(help_text_problems("x" * 120 + ".")) == 1


def test_every_help_in_the_contract_is_one_sentence_of_at_most_120_characters() -> None:
    problems = {spec.exposed_name: help_text_problems(spec.help) for spec in m.CONTRACT}
    assert {name: found for name, found in problems.items() if found} == {}


def test_every_windowed_metric_says_it_is_computed_from_the_sidecars_own_collections() -> None:
    windowed = [spec for spec in m.COLLECTED if "window" in spec.labels and spec is not m.VERDICT]
    assert len(windowed) >= 20
    for spec in (*windowed, m.INTERVAL_ACCEPTANCE):
        assert spec.help.endswith(m.WINDOWED_HELP), spec.name
    assert "own collections" in m.WINDOWED_HELP and "not at scrape time" in m.WINDOWED_NOTE


def test_the_reference_carries_every_detail_and_the_windowed_note() -> None:
    """What no longer fits a HELP is in docs/metrics.md, beside the HELP the page shows."""
    reference = METRICS_DOC.read_text(encoding="utf-8")
    assert m.WINDOWED_NOTE in reference
    details = [spec for spec in m.CONTRACT if spec.detail]
    assert len(details) >= 30
    for spec in m.CONTRACT:
        row = next(line for line in reference.splitlines() if line.startswith(f"| `{spec.exposed_name}` |"))
        assert spec.help.replace("|", "\\|") in row and spec.detail.replace("|", "\\|") in row, spec.name
