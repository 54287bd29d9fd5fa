"""Shared helpers for the Grafana dashboard tests: load the committed JSON, walk its panels and queries, and
substitute template variables the way Grafana would for an "All" selection."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "specdecode.json"
PROVISIONING = ROOT / "grafana" / "provisioning"

# Grafana's built-in interval variables and what the tests put in their place: short ranges, because the
# end-to-end test has only a minute or two of samples scraped every second.
BUILTIN_SUBSTITUTIONS: dict[str, str] = {
    "__rate_interval": "30s",
    "__interval": "15s",
    "__range": "1m",
}

_VAR = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)")


@dataclass(frozen=True)
class PanelQuery:
    panel_id: int
    panel_title: str
    ref_id: str
    expr: str
    instant: bool


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and the panels nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", []) or []


def content_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [p for p in iter_panels(dashboard) if p.get("type") != "row"]


def panel_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    out = []
    for panel in content_panels(dashboard):
        for target in panel.get("targets", []) or []:
            out.append(
                PanelQuery(
                    panel_id=int(panel["id"]),
                    panel_title=str(panel["title"]),
                    ref_id=str(target.get("refId", "")),
                    expr=str(target.get("expr", "")),
                    instant=bool(target.get("instant", False)),
                )
            )
    return out


def annotation_queries(dashboard: Mapping[str, Any]) -> list[str]:
    return [a["expr"] for a in dashboard.get("annotations", {}).get("list", []) if a.get("expr")]


def variable_queries(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """name → label_values(...) query of every query variable."""
    out = {}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var["query"]
            out[var["name"]] = q["query"] if isinstance(q, dict) else str(q)
    return out


def variable_names(dashboard: Mapping[str, Any]) -> set[str]:
    return {v["name"] for v in dashboard.get("templating", {}).get("list", [])}


def all_selection(dashboard: Mapping[str, Any], window: str) -> dict[str, str]:
    """Values for every template variable as if the user picked "All" (allValue) and the given window."""
    values = dict(BUILTIN_SUBSTITUTIONS)
    for var in dashboard.get("templating", {}).get("list", []):
        name = var["name"]
        if var.get("includeAll"):
            values[name] = var.get("allValue") or ".*"
    values["window"] = window
    return values


def referenced_variables(expr: str) -> set[str]:
    return {m.group(1) or m.group(2) for m in _VAR.finditer(expr)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return _VAR.sub(repl, expr)
