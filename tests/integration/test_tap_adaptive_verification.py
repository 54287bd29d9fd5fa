"""The request tap refuses to guess where the sidecar does: a target declared ``adaptive_verification: true`` has
its per-request α withheld, as its collected α is (docs/engines.md: vLLM's source does not settle whether
num_draft_tokens counts proposed or verified tokens under adaptive verification).

Real processes over loopback HTTP on free ports: two sidecars (`run`, the installed package), one declaring the
target adaptive, one not, each tapping the same upstream, a server that answers vLLM 0.32.0's own /metrics and
completion response (tests/fixtures/vllm_0.32.0) byte for byte. Routing runs in enforce mode on both.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.procs import Process, free_port
from devtools.stack import start_sidecar
from specdecode_exporter.tap.request_stats import ADAPTIVE_VERIFICATION_WITHHELD, WITHHELD
from tests.helpers import Exposition

pytestmark = pytest.mark.timeout(180)

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_0.32.0"
METRICS = (REAL / "metrics_ngram_per_request.prom").read_bytes()
COMPLETION = (REAL / "completion_nonstream.json").read_bytes()
SPEC = json.loads(COMPLETION)["metrics"]["speculative_decoding"]
REQUEST = {"model": "tiny", "prompt": "a b c", "max_tokens": 40, "temperature": 0.0}
ALPHA_FAMILIES = ("specdecode_request_draft_tokens_total", "specdecode_request_accepted_tokens_total",
                  "specdecode_request_draft_tokens_squared_total", "specdecode_request_accepted_tokens_squared_total",
                  "specdecode_request_accepted_draft_tokens_product_total", "specdecode_request_acceptance_ratio_count")


class _VllmReplay(BaseHTTPRequestHandler):
    """vLLM 0.32.0 as captured: its /metrics, and one completion's response body for every completion."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(METRICS, "text/plain; version=0.0.4; charset=utf-8")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self._answer(COMPLETION, "application/json")

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _replay() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _VllmReplay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _wait(check: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _sidecar(stack: contextlib.ExitStack, workdir: Path, upstream: str, fallback: str, adaptive: bool
             ) -> tuple[Process, str]:
    tap = f"127.0.0.1:{free_port()}"
    name = "adaptive" if adaptive else "fixed"
    sidecar = start_sidecar(stack, workdir, {
        "targets": [{"name": "vllm", "url": f"{upstream}/metrics", "adaptive_verification": adaptive}],
        "collect": {"interval": "1s"},
        "tap": {"listen_address": tap, "route": {"fallback_upstream": fallback, "mode": "enforce",
                                                   "min_requests": 50}},
    }, name=name)
    return sidecar, f"http://{tap}"


def _status(sidecar: Process) -> dict[str, Any]:
    target: dict[str, Any] = httpx.get(f"{sidecar.url}/api/v1/status", timeout=10).json()["targets"][0]
    return target


def _tapped(sidecar: Process, tap: str) -> tuple[httpx.Response, Exposition, dict[str, Any]]:
    """One completion through the tap, then the sidecar's metrics and status once it has counted it."""
    response = httpx.post(f"{tap}/v1/completions", json=REQUEST, timeout=30)

    def counted() -> bool:
        requests = _status(sidecar)["requests"]
        return bool(requests["bands"] or requests["without_spec_metrics"])
    _wait(counted)
    return response, Exposition.parse(httpx.get(f"{sidecar.url}/metrics", timeout=10).text), _status(sidecar)


def test_adaptive_target_withholds_per_request_alpha_and_leaves_the_response_alone(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        upstream, fallback = stack.enter_context(_replay()), stack.enter_context(_replay())
        adaptive, adaptive_tap = _sidecar(stack, tmp_path, upstream, fallback, adaptive=True)
        fixed, fixed_tap = _sidecar(stack, tmp_path, upstream, fallback, adaptive=False)
        direct = httpx.post(f"{upstream}/v1/completions", json=REQUEST, timeout=30)

        response, metrics, status = _tapped(adaptive, adaptive_tap)
        # The client gets what it got before: the upstream's status and body, byte for byte.
        assert (response.status_code, response.content) == (200, direct.content) == (200, COMPLETION)
        for family in ALPHA_FAMILIES:
            assert sum(metrics.all(family).values()) == 0, family
        # The request still counts, by why its figures were not read.
        assert sum(metrics.all("specdecode_requests_without_spec_metrics_total").values()) == 1
        assert metrics.get("specdecode_requests_without_spec_metrics_total", reason=WITHHELD, model_name="tiny") == 1
        requests = status["requests"]
        assert (requests["bands"], requests["models"], requests["withheld"]) == ([], {},
                                                                                 ADAPTIVE_VERIFICATION_WITHHELD)
        assert requests["without_spec_metrics"] == {WITHHELD: 1}
        (route_class,) = status["routing"]["classes"]
        assert route_class["evidence"]["requests"] == 0  # no routing decision rests on the withheld α
        assert ADAPTIVE_VERIFICATION_WITHHELD in httpx.get(f"{adaptive.url}/", timeout=10).text.replace(
            "&#x27;", "'")

        response, metrics, status = _tapped(fixed, fixed_tap)
        assert (response.status_code, response.content) == (200, COMPLETION)
        assert sum(metrics.all("specdecode_request_draft_tokens_total").values()) == SPEC["num_draft_tokens"]
        assert sum(metrics.all("specdecode_request_accepted_tokens_total").values()) == \
            SPEC["num_accepted_draft_tokens"]
        assert sum(metrics.all("specdecode_request_draft_tokens_squared_total").values()) == \
            SPEC["num_draft_tokens"] ** 2
        assert sum(metrics.all("specdecode_request_acceptance_ratio_count").values()) == 1
        assert status["requests"]["withheld"] is None
        assert status["requests"]["without_spec_metrics"] == {}
        (route_class,) = status["routing"]["classes"]
        assert route_class["evidence"]["requests"] == 1
