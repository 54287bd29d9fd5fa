"""Simulator → sidecar → /metrics, over real loopback HTTP, with collection driven on a fake clock."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import httpx
import pytest

from specdecode_exporter.sidecar.config import TargetConfig
from specdecode_exporter.simulator import ModelSpec, steady_scenario
from tests.helpers import Exposition, Harness, harness_fixture, start_harness

ALPHA = "specdecode_acceptance_ratio"


@pytest.fixture
def harness() -> Iterator[Harness]:
    yield from harness_fixture(start_harness(steady_scenario(ModelSpec(acceptance_rate=0.75, drafts_per_second=200))))


def test_alpha_drop_crosses_half_within_two_collection_intervals(harness: Harness) -> None:
    for _ in range(24):  # two minutes of healthy traffic
        harness.step(5.0)
    assert harness.metrics().get(ALPHA, window="1m") == pytest.approx(0.75, abs=0.005)
    harness.simulator.set_override(acceptance_rate=0.35)
    crossed_after = None
    for step in range(1, 20):
        harness.step(5.0)
        tau = 5.0 * step
        alpha = harness.metrics().get(ALPHA, window="1m")
        # By hand: a 60 s window with τ seconds at 0.35 and the rest at 0.75, same draft rate.
        expected = (0.35 * min(tau, 60) + 0.75 * max(0.0, 60 - tau)) / 60
        assert alpha == pytest.approx(expected, abs=0.005), f"τ={tau}"
        if alpha is not None and alpha < 0.5 and crossed_after is None:
            crossed_after = tau
    true_crossing = (0.75 - 0.5) / (0.75 - 0.35) * 60  # 37.5 s
    assert crossed_after is not None
    assert true_crossing <= crossed_after <= true_crossing + 2 * 5.0
    status = harness.status()
    assert status["targets"][0]["series"][0]["windows"]["1m"]["acceptance_ratio"] == pytest.approx(0.35, abs=0.005)


def test_every_contract_metric_is_served(harness: Harness) -> None:
    for _ in range(14):
        harness.step(5.0)
    metrics = harness.metrics()
    labels = {"target": "vllm", "model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine": "0"}
    assert metrics.get("specdecode_up", target="vllm") == 1.0
    assert metrics.get("specdecode_collect_duration_seconds", target="vllm") > 0
    assert metrics.get("specdecode_collect_errors_total", target="vllm", reason="connect") == 0
    assert metrics.get("specdecode_info", **labels, api="vllm-v1", num_speculative_tokens="3") == 1
    drafts = metrics.get("specdecode_drafts_total", **labels)
    drafted = metrics.get("specdecode_draft_tokens_total", **labels)
    accepted = metrics.get("specdecode_accepted_tokens_total", **labels)
    assert drafted == pytest.approx(3 * drafts, abs=3)
    assert metrics.get("specdecode_emitted_tokens_total", **labels) == accepted + drafts
    by_position = [metrics.get("specdecode_accepted_tokens_by_position_total", **labels, position=str(i))
                   for i in range(3)]
    assert by_position[0] >= by_position[1] >= by_position[2] > 0
    assert sum(by_position) == pytest.approx(accepted, abs=3)
    for window in ("1m", "5m"):
        w = {**labels, "window": window}
        assert metrics.get(ALPHA, **w) == pytest.approx(0.75, abs=0.005)
        mean_len = metrics.get("specdecode_mean_acceptance_length", **w)
        assert mean_len == pytest.approx(1 + 3 * 0.75, abs=0.02)
        assert metrics.get("specdecode_draft_tokens_per_second", **w) == pytest.approx(600, rel=0.01)
        assert metrics.get("specdecode_accepted_tokens_per_second", **w) == pytest.approx(450, rel=0.01)
        assert metrics.get("specdecode_expected_speedup", **w) == pytest.approx(mean_len / 2.5, rel=1e-6)
        assert 0 < metrics.get("specdecode_token_acceptance_probability", **w) < 1
        assert len(metrics.all("specdecode_position_acceptance_ratio", **w)) == 3
        assert len(metrics.all("specdecode_expected_speedup_by_length", **w)) == 3
        assert metrics.get("specdecode_recommended_num_speculative_tokens", **w) in (1, 2, 3)
    assert metrics.get("specdecode_break_even_acceptance_ratio", **labels) == 0.5
    assert metrics.get("specdecode_interval_acceptance_ratio_count", **labels) == 13
    assert metrics.get("specdecode_interval_acceptance_ratio_bucket", **labels, le="0.7") == 0
    assert metrics.get("specdecode_interval_acceptance_ratio_bucket", **labels, le="0.8") == 13
    assert metrics.types["specdecode_interval_acceptance_ratio"] == "histogram"


def test_windows_without_data_have_no_sample(harness: Harness) -> None:
    harness.step(5.0)
    assert harness.metrics().all(ALPHA) == {}  # one collection: no window yet
    harness.simulator.set_override(drafts_per_second=0.0)
    for _ in range(15):
        harness.step(5.0)
    metrics = harness.metrics()
    assert metrics.all(ALPHA) == {}  # no drafts in any window: absent, not 0 and not NaN
    assert metrics.get("specdecode_up", target="vllm") == 1.0
    assert metrics.all("specdecode_draft_tokens_total")


def test_restart_never_gives_negative_or_spiking_rates(harness: Harness) -> None:
    totals = []
    for step in range(30):
        if step == 15:
            harness.simulator.restart()
        harness.step(5.0)
        metrics = harness.metrics()
        totals.append(metrics.get("specdecode_draft_tokens_total"))
        rate = metrics.get("specdecode_draft_tokens_per_second", window="1m")
        alpha = metrics.get(ALPHA, window="1m")
        if rate is not None:
            assert 0 <= rate <= 600 * 1.02, f"step {step}: rate {rate}"
        if alpha is not None:
            assert alpha == pytest.approx(0.75, abs=0.01)
    assert totals == sorted(totals), "reset-safe counters never go down"
    assert harness.metrics().get("specdecode_source_restarts_total") == 1
    # No counts lost beyond the one interval the restart cut short: 30 intervals of 600 tokens/s.
    assert totals[-1] - totals[0] == pytest.approx(29 * 5 * 600, rel=0.04)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("http_500", "http_status"), ("garbage", "parse"), ("drop_spec", "no_spec_metrics"), ("hang", "timeout")],
)
def test_faults_set_up_to_zero_and_count_the_reason(fault: str, reason: str) -> None:
    harness = start_harness(target=None, hang_seconds=3.0)
    short_timeout = TargetConfig("vllm", harness.simulator_url + "/metrics", timeout=0.5)
    harness.exporter.collectors["vllm"].reconfigure(short_timeout, harness.exporter.config)
    try:
        for _ in range(3):
            harness.step(5.0)
        before = harness.metrics()
        harness.simulator.set_fault(fault)
        harness.step(5.0)
        harness.step(5.0)
        during = harness.metrics()
        assert during.get("specdecode_up", target="vllm") == 0.0
        assert during.get("specdecode_collect_errors_total", target="vllm", reason=reason) == 2
        # What was known is still reported: the counters stay, unchanged.
        assert during.get("specdecode_draft_tokens_total") == before.get("specdecode_draft_tokens_total")
        status = harness.status()["targets"][0]
        assert status["up"] is False and status["last_error"].startswith(reason)
        harness.simulator.set_fault("none")
        harness.step(5.0)
        assert harness.metrics().get("specdecode_up", target="vllm") == 1.0
    finally:
        harness.stop()


def windowed(metrics: Exposition) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """Every sample that carries a window label: the windowed gauges (and the verdict over its window)."""
    return {(name, labels) for name, labels in metrics.samples if any(key == "window" for key, _ in labels)}


def test_a_down_targets_windowed_gauges_go_stale_after_one_failed_collection() -> None:
    """One timed-out collection keeps every windowed gauge (a scrape that found them gone would reset the `for:` of
    the tickets that read them: SpecDecodeObservedSpeedupLow, SpecDecodeTailRegression, SpecDecodeThroughputCut,
    SpecDecodeRecommendedKLower); the second failed collection in a row drops them, the verdict with them, as
    exporters do for targets they cannot read. The counters and specdecode_up 0 stay; the status says since when
    there is no data; the next good collection brings the windows back."""
    harness = start_harness(target=None, hang_seconds=3.0)
    short_timeout = TargetConfig("vllm", harness.simulator_url + "/metrics", timeout=0.5)
    harness.exporter.collectors["vllm"].reconfigure(short_timeout, harness.exporter.config)
    try:
        for _ in range(4):
            harness.step(5.0)
        before, status_before = harness.metrics(), harness.status()["targets"][0]
        gauges = windowed(before)
        assert ("specdecode_acceptance_ratio", frozenset({("target", "vllm"), ("window", "1m"), ("engine", "0"), (
            "model_name", "meta-llama/Llama-3.1-8B-Instruct")})) in gauges and len(gauges) > 20
        assert before.get("specdecode_verdict") == 1.0
        harness.simulator.set_fault("hang")
        harness.step(5.5)  # the next tick, and its timeout
        once = harness.metrics()
        assert once.get("specdecode_up") == 0.0 and once.get("specdecode_collect_errors_total", reason="timeout") == 1
        assert windowed(once) == gauges  # all of them, through one timed-out collection
        assert harness.status()["targets"][0]["windows_stale"] is False
        harness.step(4.5)  # the tick after: timed out too
        twice = harness.metrics()
        assert windowed(twice) == set() and twice.get("specdecode_verdict") is None
        assert twice.get("specdecode_up") == 0.0
        for counter in ("specdecode_draft_tokens_total", "specdecode_accepted_tokens_total", "specdecode_drafts_total"):
            assert twice.get(counter) == before.get(counter) is not None, counter
        target = harness.status()["targets"][0]
        assert target["windows_stale"] is True and target["failed_in_a_row"] == 2
        assert target["no_data_since"] == status_before["last_success"]
        series = target["series"][0]
        assert series["verdict"] == "no data" and series["verdict_reason"].startswith("since ")
        assert series["verdict_reason"].endswith(": the last 2 collections failed (timeout)")
        page = httpx.get(harness.sidecar_url + "/", timeout=5).text
        since = status_before["last_success"].replace("T", " ").replace("Z", " UTC")
        assert (f"no data since {since}: windowed figures dropped (kept through 1 failed collection), counters kept"
                in page), page
        assert "1m – <small>(stale: the target cannot be read)</small>" in page
        harness.simulator.set_fault("none")
        harness.step(5.0)
        assert windowed(harness.metrics()) == gauges and harness.status()["targets"][0]["windows_stale"] is False
    finally:
        harness.stop()


def test_unreachable_target_is_connect_and_metrics_keep_answering() -> None:
    harness = start_harness()
    try:
        harness.step(5.0)
        harness.stop_simulator()
        harness.step(5.0)
        metrics = harness.metrics()
        assert metrics.get("specdecode_up") == 0.0
        assert metrics.get("specdecode_collect_errors_total", reason="connect") == 1
    finally:
        harness.stop()


def test_body_over_the_size_cap_is_too_large() -> None:
    harness = start_harness(max_body_size=1000)
    try:
        harness.step(5.0)
        metrics = harness.metrics()
        assert metrics.get("specdecode_up") == 0.0
        assert metrics.get("specdecode_collect_errors_total", reason="too_large") == 1
    finally:
        harness.stop()


def test_wrong_path_is_http_status() -> None:
    harness = start_harness(url_path="/nope")
    try:
        harness.step(5.0)
        assert harness.metrics().get("specdecode_collect_errors_total", reason="http_status") == 1
    finally:
        harness.stop()


@pytest.mark.parametrize("fmt", ["v1", "v1-multiproc", "v1-openmetrics"])
def test_every_v1_format_gives_the_same_alpha(fmt: str) -> None:
    spec = ModelSpec(engines=2, acceptance_rate=0.6, drafts_per_second=100)
    harness = start_harness(steady_scenario(spec, fmt=fmt))
    try:
        for _ in range(13):
            harness.step(5.0)
        metrics = harness.metrics()
        alphas = metrics.all(ALPHA, window="1m")
        assert sorted(dict(labels)["engine"] for labels in alphas) == ["0", "1"]
        assert all(v == pytest.approx(0.6, abs=0.01) for v in alphas.values())
    finally:
        harness.stop()


def test_v0_gives_correct_windowed_alpha_from_its_broken_counters() -> None:
    spec = ModelSpec(num_speculative_tokens=5, acceptance_rate=0.55, drafts_per_second=100)
    harness = start_harness(steady_scenario(spec, fmt="v0"), interval=5.0)
    try:
        assert harness.exporter.collectors["vllm"].interval == 5.0
        for _ in range(90):  # 3 minutes at the 2 s interval the V0 engine asks for
            harness.step(harness.exporter.collectors["vllm"].interval)
        assert harness.exporter.collectors["vllm"].interval == 2.0
        metrics = harness.metrics()
        labels = {"model_name": spec.name}
        assert "engine" not in dict(next(iter(metrics.all("specdecode_up"))))
        assert metrics.get("specdecode_info", **labels, api="vllm-v0", num_speculative_tokens="5") == 1
        assert metrics.get(ALPHA, **labels, window="1m") == pytest.approx(0.55, abs=0.01)
        assert metrics.get("specdecode_mean_acceptance_length", **labels, window="1m") == pytest.approx(
            1 + 5 * 0.55, abs=0.05)
        assert metrics.get("specdecode_lifetime_acceptance_ratio", **labels) == pytest.approx(0.55, abs=0.01)
        # The sidecar's counters are true totals, not V0's sums of sums.
        state = harness.simulator.state()
        drafted = metrics.get("specdecode_draft_tokens_total", **labels)
        assert drafted <= 5 * 100 * 180 * 1.01
        assert state is not None
    finally:
        harness.stop()


def test_readiness_follows_collections(harness: Harness) -> None:
    assert httpx.get(harness.sidecar_url + "/readyz").status_code == 503
    harness.step(5.0)
    ready = httpx.get(harness.sidecar_url + "/readyz")
    assert ready.status_code == 200 and ready.text == "ok\n"
    harness.simulator.set_fault("http_500")
    for _ in range(4):
        harness.step(5.0)
    not_ready = httpx.get(harness.sidecar_url + "/readyz")
    assert not_ready.status_code == 503
    assert "last success 20s ago" in not_ready.text
    assert httpx.get(harness.sidecar_url + "/healthz").status_code == 200


def test_stale_label_sets_are_dropped() -> None:
    harness = start_harness(stale_after=30.0)
    try:
        harness.step(5.0)
        assert harness.metrics().all("specdecode_draft_tokens_total")
        harness.simulator.set_fault("drop_spec")
        for _ in range(7):
            harness.step(5.0)
        assert harness.metrics().all("specdecode_draft_tokens_total") == {}
    finally:
        harness.stop()


def test_landing_page_and_status(harness: Harness) -> None:
    for _ in range(14):
        harness.step(5.0)
    page = httpx.get(harness.sidecar_url + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "paying off" in page.text and "meta-llama/Llama-3.1-8B-Instruct" in page.text
    status = harness.status()
    series = status["targets"][0]["series"][0]
    assert series["verdict"] == "paying off" and series["verdict_window"] == "5m"
    assert status["ready"] is True


def test_no_target_parameter_can_redirect_the_sidecar(harness: Harness) -> None:
    harness.step(5.0)
    response = httpx.get(harness.sidecar_url + "/metrics", params={"target": "http://169.254.169.254/"})
    assert response.status_code == 200
    assert "169.254" not in response.text
    assert httpx.get(harness.sidecar_url + "/probe", params={"target": "x"}).status_code == 404


def test_a_trailing_slash_is_not_redirected_to_the_host_a_client_names(harness: Harness) -> None:
    harness.step(5.0)
    response = httpx.get(harness.sidecar_url + "/metrics/", headers={"Host": "evil.example"})
    assert response.status_code == 404
    assert "location" not in response.headers


def test_openmetrics_negotiation(harness: Harness) -> None:
    harness.step(5.0)
    response = httpx.get(harness.sidecar_url + "/metrics", headers={"Accept": "application/openmetrics-text"})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


def _raw_metrics(harness: Harness, accept_encoding: str, accept: str = "text/plain") -> tuple[httpx.Headers, bytes]:
    """Headers and the body as sent (httpx would decode a gzip body)."""
    with httpx.stream("GET", harness.sidecar_url + "/metrics",
                      headers={"Accept-Encoding": accept_encoding, "Accept": accept}) as response:
        return response.headers, b"".join(response.iter_raw())


def _spec_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "specdecode_" in line and "build_info" not in line]


@pytest.mark.parametrize("accept", ["text/plain", "application/openmetrics-text"])
def test_metrics_are_gzipped_for_clients_that_ask(harness: Harness, accept: str) -> None:
    harness.step(5.0)
    harness.step(5.0)
    plain_headers, plain = _raw_metrics(harness, "identity", accept)
    assert "content-encoding" not in plain_headers
    assert plain_headers["vary"] == "Accept-Encoding"
    for _ in range(2):  # the second one reuses the compressed spec-decode part
        headers, packed = _raw_metrics(harness, "gzip, deflate", accept)
        assert headers["content-encoding"] == "gzip"
        assert headers["vary"] == "Accept-Encoding"
        assert len(packed) < len(plain) / 4
        # One gzip stream that zlib reads to its end: every reader, not only multi-member-aware ones.
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        text = inflater.decompress(packed).decode()
        assert inflater.eof and not inflater.unused_data
        assert _spec_lines(text) == _spec_lines(plain.decode())
        assert "process_resident_memory_bytes" in text  # the live families follow
        if accept.startswith("application/openmetrics"):
            assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    assert "content-encoding" not in _raw_metrics(harness, "gzip;q=0, identity")[0]


@pytest.mark.parametrize("accept", ["text/plain", "application/openmetrics-text;version=1.0.0"])
@pytest.mark.parametrize("accept_encoding", ["identity", "gzip"])
def test_every_scrape_reads_the_last_collection(harness: Harness, accept: str, accept_encoding: str) -> None:
    """After each collection, every scrape (any format, gzipped or not, one right after another) reads that
    collection's counters: a page cached across collections, or rendered ahead for another scraper, reads older
    ones."""
    for _ in range(4):
        harness.step(5.0)
        drafted = harness.simulator.snapshot()[0].engines[0].draft_tokens
        for _ in range(2):
            text = httpx.get(harness.sidecar_url + "/metrics", timeout=5,
                             headers={"Accept": accept, "Accept-Encoding": accept_encoding}).text
            parsed = Exposition.parse(text.removesuffix("# EOF\n"))
            assert parsed.get("specdecode_draft_tokens_total", engine="0") == drafted


def test_targets_share_one_default_tls_context() -> None:
    """Each default TLS context loads the CA bundle (~0.8 MB): 100 targets once cost 80 MB of RSS."""
    from specdecode_exporter.sidecar.collection import default_ssl_context, new_client

    def rss_mib() -> float:
        with open("/proc/self/status") as status:
            return int(status.read().split("VmRSS:")[1].split()[0]) / 1024

    before = rss_mib()
    clients = [new_client(TargetConfig(name=f"t{i}", url=f"http://127.0.0.1:1/m{i}")) for i in range(100)]
    assert rss_mib() - before < 20, "per-target clients must not each load the CA bundle"
    assert default_ssl_context() is default_ssl_context()
    assert len(clients) == 100
