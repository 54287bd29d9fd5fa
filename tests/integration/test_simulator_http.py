"""The simulator over real HTTP on 127.0.0.1 (serve_in_thread on a free port)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from specdecode_exporter.simulator import ModelSpec, Scenario, Simulator, build_app, default_scenario
from specdecode_exporter.simulator.server import serve_in_thread


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def served() -> Iterator[tuple[Simulator, FakeClock, httpx.Client]]:
    clock = FakeClock()
    sim = Simulator(default_scenario("demo"), clock=clock, hang_seconds=5.0, slow_seconds=0.4)
    server, url = serve_in_thread(sim)
    assert url.startswith("http://127.0.0.1:")
    try:
        with httpx.Client(base_url=url, timeout=5.0) as client:
            yield sim, clock, client
    finally:
        server.stop()


def counter(text: str, family: str) -> float:
    return sum(s.value for f in parse_text(text) if f.name == family for s in f.samples
               if s.name.endswith("_total"))


def test_metrics_health_and_gzip(served: tuple[Simulator, FakeClock, httpx.Client]) -> None:
    _, clock, client = served
    clock.t = 30.0
    r = client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert counter(r.text, "vllm:spec_decode_num_drafts") == 6000
    raw = httpx.get(str(client.base_url.join("/metrics")), headers={"Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip"
    assert raw.text == r.text  # httpx decodes; same body
    with httpx.stream("GET", str(client.base_url.join("/metrics")), headers={"Accept-Encoding": "gzip"}) as s:
        body = b"".join(s.iter_raw())
    assert gzip.decompress(body).decode() == r.text
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("fmt", ["v1", "v1-multiproc", "v1-openmetrics", "v0"])
def test_every_format_over_http(fmt: str) -> None:
    sim = Simulator(Scenario(models=(ModelSpec(),), format=fmt), clock=lambda: 0.0)
    sim.advance(60)
    server, url = serve_in_thread(sim)
    try:
        r = httpx.get(f"{url}/metrics")
    finally:
        server.stop()
    assert r.status_code == 200
    if fmt == "v1-openmetrics":
        assert r.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
        names = {f.name for f in parse_openmetrics(r.text)}
        assert "vllm:spec_decode_num_drafts" in names
    else:
        names = {f.name for f in parse_text(r.text)}
        assert ("vllm:spec_decode_draft_acceptance_rate" if fmt == "v0" else "vllm:spec_decode_num_drafts") in names


def test_control_endpoints(served: tuple[Simulator, FakeClock, httpx.Client]) -> None:
    _, clock, client = served
    clock.t = 10.0
    state = client.get("/-/state").json()
    assert state["phase"]["name"] == "healthy" and state["format"] == "v1"
    series = state["models"][0]["series"][0]
    assert series["drafts"] == 2000 and series["accepted_tokens"] == sum(series["accepted_tokens_per_pos"])

    r = client.post("/-/phase", json={"acceptance_rate": 0.3, "drafts_per_second": 100})
    assert r.status_code == 200 and r.json()["paused"]
    before = client.get("/metrics").text
    clock.t = 1010.0
    after = client.get("/metrics").text
    d_acc = counter(after, "vllm:spec_decode_num_accepted_tokens") - counter(
        before, "vllm:spec_decode_num_accepted_tokens")
    d_draft = counter(after, "vllm:spec_decode_num_draft_tokens") - counter(
        before, "vllm:spec_decode_num_draft_tokens")
    assert d_draft == 300_000
    assert d_acc / d_draft == pytest.approx(0.3, abs=1e-4)
    assert client.get("/-/state").json()["phase"]["name"] == "healthy"

    assert client.post("/-/phase", json={"resume": True}).json()["paused"] is False
    assert client.post("/-/phase", json={"acceptance_rate": 7}).status_code == 400
    assert "unknown key" in client.post("/-/phase", json={"alpha": 0.3}).json()["error"]
    assert client.post("/-/phase", json={"phase": "degraded"}).json()["phase"]["name"] == "degraded"

    created = [s.value for f in parse_text(after) if f.name == "vllm:spec_decode_num_drafts_created"
               for s in f.samples]
    clock.t = 1020.0
    assert client.post("/-/restart").status_code == 200
    text = client.get("/metrics").text
    assert counter(text, "vllm:spec_decode_num_drafts") == 0
    new_created = [s.value for f in parse_text(text) if f.name == "vllm:spec_decode_num_drafts_created"
                   for s in f.samples]
    assert new_created[0] > created[0]


def test_completions_count_requests(served: tuple[Simulator, FakeClock, httpx.Client]) -> None:
    sim, _, client = served
    model = sim.model_names()[0]
    r = client.post("/v1/completions", json={"model": model, "prompt": "hello there world", "max_tokens": 20})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 20, "total_tokens": 23}
    text = client.get("/metrics").text
    reqs = {s.labels["finished_reason"]: s.value for f in parse_text(text) if f.name == "vllm:request_success"
            for s in f.samples if s.name.endswith("_total")}
    assert reqs["length"] == 1
    assert counter(text, "vllm:generation_tokens") == 20
    assert client.post("/v1/completions", json={"model": "nope"}).status_code == 404
    assert client.get("/v1/models").json()["data"][0]["id"] == model


def test_faults(served: tuple[Simulator, FakeClock, httpx.Client]) -> None:
    _, clock, client = served
    clock.t = 5.0
    assert client.post("/-/fault", json={"mode": "http_500"}).json() == {"fault": "http_500"}
    assert client.get("/metrics").status_code == 500

    client.post("/-/fault", json={"mode": "garbage"})
    r = client.get("/metrics")
    assert r.status_code == 200
    with pytest.raises(ValueError):
        list(parse_text(r.text))

    client.post("/-/fault", json={"mode": "drop_spec"})
    text = client.get("/metrics").text
    assert "spec_decode" not in text and "vllm:generation_tokens_total" in text

    client.post("/-/fault", json={"mode": "slow"})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.elapsed.total_seconds() >= 0.3 and "spec_decode" in r.text

    client.post("/-/fault", json={"mode": "hang"})
    with pytest.raises(httpx.ReadTimeout):
        client.get("/metrics", timeout=0.5)

    assert client.post("/-/fault", json={"mode": "explode"}).status_code == 400
    client.post("/-/fault", json={"mode": "none"})
    assert client.get("/metrics").status_code == 200


def test_build_app_serves_the_simulator_s_routes() -> None:
    app = build_app(Simulator(Scenario(), clock=lambda: 0.0))
    assert {r.path for r in app.routes} >= {"/metrics", "/health", "/v1/completions", "/-/state", "/-/phase",
                                            "/-/restart", "/-/fault"}
