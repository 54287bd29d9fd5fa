"""FailureReason lives beside the metric contract: its values label specdecode_collect_errors_total."""

from __future__ import annotations

import re

from specdecode_exporter.core.contract.failure import FailureReason
from specdecode_exporter.core.contract.metrics import COLLECT_ERRORS


def test_the_help_text_names_every_reason_and_no_other() -> None:
    listed = re.fullmatch(r"Failed collections by reason: (.*)\.", COLLECT_ERRORS.help)
    assert listed is not None, COLLECT_ERRORS.help
    assert listed.group(1).split(", ") == [reason.value for reason in FailureReason]
    assert "reason" in COLLECT_ERRORS.labels


def test_the_old_import_still_works() -> None:
    from specdecode_exporter.pipeline import scrape

    assert scrape.FailureReason is FailureReason
    assert scrape.FailureReason("no_spec_metrics") is FailureReason.NO_SPEC_METRICS
