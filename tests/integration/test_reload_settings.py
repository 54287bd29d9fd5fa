"""A reload applies every setting it says it applied, at once: one test per setting, through the sidecar's real
HTTP endpoints (simulator → sidecar over loopback, a fake clock driving the collections)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specdecode_exporter.core.config.settings import get
from specdecode_exporter.sidecar.config import Config, config_from_mapping
from specdecode_exporter.sidecar.reload import APPLIED, RESTART_ONLY, Reloader
from specdecode_exporter.simulator import ModelSpec, steady_scenario
from tests.helpers import Harness, harness_fixture, start_harness


@pytest.fixture
def harness() -> Iterator[Harness]:
    yield from harness_fixture(start_harness(steady_scenario(ModelSpec(acceptance_rate=0.75, engines=2)),
                                             windows="1m,5m"))


def reload_with(harness: Harness, **changes: Any) -> str:
    """Reload the harness' sidecar with its one target and ``changes`` to the config mapping."""
    target = harness.exporter.config.targets[0]
    data: dict[str, Any] = {"windows": "1m,5m", "collect": {"interval": "5s"},
                            "targets": [{"name": target.name, "url": target.url, "timeout": "2s"}]}
    for key, value in changes.items():
        section, _, field = key.partition(".")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[key] = value
    new: Config = config_from_mapping(data, "reload")
    ok, message = Reloader(harness.exporter, lambda: new).reload()
    assert ok, message
    return message


def warm(harness: Harness, steps: int = 13) -> None:
    for _ in range(steps):
        harness.step(5.0)


def first_series(harness: Harness) -> dict[str, Any]:
    status = harness.status()
    series: dict[str, Any] = status["targets"][0]["series"][0]  # type: ignore[index]
    return series


def test_page_threshold(harness: Harness) -> None:
    warm(harness)
    assert first_series(harness)["verdict"] == "paying off"
    message = reload_with(harness, page_threshold=0.8)
    assert "verdict (page_threshold and bands)" in message and "applied" in message
    # At once, before the next collection: the status, the verdict and the metric.
    assert harness.status()["page_threshold"] == 0.8
    series = first_series(harness)
    assert series["verdict"] == "marginal" and "below the page threshold 0.8" in series["verdict_reason"]
    assert harness.metrics().get("specdecode_verdict", verdict="marginal", engine="0") == 1.0


def test_monitoring_config_file(harness: Harness, tmp_path: Path) -> None:
    warm(harness)
    monitoring = tmp_path / "monitoring.yaml"
    monitoring.write_text("verdict: {paying_off_from: 1.4}\nwindows: {verdict: 1m}\n")
    message = reload_with(harness, **{"monitoring.config_file": str(monitoring)})
    assert "monitoring.config_file None → " in message
    series = first_series(harness)
    assert series["verdict"] == "marginal" and series["verdict_reason"] == "modelled 1.30×: below 1.4×"
    assert series["verdict_window"] == "1m"
    assert harness.status()["verdict_bands"]["paying_off_from"] == 1.4


def test_windows(harness: Harness) -> None:
    warm(harness)
    assert harness.metrics().all("specdecode_acceptance_ratio", window="5m")
    message = reload_with(harness, windows="1m")
    assert "windows 1m,5m → 1m applied" in message
    assert not harness.metrics().all("specdecode_acceptance_ratio", window="5m")
    assert harness.metrics().all("specdecode_acceptance_ratio", window="1m")


def test_collect_interval(harness: Harness) -> None:
    warm(harness, 2)
    message = reload_with(harness, **{"collect.interval": "2s"})
    assert "collect.interval 5.0 → 2.0 applied" in message
    assert harness.status()["targets"][0]["interval_seconds"] == 2.0  # type: ignore[index]
    assert harness.exporter.store.keep_seconds == 300 + 2 * 2.0


def test_max_body_size(harness: Harness) -> None:
    warm(harness, 2)
    message = reload_with(harness, **{"collect.max_body_size": "1KiB"})
    assert "collect.max_body_size" in message and "→ 1024 applied" in message
    view = harness.step(5.0)
    assert not view.up and view.last_error is not None and view.last_error.startswith("too_large")


def test_stale_after(harness: Harness) -> None:
    warm(harness, 2)
    message = reload_with(harness, **{"collect.stale_after": "1s"})
    assert "collect.stale_after 600.0 → 1.0 applied" in message
    harness.simulator.set_fault("http_500")
    harness.step(5.0)  # a failed collection expires what was not seen within 1 s
    assert harness.metrics().all("specdecode_drafts_total") == {}


