"""go_float writes what prometheus_client's encoders write for a sample value, byte for byte: the page's lines
(sidecar/page.py) take their values from it while the encoders write the reference."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from specdecode_exporter.core.metrics import go_float

EDGES = (0.0, -0.0, 1.0, -1.0, 0.5, 1e6, 999999.0, 1234567.0, 1e16, 1e22, -1e22, 1.5e-7, 5e-324,
         1.7976931348623157e308, math.inf, -math.inf, math.nan, 123456.789, 1e15 + 0.5, 0.1 + 0.2)


def test_edges_are_written_as_prometheus_client_writes_them() -> None:
    for value in EDGES:
        assert go_float(value) == floatToGoString(value), value  # type: ignore[no-untyped-call]
    assert go_float(3) == "3.0" == floatToGoString(3)  # type: ignore[no-untyped-call]


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_is_written_as_prometheus_client_writes_it(value: float) -> None:
    assert go_float(value) == floatToGoString(value)  # type: ignore[no-untyped-call]
