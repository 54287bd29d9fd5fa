"""What `check` says about vLLM's per-request metrics, the numbers the request tap (--tap.listen-address) reads.

vLLM (≥ 0.29) puts a `metrics` object in each completion response only when started with
``--per-request-spec-decode-metrics summary`` (its `speculative_decoding` part: the tap's per-request α) and/or
``--enable-per-request-metrics`` (its timing part). Nothing in /metrics says whether they are on, so:

* by default `check` prints a one-line hint naming the flags (it cannot tell, and sends nothing);
* with ``--send-test-completion`` it sends one 1-token completion to the served model (the first in /v1/models,
  src/specdecode_exporter/sidecar/discover.py) and reads the answer
  (docs/architecture.md §3; tests/fixtures/vllm_0.32.0 has real responses with and without).

V0 (vLLM ≤ 0.9.2) has no per-request metrics at all: that is known without a request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from specdecode_exporter.sidecar.config import api_base
from specdecode_exporter.sidecar.discover import served_model
from specdecode_exporter.tap.model import ROUTE_HEADER
from specdecode_exporter.tap.openai import error_message

SPEC_FLAG = "--per-request-spec-decode-metrics summary"
TIMINGS_FLAG = "--enable-per-request-metrics"
MIN_VLLM = "0.29"
MAX_RESPONSE_BYTES = 1024 * 1024
TEST_PROMPT = "Hello"
TEST_MAX_TOKENS = 1  # vLLM creates the request's spec-decode record at admission: one token is enough
PREFIX = "Per-request metrics:"


@dataclass(frozen=True)
class PerRequestFinding:
    """One line for the user; ``decided`` is False when the test completion could not tell (exit code 1)."""

    line: str
    decided: bool = True


def hint(api: str | None) -> str | None:
    """The line `check` prints without a test completion; None for targets other than vLLM."""
    if api == "vllm-v0":
        return (f"{PREFIX} none in the V0 engine. The request tap (--tap.listen-address) needs vLLM ≥ {MIN_VLLM} "
                f"started with {SPEC_FLAG}.")
    if api != "vllm-v1":
        return None
    return (f"{PREFIX} the request tap (--tap.listen-address) records per-request α only when vLLM ≥ {MIN_VLLM} "
            f"runs with {SPEC_FLAG} ({TIMINGS_FLAG} adds timings); `check --send-test-completion` tells whether it "
            "does.")


def _present(metrics: Mapping[str, Any], key: str) -> bool:
    return metrics.get(key) is not None


def classify(document: Any, model: str) -> PerRequestFinding:
    """What a non-streamed completion response says about the two flags."""
    if not isinstance(document, Mapping) or not isinstance(document.get("choices"), list):
        return PerRequestFinding(f"{PREFIX} cannot tell: the answer is not a completion response", decided=False)
    metrics = document.get("metrics")
    asked = f"a {TEST_MAX_TOKENS}-token test completion to {model}"
    if not isinstance(metrics, Mapping):
        return PerRequestFinding(
            f"{PREFIX} off ({asked} came back without a metrics object). For the request tap, start vLLM "
            f"≥ {MIN_VLLM} with {SPEC_FLAG} (and {TIMINGS_FLAG} for timings).")
    spec = _present(metrics, "speculative_decoding")
    timings = _present(metrics, "time_to_first_token_ms") or _present(metrics, "tokens_per_second")
    if not spec:
        return PerRequestFinding(
            f"{PREFIX} timings only ({asked} has metrics.speculative_decoding null). For the request tap, add "
            f"{SPEC_FLAG} to vLLM's flags.")
    if not timings:
        return PerRequestFinding(
            f"{PREFIX} on, without timings ({asked} carried metrics.speculative_decoding): the request tap can "
            f"record per-request α; add {TIMINGS_FLAG} to vLLM for per-request speed.")
    return PerRequestFinding(
        f"{PREFIX} on ({asked} carried metrics.speculative_decoding and timings): the request tap "
        "(--tap.listen-address) can record per-request α and speed.")


async def _post(client: httpx.AsyncClient, url: str, payload: Mapping[str, Any], timeout: float
                ) -> tuple[int, bytes, str | None]:
    """(status, body, the routing header) of one POST, the body capped at MAX_RESPONSE_BYTES (ValueError beyond)."""
    async with client.stream("POST", url, json=payload, timeout=timeout) as response:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_RESPONSE_BYTES:
                raise ValueError(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
        return response.status_code, bytes(body), response.headers.get(ROUTE_HEADER.decode())


def routing_line(header: str | None) -> str | None:
    """Where a routing request tap (tap.route) sent the test completion, from its x-specdecode-route header."""
    if header is None:
        return None
    sent, _, reason = header.partition(";")
    reason = reason.strip().removeprefix("reason=")
    return (f"Routing: this URL is a routing request tap; the test completion went to the {sent.strip()} pool "
            f"(reason {reason or 'unknown'}). Per-class state: the sidecar's /api/v1/status, routing.")


async def send_test_completion(metrics_url: str, timeout: float) -> PerRequestFinding:
    """Send one tiny completion to the served model (the first in /v1/models) and classify the answer."""
    url = api_base(metrics_url) + "/v1/completions"  # vLLM's, beside its /metrics

    def failed(why: str) -> PerRequestFinding:
        return PerRequestFinding(f"{PREFIX} cannot tell: POST {url}: {why}", decided=False)

    async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
        model, why_not = await served_model(client, metrics_url, timeout, None)
        if model is None:
            return PerRequestFinding(f"{PREFIX} cannot tell: no model to ask: {why_not}", decided=False)
        payload = {"model": model, "prompt": TEST_PROMPT, "max_tokens": TEST_MAX_TOKENS, "temperature": 0}
        try:
            status, body, route = await _post(client, url, payload, timeout)
        except httpx.TimeoutException:
            return failed(f"no answer within {timeout:g}s")
        except httpx.HTTPError as exc:
            return failed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        except (OSError, ValueError) as exc:
            return failed(str(exc) or type(exc).__name__)
    if status != 200:
        return failed(f"HTTP {status}: {error_message(body)}")
    try:
        document = json.loads(body)
    except ValueError:
        return failed(f"the answer is not JSON ({len(body)} bytes)")
    finding = classify(document, model)
    routed = routing_line(route)
    return finding if routed is None else PerRequestFinding(f"{finding.line}\n{routed}", finding.decided)