def test_max_series_per_target(harness: Harness) -> None:
    message = reload_with(harness, **{"collect.max_series_per_target": 1})
    assert "collect.max_series_per_target 1000 → 1 applied" in message
    harness.step(5.0)
    metrics = harness.metrics()
    assert len(metrics.all("specdecode_drafts_total")) == 1
    assert metrics.get("specdecode_dropped_series_total") == 1.0


def test_verdict_window(harness: Harness, tmp_path: Path) -> None:
    warm(harness)
    assert first_series(harness)["verdict_window"] == "5m"
    monitoring = tmp_path / "monitoring.yaml"
    monitoring.write_text("windows: {verdict: 1m}\n")
    message = reload_with(harness, **{"monitoring.config_file": str(monitoring)})
    assert "verdict window 5m → 1m applied" in message
    assert first_series(harness)["verdict_window"] == "1m"
    assert harness.metrics().get("specdecode_verdict", engine="0", window="1m") == 1.0


def test_speculation_stopped(harness: Harness, tmp_path: Path) -> None:
    warm(harness)
    assert first_series(harness)["speculation"]["state"] == "speculating"
    monitoring = tmp_path / "monitoring.yaml"
    monitoring.write_text("speculation_stopped: {min_generated_tokens_per_second: 1e6}\n")
    message = reload_with(harness, **{"monitoring.config_file": str(monitoring)})
    assert "speculation_stopped" in message and "applied" in message
    assert first_series(harness)["speculation"]["state"] == "too little traffic"  # at once, before a collection
    assert harness.status()["speculation_stopped"] == {"share_below": 0.01, "min_generated_tokens_per_second": 1e6}


def test_log_settings_are_reported_as_applied(harness: Harness) -> None:
    # That they take effect is tested on a real process (tests/faults/test_sidecar_process.py).
    message = reload_with(harness, log={"level": "debug", "format": "json"})
    assert "log.level info → debug applied" in message and "log.format logfmt → json applied" in message
    reload_with(harness, log={"level": "info", "format": "logfmt"})


def test_collect_timeout(harness: Harness) -> None:
    # A target without a timeout of its own takes collect.timeout: the reload's new targets carry it.
    target = harness.exporter.config.targets[0]
    data = {"windows": "1m,5m", "collect": {"interval": "5s", "timeout": "1s"},
            "targets": [{"name": target.name, "url": target.url}]}
    ok, message = Reloader(harness.exporter, lambda: config_from_mapping(data, "reload")).reload()
    assert ok, message
    assert "collect.timeout 3.0 → 1.0 applied" in message
    assert harness.exporter.config.collect.timeout == 1.0 and harness.exporter.config.targets[0].timeout == 1.0


@pytest.mark.parametrize(("key", "value", "field"), [
    ("web.listen_address", ":19877", "listen_address"),
    ("web.telemetry_path", "/m", "telemetry_path"),
    ("collect.concurrency", 3, "concurrency"),
])
def test_restart_only_settings_say_so_and_keep_the_running_value(harness: Harness, key: str, value: object,
                                                                  field: str) -> None:
    before = get(harness.exporter.config, key)
    message = reload_with(harness, **{key: value})
    assert f"{field} changed; it applies after a restart" in message
    assert get(harness.exporter.config, key) == before


# Every setting the reload reports as applied has a test above (a new setting needs one).
TESTED: dict[str, Callable[..., None]] = {
    "windows": test_windows, "collect.interval": test_collect_interval, "collect.max_body_size": test_max_body_size,
    "collect.stale_after": test_stale_after, "collect.max_series_per_target": test_max_series_per_target,
    "collect.timeout": test_collect_timeout,
    "verdict": test_page_threshold, "verdict_window": test_verdict_window,
    "monitoring.config_file": test_monitoring_config_file, "log.level": test_log_settings_are_reported_as_applied,
    "log.format": test_log_settings_are_reported_as_applied, "speculation_stopped": test_speculation_stopped,
}


def test_every_applied_setting_has_a_test() -> None:
    assert set(APPLIED) == set(TESTED)
    assert {"web.listen_address", "web.telemetry_path", "collect.concurrency"} <= set(RESTART_ONLY)
