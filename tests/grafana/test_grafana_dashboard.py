"""Static checks of the generated Grafana dashboard: the jsonnet mixin's render and the committed JSON agree, the JSON
round-trips through Grafana's own SDK models (its schema, as Python types), the layout is sane, every panel is
labelled and every query is PromQL that promtool accepts. No Grafana server is available here, so nothing is
rendered: the layout is checked in code instead."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.contract.verdict import Verdict
from specdecode_exporter.monitoring import build, mixin_dashboard
from tests.grafana.grafana_dashboard_helpers import (
    DASHBOARD,
    PROVISIONING,
    ROOT,
    all_selection,
    annotation_queries,
    content_panels,
    iter_panels,
    load_dashboard,
    panel_queries,
    referenced_variables,
    substitute,
    variable_names,
    variable_queries,
)

IN_CI = bool(os.environ.get("CI"))
GRID_WIDTH = 24
REQUIRED_VARIABLES = {"datasource", "namespace", "job", "model_name", "engine", "pod", "instance", "window"}
# Grafana unit ids used by the dashboard (grafana-data valueFormats) plus its custom-unit prefixes.
KNOWN_UNITS = {"percentunit", "short", "none", "s", "ops", "reqps"}
CUSTOM_UNIT_PREFIXES = ("suffix:", "prefix:", "si:", "count:")


def need_sdk() -> None:
    """The round trip needs grafana-foundation-sdk (a test extra): skip without it, but fail in CI."""
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("grafana-foundation-sdk is not installed (pip install the project's test extras)")
        pytest.skip("grafana-foundation-sdk not installed")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


# --- generator and schema ---------------------------------------------------------------------------------


def test_committed_json_matches_generator() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == mixin_dashboard.render(monitoring_config.load(), ROOT / "mixin"), (
        "grafana/dashboards/specdecode.json is stale: run make generate"
    )


def test_build_check_mode_finds_a_stale_dashboard(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "grafana" / "dashboards").mkdir(parents=True)
    (root / "grafana" / "dashboards" / "specdecode.json").write_text("{}\n")
    src = build.sources(None, root=root, mixin_dir=ROOT / "mixin")
    assert build.build(src, check=True, only=["grafana/dashboards/specdecode.json"]) == 1
    assert build.build(src, check=False, only=["grafana/dashboards/specdecode.json"]) == 1
    assert build.build(src, check=True, only=["grafana/dashboards/specdecode.json"]) == 0


def test_round_trips_through_sdk_models(dashboard: dict[str, Any]) -> None:
    """Decoding into the SDK's typed models (generated from Grafana 11's schema) and encoding again gives the
    same JSON: every key is a known field of the dashboard, panel, options, field config or query model
    (unknown keys are dropped by from_json and would show up as a difference)."""
    need_sdk()
    import json

    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()
    model = Dashboard.from_json(dashboard)
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert again == dashboard
    # Panel options and queries decoded into the plugin's own types, not left as plain dicts.
    for panel in model.panels or []:
        if getattr(panel, "type_val", None) == "row":
            continue
        assert not isinstance(panel.options, dict) or not panel.options, panel.title
        for target in panel.targets or []:
            assert type(target).__module__.endswith("models.prometheus"), (panel.title, type(target))


def test_round_trip_catches_unknown_keys(dashboard: dict[str, Any]) -> None:
    """The round trip has teeth: a misspelt option does not survive it."""
    need_sdk()
    import copy
    import json

    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()
    broken = copy.deepcopy(dashboard)
    panel = next(p for p in broken["panels"] if p["type"] == "stat")
    panel["options"]["colourMode"] = "background"
    panel["fieldConfig"]["defaults"]["noValu"] = "x"
    again = json.loads(json.dumps(Dashboard.from_json(broken), cls=JSONEncoder))
    assert again != broken


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "specdecode-overview"
    assert len(dashboard["uid"]) <= 40
    assert dashboard["title"]
    assert {"specdecode", "vllm"} <= set(dashboard["tags"])
    assert dashboard["schemaVersion"] >= 36  # Grafana 10.0 and later
    links = dashboard["links"]
    assert any(link["url"].endswith("alerts/runbook.md") and "unbook" in link["title"] for link in links)
    assert dashboard["time"]["from"].startswith("now-")


# --- layout ---------------------------------------------------------------------------------------------


def test_grid_positions_fit_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    occupied: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0, panel["title"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= GRID_WIDTH, panel["title"]
        if panel["type"] == "row":
            assert (pos["x"], pos["w"], pos["h"]) == (0, GRID_WIDTH, 1), panel["title"]
            assert not panel.get("collapsed") and panel.get("panels") == [], "expanded rows hold no panels"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in occupied, f"{panel['title']!r} overlaps {occupied[(x, y)]!r} at {(x, y)}"
                occupied[(x, y)] = panel["title"]


def test_panels_in_reading_order_rows_full_width(dashboard: dict[str, Any]) -> None:
    """Panels are listed top to bottom, left to right (Grafana's order for keyboard and mobile), and every
    band of panels between two rows fills the 24 columns without holes."""
    keys = [(p["gridPos"]["y"], p["gridPos"]["x"]) for p in dashboard["panels"]]
    assert keys == sorted(keys)
    assert dashboard["panels"][0]["type"] == "row"
    band: list[dict[str, Any]] = []
    for panel in [*dashboard["panels"], {"type": "row", "title": "<end>"}]:
        if panel["type"] == "row":
            if band:
                cells = sum(p["gridPos"]["w"] * p["gridPos"]["h"] for p in band)
                top = min(p["gridPos"]["y"] for p in band)
                bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in band)
                assert cells == GRID_WIDTH * (bottom - top), f"holes in the band before {panel['title']!r}"
            band = []
        else:
            band.append(panel)


def test_ids_unique(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in iter_panels(dashboard)]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids))


# --- every panel labelled, united, guarded ----------------------------------------------------------------


def test_every_panel_has_title_description_unit_and_no_value(dashboard: dict[str, Any]) -> None:
    for panel in content_panels(dashboard):
        title = panel.get("title", "")
        assert title.strip(), panel["id"]
        assert len(panel.get("description", "")) >= 40, title
        defaults = panel["fieldConfig"]["defaults"]
        unit = defaults.get("unit", "")
        assert unit in KNOWN_UNITS or unit.startswith(CUSTOM_UNIT_PREFIXES), (title, unit)
        assert defaults.get("noValue"), f"{title}: no noValue text (Grafana would show 'No data')"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title


def test_titles_unique(dashboard: dict[str, Any]) -> None:
    titles = [p["title"] for p in content_panels(dashboard)]
    assert len(titles) == len(set(titles))


def test_every_query_well_formed(dashboard: dict[str, Any]) -> None:
    for panel in content_panels(dashboard):
        targets = panel.get("targets") or []
        assert targets, panel["title"]
        refs = [t["refId"] for t in targets]
        assert all(refs) and len(refs) == len(set(refs)), panel["title"]
        for target in targets:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


MATCHING = re.compile(r"^(?:(?:on|ignoring)\s*\([^)]*\)\s*)?(?:group_(?:left|right)\s*(?:\([^)]*\))?\s*)?")


POSITIVE = re.compile(r"[1-9][0-9]*(\.[0-9]+)?")


def divisors(expr: str) -> list[str]:
    """The parenthesised operand right of every `/` in a PromQL expression (a plain number as it is)."""
    out = []
    for i, ch in enumerate(expr):
        if ch != "/":
            continue
        rest = MATCHING.sub("", expr[i + 1 :].lstrip())
        if number := POSITIVE.match(rest):
            out.append(number.group())
            continue
        assert rest.startswith("("), f"divisor not parenthesised after {expr[: i + 1]!r}"
        depth = 0
        for j, c in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth == 0:
                out.append(rest[1:j].strip())
                break
    return out


def test_divisors_helper() -> None:
    assert divisors("a / (sum(b) > 0)") == ["sum(b) > 0"]
    assert divisors("a / on (x) group_left () (b > 0)") == ["b > 0"]
    assert divisors("(1 + a / (b > 0))\n/\n(1 + c)") == ["b > 0", "1 + c"]


def test_ratios_are_guarded(dashboard: dict[str, Any]) -> None:
    """Every divisor is `(… > 0)` (or `(1 + …)`, or a positive number: the short stage's step, never 0), so an
    idle model gives no result, not NaN or +Inf; every quantile is `and on (…) (count > 0)`."""
    for q in panel_queries(dashboard):
        for d in divisors(q.expr):
            assert d.endswith("> 0") or d.startswith("1 +") or POSITIVE.fullmatch(d), (q.panel_title, d)
        if "histogram_quantile(" in q.expr:
            assert "and on (" in q.expr and "_count" in q.expr, (q.panel_title, "unguarded quantile")


# A range over a raw series reads every pod's samples over the dashboard's whole range (at 7 days, past
# Prometheus' default query.max-samples on a fleet). The two left: vLLM's inter-token latency (the sidecar does not
# export it; vLLM's own series, as any vLLM dashboard reads them) and an instant stat (one evaluation, no range).
RAW_RANGE = re.compile(r"(?<![\w:])(specdecode_\w*|vllm:[\w:]*)(\{[^}]*\})?\[")  # a record has a colon
RAW_RANGE_ALLOWED = {("Inter-token latency (vLLM) p50 / p99", "vllm:inter_token_latency_seconds_bucket"),
                     ("Inter-token latency (vLLM) p50 / p99", "vllm:inter_token_latency_seconds_count"),
                     ("Prometheus → sidecar scrape", "specdecode_up")}


def test_no_query_ranges_over_the_pods_raw_series(dashboard: dict[str, Any]) -> None:
    """Issue 35: every time series reads the rules' recorded series or the sidecar's gauges, cheap at any
    $__range; a range over a raw series only where said (RAW_RANGE_ALLOWED), and the stat among them instant."""
    found = {(q.panel_title, match.group(1)) for q in panel_queries(dashboard) for match in RAW_RANGE.finditer(q.expr)}
    assert found == RAW_RANGE_ALLOWED


def test_ratios_aggregate_counters_not_ratio_gauges(dashboard: dict[str, Any]) -> None:
    """Pooled α is sum(rate(accepted)) / sum(rate(drafted)); never an average of per-pod ratio gauges."""
    for q in panel_queries(dashboard):
        for fn in ("avg", "sum", "avg by", "sum by"):
            assert f"{fn} (specdecode_acceptance_ratio" not in q.expr, q.expr
            assert f"{fn}(specdecode_acceptance_ratio" not in q.expr, q.expr


def test_alpha_stat_thresholds(dashboard: dict[str, Any]) -> None:
    panel = next(p for p in content_panels(dashboard) if p["title"] == "Acceptance rate α")
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["unit"] == "percentunit"
    steps = [(s["value"], s["color"]) for s in defaults["thresholds"]["steps"]]
    assert steps == [(None, "red"), (0.5, "yellow"), (0.6, "green")]


def test_verdict_maps_every_outcome(dashboard: dict[str, Any]) -> None:
    """The verdict query evaluates to core.contract.verdict's codes; every code (and no data) has its word."""
    panel = next(p for p in content_panels(dashboard) if p["title"] == "Verdict")
    texts = {}
    for mapping in panel["fieldConfig"]["defaults"]["mappings"]:
        if mapping["type"] == "value":
            texts.update({code: result["text"] for code, result in mapping["options"].items()})
        if mapping["type"] == "special":
            texts["no data"] = mapping["options"]["result"]["text"]
    # No sample is "No traffic": the sidecar-only verdicts (not speculating, no data) have no PromQL form.
    expected = {str(v.code): v.value.capitalize() for v in Verdict if v.code is not None}
    assert texts == expected | {"no data": Verdict.NO_TRAFFIC.value.capitalize()}


# --- variables ------------------------------------------------------------------------------------------


def test_variables(dashboard: dict[str, Any]) -> None:
    names = variable_names(dashboard)
    assert names >= REQUIRED_VARIABLES
    window = next(v for v in dashboard["templating"]["list"] if v["name"] == "window")
    assert window["query"] == "1m,5m,15m,1h" and window["current"]["value"] == "5m"
    for name, query in variable_queries(dashboard).items():
        assert query.startswith("label_values(") and query.endswith(f", {name})"), (name, query)


def test_every_referenced_variable_is_defined(dashboard: dict[str, Any]) -> None:
    known = variable_names(dashboard) | {"__rate_interval", "__interval", "__range"}
    exprs = [q.expr for q in panel_queries(dashboard)] + annotation_queries(dashboard)
    exprs += list(variable_queries(dashboard).values())
    for expr in exprs:
        assert referenced_variables(expr) <= known, expr


# --- PromQL syntax, without a Prometheus server -----------------------------------------------------------


def test_every_query_parses_with_promtool(tmp_path: Path, dashboard: dict[str, Any]) -> None:
    """Each query, with variables substituted, as a recording rule: `promtool check rules` parses it."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if IN_CI:
            pytest.fail("promtool missing (scripts/install-tools.sh)")
        pytest.skip("promtool missing (scripts/install-tools.sh)")
    values = all_selection(dashboard, "5m")
    exprs = [substitute(q.expr, values) for q in panel_queries(dashboard)]
    exprs += [substitute(e, values) for e in annotation_queries(dashboard)]
    for query in variable_queries(dashboard).values():
        inner = query[len("label_values(") : query.rindex(",")]
        exprs.append(substitute(inner, values))
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard:query:{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# --- provisioning -----------------------------------------------------------------------------------------


def test_provisioning_files() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "specdecode-prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http") and source["isDefault"]
    dash = yaml.safe_load((PROVISIONING / "dashboards" / "specdecode.yaml").read_text())
    assert dash["apiVersion"] == 1
    (provider,) = dash["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    readme = (PROVISIONING.parent / "README.md").read_text(encoding="utf-8")
    assert provider["options"]["path"] in readme, "the README's docker command mounts the provider's path"
