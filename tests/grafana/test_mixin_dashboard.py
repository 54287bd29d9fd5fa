"""The dashboard's one source is the jsonnet mixin (mixin/dashboards/, a file per row, over the panel kinds and PromQL
helpers in mixin/lib/), evaluated here by the real jsonnet (the `jsonnet` package's C++ binding). It renders the
shipped grafana/dashboards/specdecode.json exactly; an override of a _config value changes what that value stands for
and nothing else; an override in jsonnet renders what the build renders from a monitoring config with the same
change; and the files read as a jsonnet user expects (short lines, named formats)."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _jsonnet as jsonnet  # the `jsonnet` package's Python binding (jsonnet.org/ref/bindings.html)
import pytest

from specdecode_exporter.core.contract import monitoring_config
from specdecode_exporter.core.contract.monitoring_config import MonitoringConfig
from specdecode_exporter.monitoring import build, mixin, mixin_dashboard
from tests.grafana.grafana_dashboard_helpers import DASHBOARD, ROOT

MIXIN = ROOT / "mixin"


def evaluate(snippet: str) -> Any:
    return json.loads(jsonnet.evaluate_snippet("snippet", snippet, jpathdir=[str(MIXIN)]))


@functools.cache
def _rendered(overrides: str) -> str:
    return json.dumps(evaluate(f'((import "mixin.libsonnet") + {overrides}).grafanaDashboards["specdecode.json"]'))


def rendered(overrides: str = "{}") -> dict[str, Any]:
    """The mixin's dashboard, with ``overrides`` merged over the mixin as a jsonnet user merges them (a jsonnet
    evaluation of it takes seconds: each is made once)."""
    board: dict[str, Any] = json.loads(_rendered(overrides))
    return board


def with_value(cfg: MonitoringConfig, path: str, value: Any) -> MonitoringConfig:
    return mixin.with_value(cfg, path, value)


# ------------------------------------------------------------------------------------- the shipped dashboard


def test_the_mixin_renders_exactly_the_shipped_dashboard() -> None:
    assert rendered() == json.loads(DASHBOARD.read_text(encoding="utf-8"))
    # The build's text is the same evaluation, written as the committed file is.
    assert mixin_dashboard.render(monitoring_config.load(), MIXIN) == DASHBOARD.read_text(encoding="utf-8")


def test_the_dashboards_field_renders_beside_the_config_alone() -> None:
    """As kubernetes-mixin's parts: dashboards/dashboards.libsonnet with config.libsonnet is the whole dashboard,
    and its field is hidden and merged (+::), as kube-prometheus expects."""
    alone = evaluate(f'((import "{mixin.CONFIG}") + (import "{mixin_dashboard.FIELD}")).grafanaDashboards')
    assert alone == {mixin_dashboard.DASHBOARD_FILE: rendered()}
    assert evaluate(f'std.objectFields(import "{mixin_dashboard.FIELD}")') == []
    mine = '{ grafanaDashboards+:: { "mine.json": { title: "mine" } } }'
    assert evaluate(f'std.objectFields(((import "mixin.libsonnet") + {mine}).grafanaDashboards)') == [
        "mine.json", "specdecode.json"]


def test_the_config_holds_every_value_the_dashboard_reads_as_the_monitoring_config_sets_it() -> None:
    config = evaluate('(import "config.libsonnet")._config')
    expected = mixin_dashboard.config(monitoring_config.shipped())
    assert {key: config.get(key) for key in expected} == expected


def test_the_shape_is_the_monitoring_configs() -> None:
    shape = evaluate(f'import "{mixin_dashboard.SHAPE}"')
    assert shape == json.loads(json.dumps(mixin_dashboard.shape(monitoring_config.shipped())))
    assert shape["records"]["alpha"] % {"window": "5m"} == "model:specdecode_acceptance_ratio:rate5m"


# ------------------------------------------------------------------------------------------ _config overrides


def _differences(base: Any, other: Any, path: str = "") -> Iterator[str]:
    if isinstance(base, dict) and isinstance(other, dict):
        for key in sorted(set(base) | set(other)):
            yield from _differences(base.get(key), other.get(key), f"{path}.{key}" if path else key)
    elif isinstance(base, list) and isinstance(other, list) and len(base) == len(other):
        for i, (a, b) in enumerate(zip(base, other, strict=True)):
            yield from _differences(a, b, f"{path}[{i}]")
    elif base != other:
        yield path


def changes(base: dict[str, Any], other: dict[str, Any]) -> dict[str, set[str]]:
    """What differs, by the title of the panel in ``base`` ("<dashboard>" for the rest): a query by its index and
    field, anything else by its path up to the first list."""
    found: dict[str, set[str]] = {}
    for path in _differences(base, other):
        panel = re.match(r"panels\[(\d+)\]\.(.*)", path)
        where, rest = (base["panels"][int(panel[1])]["title"], panel[2]) if panel else ("<dashboard>", path)
        query = re.match(r"targets\[\d+\]\.\w+", rest)
        found.setdefault(where, set()).add(query[0] if query else re.sub(r"\[\d+\].*", "", rest))
    return found


THRESHOLDS = "fieldConfig.defaults.thresholds.steps"
# For each override, every place it should change: a threshold moves the panels' colours and bands, the texts that
# state it and the queries that compare with it; the selector only the rules (the dashboard reads their records,
# and the sidecars' own series under its variables); the page's short window the record of the alerts' row.
EXPECTED: dict[str, dict[str, set[str]]] = {
    "{ pageAcceptanceRatio: 0.35 }": {
        "Acceptance rate α": {"description", THRESHOLDS},
        "Verdict": {"description", "targets[0].expr"},
        "α over time vs break-even": {"description", THRESHOLDS},
        "α by pod and engine (sidecar gauge)": {THRESHOLDS},
        "Per-interval α: P10 / P50 / P90": {"description", THRESHOLDS},
        "Intervals with α < 50%": {"title", "description", "targets[0].expr"},
        "α by temperature band and by workload": {THRESHOLDS},
        "Requests with α ≤ 0.5": {"title", "description", "targets[0].expr"},
        "Acceptance by draft position (now)": {THRESHOLDS},
        "α as the alerts see it (recording rules)": {"description", THRESHOLDS},
    },
    "{ metricSelector: 'cluster=\"prod\"' }": {},
    "{ shortWindow: '7m' }": {
        "α as the alerts see it (recording rules)": {"description", "targets[0].expr", "targets[0].legendFormat"},
    },
    "{ hurtingBelow: 0.9 }": {
        "Expected speedup": {THRESHOLDS},
        "Verdict": {"description", "targets[0].expr"},
        "Observed vs modelled speedup": {THRESHOLDS},
        "Expected speedup over time": {"description", THRESHOLDS},
        "Measured speedup of routed classes (randomized canary)": {THRESHOLDS},
        "Expected speedup by k'": {THRESHOLDS},
    },
    "{ driftDrop: 0.1 }": {
        "α as the alerts see it (recording rules)": {"description", "targets[3].expr", "targets[3].legendFormat"},
    },
    "{ runbookBaseURL: 'https://runbooks.example.com/' }": {"<dashboard>": {"links"}},
    "{ dashboardUID: 'mine', dashboardRefresh: '1m' }": {"<dashboard>": {"uid", "refresh"}},
}


@pytest.mark.parametrize("override", EXPECTED)
def test_an_override_changes_what_it_should_and_nothing_else(override: str) -> None:
    assert changes(rendered(), rendered(f"{{ _config+:: {override} }}")) == EXPECTED[override]


def test_an_override_reaches_the_queries_with_its_value() -> None:
    panels = {p["title"]: p for p in rendered("{ _config+:: { pageAcceptanceRatio: 0.35 } }")["panels"]}
    assert 'le="0.35"' in panels["Intervals with α < 35%"]["targets"][0]["expr"]
    assert 'le="0.35"' in panels["Requests with α ≤ 0.35"]["targets"][0]["expr"]
    assert ">= bool 0.35)" in panels["Verdict"]["targets"][0]["expr"]
    panels = {p["title"]: p for p in rendered("{ _config+:: { shortWindow: '7m' } }")["panels"]}
    alerts = panels["α as the alerts see it (recording rules)"]["targets"][0]
    assert alerts["expr"].startswith("model:specdecode_acceptance_ratio:rate7m{")
    assert alerts["legendFormat"].startswith("7m ")


# A value of each kind different from the shipped one.
OVERRIDES: dict[str, Any] = {
    "runbookBaseURL": "https://runbooks.example.com/specdecode/", "shortWindow": "7m", "baselineOffset": "2h",
    "pageAcceptanceRatio": 0.35, "goodAcceptanceRatio": 0.7, "driftDrop": 0.1, "hurtingBelow": 0.9,
    "payingOffFrom": 1.25, "maxPreemptionsPerRequestIncrease": 0.2, "minThroughputRatio": 0.8,
    "minWaitingRequests": 2.5, "speculationShareBelow": 0.05, "dashboardUID": "mine", "dashboardTitle": "Mine",
    "dashboardRefresh": "1m", "dashboardTimeFrom": "now-6h",
}


def test_every_key_the_dashboard_reads_has_an_override_here() -> None:
    assert set(OVERRIDES) == set(mixin_dashboard.CONFIG_KEYS)


@pytest.mark.parametrize("key", mixin_dashboard.CONFIG_KEYS)
def test_the_build_gives_the_dashboard_each_value_under_its_config_key(key: str) -> None:
    """A change of a monitoring config value is the change of its _config key, as a jsonnet user makes it."""
    cfg = with_value(monitoring_config.shipped(), mixin_dashboard.CONFIG_KEYS[key], OVERRIDES[key])
    overridden = evaluate(f'((import "config.libsonnet") + {{ _config+:: {{ {key}: {json.dumps(OVERRIDES[key])} }} }})'
                          "._config")
    assert mixin_dashboard.config(cfg) == {name: overridden[name] for name in mixin_dashboard.CONFIG_KEYS}


def test_overrides_in_jsonnet_are_the_same_changes_in_the_monitoring_config() -> None:
    """Every key at once: a user's monitoring config and a jsonnet user's overrides give the same dashboard."""
    cfg = monitoring_config.shipped()
    for key, value in OVERRIDES.items():
        cfg = with_value(cfg, mixin_dashboard.CONFIG_KEYS[key], value)
    overridden = rendered(f"{{ _config+:: {json.dumps(OVERRIDES)} }}")
    assert overridden == json.loads(mixin_dashboard.render(cfg, MIXIN))
    assert {name for name, found in changes(rendered(), overridden).items() if found} >= {
        "<dashboard>", "Acceptance rate α", "Verdict", "α as the alerts see it (recording rules)"}


# ------------------------------------------------------------------------------------------ readable jsonnet


def test_the_dashboards_jsonnet_reads_as_jsonnet_users_expect() -> None:
    """Lines of at most 160 characters and named formats (%(name)s), never positional ones (%s)."""
    for name in (*mixin_dashboard.SOURCES, mixin_dashboard.SHAPE):
        for number, line in enumerate((MIXIN / name).read_text(encoding="utf-8").splitlines(), start=1):
            assert len(line) <= 160, f"{name}:{number} is {len(line)} characters"
            assert not re.search(r"%[-+ 0#]*[0-9.]*[sdfgex]", line.replace("%%", "")), f"{name}:{number}: {line}"
    assert len((MIXIN / mixin_dashboard.DASHBOARD).read_text().splitlines()) < 200


def test_the_hand_written_files_are_those_on_disk() -> None:
    """mixin_dashboard.SOURCES (what a build into another --root copies) names every hand-written file."""
    on_disk = {str(p.relative_to(MIXIN)) for d in ("dashboards", "lib") for p in (MIXIN / d).rglob("*.libsonnet")}
    generated = {mixin_dashboard.SHAPE, *mixin.FILES}
    assert on_disk - generated == set(mixin_dashboard.SOURCES)


# --------------------------------------------------------------------------------------------------- the build


def test_a_build_elsewhere_writes_a_whole_mixin_with_its_dashboard(tmp_path: Path) -> None:
    """`build --config mine.yaml --root out/` from a checkout: out/mixin is a mixin jsonnet evaluates, whose
    dashboard is out/grafana/dashboards/specdecode.json."""
    user = tmp_path / "mine.yaml"
    user.write_text("thresholds: {page_acceptance_ratio: 0.4}\n")
    out = tmp_path / "out"
    assert build.main(["--config", str(user), "--root", str(out), "--mixin", str(MIXIN)]) == 0
    board = json.loads((out / "grafana/dashboards/specdecode.json").read_text())
    from_mixin = json.loads(jsonnet.evaluate_snippet(
        "s", '(import "mixin.libsonnet").grafanaDashboards["specdecode.json"]', jpathdir=[str(out / "mixin")]))
    assert board == from_mixin != rendered()
    alpha = next(p for p in board["panels"] if p["title"] == "Acceptance rate α")
    assert alpha["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.4


def test_a_mixin_that_does_not_evaluate_is_one_line_naming_where(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "mixin"
    shutil.copytree(MIXIN, broken)
    row = broken / "dashboards/rows/token_flow.libsonnet"
    row.write_text(row.read_text(encoding="utf-8").replace("ctx.rate('drafts')", "ctx.rate('no_such_record')"))
    assert build.main(["--root", str(tmp_path / "out"), "--mixin", str(broken)]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1, error
    assert "does not evaluate" in error and "no_such_record" in error


def test_a_build_without_the_mixins_sources_says_so_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "specdecode_exporter.monitoring.build", "--root", str(tmp_path),
                           "--mixin", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--mixin" in proc.stderr and "dashboards/specdecode.libsonnet" in proc.stderr
