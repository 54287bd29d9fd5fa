"""The monitoring config: a user's file merged key by key onto the shipped one, a profile on top, and every bad
value one line naming the user's file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.core.contract import monitoring_config


def load(tmp_path: Path, text: str) -> monitoring_config.MonitoringConfig:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return monitoring_config.load(path)


def test_a_users_file_changes_only_its_keys(tmp_path: Path) -> None:
    shipped = monitoring_config.shipped()
    mine = load(tmp_path, "thresholds: {page_acceptance_ratio: 0.4}\nwindows: {short: 90}\n")
    assert mine.thresholds.page_acceptance_ratio == 0.4 and mine.verdict.page_acceptance_ratio == 0.4
    assert mine.thresholds.drift_drop == shipped.thresholds.drift_drop
    assert mine.short_window == "1m30s"  # Prometheus' spelling of 90 seconds
    assert mine.long_window == shipped.long_window == "1h"
    assert mine.alerts == shipped.alerts


def test_the_profile_and_force_for() -> None:
    e2e = monitoring_config.load(profile="e2e")
    assert e2e.profile == "e2e" and e2e.short_window == "1m" and e2e.baseline_range == "5m"
    assert {a.for_ for _, a in e2e.alerts} == {"15s"}
    with pytest.raises(ConfigError, match=r"^profiles: no profile 'nope' \(have: e2e\)$"):
        monitoring_config.load(profile="nope")


@pytest.mark.parametrize(("text", "message"), [
    # unknown keys
    ("thresholds: {page_acceptance_ratoi: 0.4}\n",
     "thresholds.page_acceptance_ratoi: unknown key (did you mean 'page_acceptance_ratio'?)"),
    ("windos: {short: 5m}\n", "windos: unknown key (did you mean 'windows'?)"),
    ("alerts: {SpecDecodeTargetDown: {severity: warning, for: 5m, windw: short}}\n",
     "alerts.SpecDecodeTargetDown.windw: unknown key (did you mean 'window'?)"),
    # wrong types
    ("windows: {short: 5 minutes}\n", "windows.short: expected a duration like 5s, 1m or 500ms, got '5 minutes'"),
    ("alerts: {SpecDecodeTargetDown: {for: soon}}\n",
     "alerts.SpecDecodeTargetDown.for: expected a duration like 5s, 1m or 500ms, got 'soon'"),
    ("quantiles: 0.1\n", "quantiles: expected a list, got 0.1"),
    ("target_labels: [job, 'bad-label']\n", "target_labels[1]: 'bad-label' is not a label name"),
    ("levels: {Model: [model_name]}\n",
     "levels.Model: 'Model' is not a valid level name (lower case letters, digits, _)"),
    ("selectors: {metric: 3}\n", "selectors.metric: expected a string, got 3"),
    ("thresholds: zero\n", "thresholds: expected a mapping, got 'zero'"),
    ("alerts: {SpecDecodeTargetDown: {severity: page}}\n",
     "alerts.SpecDecodeTargetDown.severity: expected one of critical, warning, info, got 'page'"),
    # out of range
    ("thresholds: {page_acceptance_ratio: 1.5}\n",
     "thresholds.page_acceptance_ratio: expected a number between 0 and 1, got 1.5"),
    ("min_draft_tokens_per_second: -1\n", "min_draft_tokens_per_second: expected a number >= 0, got -1"),
    ("windows: {short: 0s}\n", "windows.short: must be greater than 0, got '0s'"),
    ("quantiles: []\n", "quantiles: expected a non-empty list, got []"),
    # cross-field rules
    ("windows: {verdict: 2m}\n", "windows.verdict: 2m is not one of windows.sidecar"),
    ("windows: {sidecar_alert: 2h}\n", "windows.sidecar_alert: 2h is not one of windows.sidecar"),
    ("alert_level: cluster\n", "alert_level: 'cluster' is not one of levels (model, instance)"),
    ("thresholds: {interval_quantile: 0.2}\n",
     "thresholds.interval_quantile: must be one of quantiles (it is recorded)"),
    ("verdict: {paying_off_from: 0.9}\n", "verdict.paying_off_from: must not be below verdict.hurting_below"),
    ("probe: {measure_below: 0.4}\n",
     "probe.measure_below: 0.4 must not be below thresholds.page_acceptance_ratio (0.5)"),
    # the statistics of the alerts on a ratio
    ("statistics: {page_windows: [10m, 2m]}\n",
     "statistics.page_windows: expected ascending, distinct windows, got 10m, 2m"),
    ("statistics: {page_windows: [2m, 10m]}\n",
     "statistics.page_budget_shares: expected one share per page window (2m, 10m), got 5"),
    ("statistics: {request_acceptance_sd: 0.6}\n",
     "statistics.request_acceptance_sd: expected a number between 0 and 0.5, got 0.6"),
    ("statistics: {false_pages_per_30d: 0}\n", "statistics.false_pages_per_30d: expected a number > 0, got 0"),
])
def test_bad_values_are_one_line_naming_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load(tmp_path, text)
    assert str(error.value) == f"{tmp_path / 'mine.yaml'}: {message}"


def test_missing_required_key_in_a_whole_config() -> None:
    raw = monitoring_config.read_yaml(monitoring_config.DEFAULT_FILE)
    del raw["dashboard"]["uid"]
    with pytest.raises(ConfigError, match=r"^dashboard\.uid: required$"):
        monitoring_config.from_mapping(raw)


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read monitoring config"):
        monitoring_config.load(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        load(tmp_path, "- 1\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line 2, column 1"):
        load(tmp_path, "thresholds: [\n")
