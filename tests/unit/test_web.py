"""Accept-Encoding as the /metrics page reads it (the page itself: tests/integration/test_metrics_page.py)."""

from __future__ import annotations

import pytest

from specdecode_exporter.sidecar.metrics_page import accepts_gzip


@pytest.mark.parametrize(("header", "expected"), [
    ("gzip", True),
    ("gzip, deflate, br", True),  # what Prometheus and most clients send
    ("deflate, GZIP;q=0.5", True),
    ("*", True),
    ("gzip;q=0", False),
    ("gzip; q=0.0, identity", False),
    ("identity", False),
    ("", False),
    ("gzip;q=oops", False),
    ("*;q=0.5, gzip;q=0", False),  # gzip's own entry decides, wherever it stands
    ("gzip;q=0.5, *;q=0", True),
    ("br, *;q=0", False),
])
def test_accepts_gzip(header: str, expected: bool) -> None:
    assert accepts_gzip(header) is expected
