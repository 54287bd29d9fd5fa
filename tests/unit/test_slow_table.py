"""tests/slow.py, the table of slow tests that `make test` starts first and `make test-fast` leaves out: every entry
names tests that exist, and docs/tests.md shows the same table."""

from __future__ import annotations

import re
from pathlib import Path

from tests import slow

ROOT = Path(__file__).resolve().parents[2]


def test_every_entry_names_tests_that_exist() -> None:
    for entry in slow.SLOW:
        path, _, name = entry.where.partition("::")
        assert (ROOT / path).exists(), entry.where
        if name:
            function = name.split("[", 1)[0]
            assert re.search(rf"^def {function}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), entry.where
        assert entry.seconds > 0 and entry.why, entry


def test_an_entry_names_its_tests_and_the_most_specific_wins() -> None:
    page = f"{slow.PROMTOOL}[page.test.yaml]"
    assert slow.unit(page) == page and slow.seconds(page) > 0
    assert slow.unit(f"{slow.PROMTOOL}[health.test.yaml]") == "tests/rules/test_rules.py"  # not slow: its file
    assert slow.unit("tests/vllm/test_real_vllm.py::test_ngram_counters_under_traffic") == "tests/vllm/"
    assert slow.unit("tests/e2e/test_alert_chain.py::test_page_fires_and_resolves") == "tests/e2e/test_alert_chain.py"
    assert slow.find("tests/e2e/test_alert_chain.py_other.py::test_x") is None


def test_docs_tests_md_shows_the_table() -> None:
    text = (ROOT / "docs" / "tests.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \| (.+) \|$", text, re.M)
    assert rows == [(entry.where, str(entry.seconds), entry.why) for entry in slow.SLOW]
