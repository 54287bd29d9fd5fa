"""The per-position family as both engines that export it read it (engines.base.PositionLines): positions 0…k−1
in order, the first line of a duplicated position, and a clear reason, never a guessed curve, for a label that
is not a position or a gap in the positions."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from specdecode_exporter.pipeline.engines import ALL_PREFIXES, FetchTiming
from specdecode_exporter.pipeline.engines.base import Decoder, PositionLines
from specdecode_exporter.pipeline.engines.llamacpp import LlamaCppDecoder
from specdecode_exporter.pipeline.engines.vllm_v1 import V1Decoder
from specdecode_exporter.pipeline.parse import Sample, select
from tests.helpers import fixture_text

TIMING = FetchTiming(0.0, 0.01)
FAMILY = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def position(label: str | None) -> Sample:
    return Sample(FAMILY, (("position", label),) if label is not None else (), 1.0)


def test_lines_come_back_in_position_order_and_the_first_of_a_duplicate_counts() -> None:
    lines = PositionLines()
    assert not lines and lines.slots() == ()
    for index, label in ((10, "2"), (11, "0"), (12, "1"), (13, "0")):
        assert lines.add(index, position(label)) is None
    assert lines and lines.slots() == (11, 12, 10)


@pytest.mark.parametrize("label", [None, "", "x", "-1", "1.0"])
def test_a_label_that_is_not_a_position_is_named(label: str | None) -> None:
    assert PositionLines().add(0, position(label)) == f"{FAMILY} has position label {label!r}"


def test_a_gap_is_a_reason_not_a_shorter_curve() -> None:
    lines = PositionLines()
    for index, label in enumerate(("0", "2")):
        lines.add(index, position(label))
    assert lines.slots() == "position series have gaps ([0, 2])"


@pytest.mark.parametrize(("fixture", "decoder"), [("vllm_v1_spec.prom", V1Decoder),
                                                   ("llamacpp_spec.prom", lambda: LlamaCppDecoder("m"))])
def test_both_engines_leave_a_series_with_a_bad_position_undecoded_and_say_why(fixture: str,
        decoder: Callable[[], Decoder]) -> None:
    good = fixture_text(fixture)
    assert decoder().decode(select(good, ALL_PREFIXES), TIMING).series
    bad = good.replace('position="1"}', 'position="one"}')
    result = decoder().decode(select(bad, ALL_PREFIXES), TIMING)
    assert result.series == []
    assert any("has position label 'one'" in warning for warning in result.warnings), result.warnings
