"""The dashboard's rows, top to bottom: one module each, holding its ROW (title and panels). A new row is a module
here and its place in ROWS."""

from __future__ import annotations

from specdecode_exporter.monitoring.dashboard.context import Row
from specdecode_exporter.monitoring.dashboard.rows import (
    acceptance_over_time,
    alerts,
    costs,
    distribution,
    health,
    latency,
    measured,
    paying_off,
    per_request,
    positions,
    routing,
    speculating,
    token_flow,
)

ROWS: tuple[Row, ...] = (
    paying_off.ROW,
    measured.ROW,
    acceptance_over_time.ROW,
    distribution.ROW,
    per_request.ROW,
    routing.ROW,
    positions.ROW,
    token_flow.ROW,
    latency.ROW,
    speculating.ROW,
    costs.ROW,
    alerts.ROW,
    health.ROW,
)
