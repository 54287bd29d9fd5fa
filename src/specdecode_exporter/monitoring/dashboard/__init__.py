"""The Grafana dashboard, from the monitoring config, with Grafana's own Python SDK (``grafana-foundation-sdk``,
the build for Grafana 11.6: every panel, option and field config is a typed model from Grafana's schema).

Every query comes from specdecode_exporter.monitoring.promql, the same module the recording rules use; pooling is by the
config's alert level, so at window 5m the headline α equals the rule ``model:specdecode_acceptance_ratio:rate5m``.

The package, one room per concern: ``context`` (what every panel reads: the config and the selectors built from it),
``panels`` (the builders the rows share), ``rows/`` (one module per row of the dashboard: its title and its panels,
each panel one function of the context), ``rows.ROWS`` (the rows top to bottom) and ``assembly`` (the header, the
variables, the rows in order). A new panel is a function in its row's module and its name in that module's PANELS;
a new row is a module in rows/ and its place in rows.ROWS.
"""

from __future__ import annotations

from specdecode_exporter.monitoring.dashboard.assembly import build, render

__all__ = ["build", "render"]
