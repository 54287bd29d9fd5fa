"""`check` and vLLM's per-request metrics (what the request tap reads), over real loopback HTTP.

Against the embedded simulator started as vLLM would be (`simulate --per-request-spec-decode-metrics …
--enable-per-request-metrics …`), and against a server that answers with real vLLM 0.32.0 responses
(tests/fixtures/vllm_0.32.0) or with broken ones. Every run is the real CLI in a subprocess.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from devtools.procs import child_env, exporter_command, running
from specdecode_exporter.check.per_request import hint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = FIXTURES / "vllm_0.32.0"
SPEC_FLAG = "--per-request-spec-decode-metrics summary"
TIMINGS_FLAG = "--enable-per-request-metrics"
PREFIX = "Per-request metrics:"


def run_check(url: str, *flags: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdecode_exporter.cli", "check", url, "--duration", "1s", *flags],
                          capture_output=True, text=True, timeout=timeout, env=child_env())


def per_request_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in result.stderr + result.stdout
    return [line for line in result.stdout.splitlines() if line.startswith(PREFIX)]


# ---- against the simulator, started with vLLM's flags --------------------------------------------------------------


@contextlib.contextmanager
def simulator(tmp_path: Path, spec_level: str, timings: bool) -> Iterator[str]:
    with running("simulator", lambda port: [
        *exporter_command(), "simulate", "--web.listen-address", f"127.0.0.1:{port}", "--acceptance-rate", "0.7",
        "--pace", "false", "--per-request-spec-decode-metrics", spec_level,
        "--enable-per-request-metrics", str(timings).lower(),
    ], tmp_path, "/health") as proc:
        yield proc.url


@pytest.mark.parametrize(
    ("spec_level", "timings", "expected", "names_spec_flag", "names_timings_flag"),
    [
        ("summary", True, f"{PREFIX} on (", False, False),
        ("summary", False, f"{PREFIX} on, without timings", False, True),
        ("none", True, f"{PREFIX} timings only", True, False),
        ("none", False, f"{PREFIX} off", True, True),
    ],
)
def test_send_test_completion_tells_which_flags_are_on(tmp_path: Path, spec_level: str, timings: bool, expected: str,
                                                        names_spec_flag: bool, names_timings_flag: bool) -> None:
    with simulator(tmp_path, spec_level, timings) as url:
        result = run_check(url + "/metrics", "--send-test-completion")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "paying off" in result.stdout  # the verdict is still there
    [line] = per_request_lines(result)
    assert line.startswith(expected), line
    assert "meta-llama/Llama-3.1-8B-Instruct" in line  # the served model was asked
    # The flags are named only where they are off.
    assert (SPEC_FLAG in line) is names_spec_flag, line
    assert (TIMINGS_FLAG in line) is names_timings_flag, line


def test_without_the_flag_one_hint_line_and_no_request() -> None:
    with FakeVllm(completion=Answer.fixture("completion_nonstream.json")) as api:
        result = run_check(api.url + "/metrics")
    assert result.returncode == 0, result.stdout
    expected = hint("vllm-v1")
    assert expected is not None
    assert [line for line in result.stdout.splitlines() if "per-request" in line.lower()] == [expected]
    assert SPEC_FLAG in expected and TIMINGS_FLAG in expected and "--send-test-completion" in expected
    assert api.posts == [], "check sent a completion without --send-test-completion"


# ---- against real vLLM 0.32.0 responses ---------------------------------------------------------------------------


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    delay: float = 0.0
    drop_connection: bool = False

    @classmethod
    def fixture(cls, name: str, status: int = 200) -> Answer:
        return cls(status, (REAL / name).read_bytes())


@dataclass
class FakeVllm:
    """vLLM's /metrics (a real 0.32.0 scrape, model `tiny`), /v1/models and a scripted /v1/completions."""

    completion: Answer
    models: Answer = field(default_factory=lambda: Answer(body=b'{"object":"list","data":[{"id":"tiny"}]}'))
    posts: list[Any] = field(default_factory=list)
    url: str = ""

    def __enter__(self) -> FakeVllm:
        fake = self
        metrics = (REAL / "metrics_ngram_per_request.prom").read_bytes()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self, answer: Answer) -> None:
                time.sleep(answer.delay)
                if answer.drop_connection:
                    self.close_connection = True
                    return
                self.send_response(answer.status)
                self.send_header("content-type", answer.content_type)
                self.send_header("content-length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self.answer(Answer(body=metrics, content_type="text/plain; version=0.0.4"))
                else:
                    self.answer(fake.models if self.path == "/v1/models" else Answer(404, b"{}"))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                fake.posts.append(json.loads(body))
                self.answer(fake.completion if self.path == "/v1/completions" else Answer(404, b"{}"))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("completion_nonstream.json", f"{PREFIX} on ("),  # server A: both flags
        ("completion_nonstream_spec_only.json", f"{PREFIX} on, without timings"),  # server C: spec flag only
        ("completion_nonstream_nospec.json", f"{PREFIX} timings only"),  # speculative_decoding null
    ],
)
def test_real_vllm_responses_are_read_right(fixture: str, expected: str) -> None:
    with FakeVllm(completion=Answer.fixture(fixture)) as api:
        result = run_check(api.url + "/metrics", "--send-test-completion")
    assert result.returncode == 0, result.stdout
    [line] = per_request_lines(result)
    assert line.startswith(expected), line
    # One tiny, non-streamed completion to the model /v1/models named.
    [sent] = api.posts
    assert sent["model"] == "tiny" and sent["max_tokens"] == 1 and not sent.get("stream")


