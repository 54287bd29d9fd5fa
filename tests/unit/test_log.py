"""The log line's format: one line per event, whatever a field carries."""

from __future__ import annotations

import logging

import pytest

from specdecode_exporter.core.process.log import EventFormatter


def _line(**fields: object) -> str:
    record = logging.LogRecord("specdecode_exporter", logging.WARNING, __file__, 1, "basic auth failed", None, None)
    record.fields = fields
    return EventFormatter(json_format=False).format(record)


@pytest.mark.parametrize(("value", "written"), [
    ("plain", "user=plain"),
    ('a "quoted" \\ name', 'user="a \\"quoted\\" \\\\ name"'),
    ("two\nlines", 'user="two\\nlines"'),
    ("carriage\rreturn", 'user="carriage\\x0dreturn"'),
    ("\x1b[31mred\x1b[0m", 'user="\\x1b[31mred\\x1b[0m"'),
    ("tab\there\x7f", 'user="tab\\x09here\\x7f"'),
])
def test_a_field_cannot_break_or_colour_the_line(value: str, written: str) -> None:
    line = _line(user=value)
    assert line.endswith(" " + written)
    assert line.isprintable()  # no CR, escape sequence or other control character reaches the terminal or file