def test_a_response_without_metrics_names_both_flags() -> None:
    """vLLM without either flag: `"metrics": null` (older vLLM: no key at all)."""
    real = json.loads((REAL / "completion_nonstream.json").read_bytes())
    for document in ({**real, "metrics": None}, {k: v for k, v in real.items() if k != "metrics"}):
        with FakeVllm(completion=Answer(body=json.dumps(document).encode())) as api:
            result = run_check(api.url + "/metrics", "--send-test-completion")
        assert result.returncode == 0
        [line] = per_request_lines(result)
        assert line.startswith(f"{PREFIX} off") and SPEC_FLAG in line and TIMINGS_FLAG in line, line


@pytest.mark.parametrize(
    ("completion", "models", "why"),
    [
        (Answer(body=b"<html>502 Bad Gateway</html>", content_type="text/html"), None, "the answer is not JSON"),
        (Answer(body=b"[1, 2]"), None, "not a completion response"),
        (Answer.fixture("error_unknown_model.json", 404), None, "HTTP 404: The model `no-such-model` does not exist"),
        (Answer(503, b"upstream connect error\n  or disconnect", "text/plain"), None,
         "HTTP 503: upstream connect error or disconnect"),
        (Answer(drop_connection=True), None, "RemoteProtocolError"),
        (Answer(body=b"{}", delay=600.0), None, "no answer within 1s"),  # it never answers
        (Answer.fixture("completion_nonstream.json"), Answer(404, b"not found"), "no model to ask"),
    ],
    ids=["not-json", "json-array", "http-404", "http-503-text", "connection-dropped", "timeout", "no-model-list"],
)
def test_a_bad_answer_is_one_line_and_exit_1(completion: Answer, models: Answer | None, why: str) -> None:
    with FakeVllm(completion=completion, **({"models": models} if models else {})) as api:
        result = run_check(api.url + "/metrics", "--send-test-completion", "--timeout", "1s")
    assert result.returncode == 1, result.stdout
    assert per_request_lines(result) == [], "stdout keeps only results"
    [line] = result.stderr.splitlines()  # what went wrong, in one line
    assert line.startswith(f"specdecode-exporter check: {PREFIX} cannot tell: ") and why in line, line
    assert "α" in result.stdout, "the verdict table is printed before the test completion"


def test_unreachable_target_with_the_flag_is_one_line() -> None:
    from devtools.procs import free_port

    url = f"http://127.0.0.1:{free_port()}/metrics"
    result = run_check(url, "--send-test-completion", "--timeout", "1s")
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"specdecode-exporter check: cannot collect {url}: connect"), line


def test_hint_only_for_vllm() -> None:
    v0 = hint("vllm-v0")
    assert v0 is not None and "V0" in v0 and SPEC_FLAG in v0
    for api in ("llamacpp", "sglang", "trtllm", None):
        assert hint(api) is None


def test_help_documents_the_flag() -> None:
    result = subprocess.run([sys.executable, "-m", "specdecode_exporter.cli", "check", "--help"], capture_output=True,
                            text=True, timeout=30, env=child_env())
    text = re.sub(r"-\s+", "-", " ".join(result.stdout.split()))  # argparse wraps lines at hyphens
    assert "--send-test-completion" in text and "1-token completion" in text
    assert SPEC_FLAG in text and TIMINGS_FLAG in text
