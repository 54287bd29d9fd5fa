"""Security: no SSRF, basic auth and TLS on the sidecar's endpoints (exporter-toolkit web config), bearer
token and TLS settings for reaching vLLM, secrets never logged."""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest

from specdecode_exporter.core.config.validation import ConfigError
from specdecode_exporter.core.net.httpserver import ThreadedServer, bind_socket
from specdecode_exporter.sidecar.collection import Exporter, TargetView, new_client
from specdecode_exporter.sidecar.config import (
    CollectSection,
    Config,
    TargetConfig,
    TLSConfig,
    config_from_mapping,
    parse_windows,
)
from specdecode_exporter.sidecar.web import build_app
from specdecode_exporter.sidecar.webconfig import (
    BCRYPT_THREADS,
    BasicAuthMiddleware,
    WebSecurity,
    load_web_config,
    parse_basic,
)
from tests.faults.certs import Certs
from tests.faults.conftest import PASSWORD, write
from tests.faults.hostile import HostileServer, scripted, serve, v1_body

TOKEN = "tok-7f3a9c1e5b"


def collect(target: TargetConfig) -> TargetView:
    exporter = Exporter(Config(targets=(target,), windows=parse_windows("1m", "windows")))

    async def once() -> TargetView:
        collector = exporter.collectors[target.name]
        async with new_client(target) as client:
            return await collector.collect(client)

    return asyncio.run(once())


@pytest.fixture
def good_server() -> Iterator[HostileServer]:
    server = serve(scripted(lambda: v1_body(300, 200)))
    yield server
    server.stop()


# ---------- no way to make the sidecar fetch a URL that is not in its config ----------

def test_no_route_or_parameter_steers_collection(good_server: HostileServer) -> None:
    bait = serve(scripted(lambda: v1_body(1, 1)))
    try:
        config = Config(targets=(TargetConfig("vllm", good_server.url, timeout=1.0),),
                        windows=parse_windows("1m", "windows"), collect=CollectSection(interval=0.1))
        exporter = Exporter(config)
        app = build_app(exporter, run_collection=True)
        routes = sorted(getattr(r, "path", "") for r in app.routes)
        assert routes == ["/", "/api/v1/status", "/healthz", "/metrics", "/readyz"]
        with ThreadedServer(app, bind_socket(), name="sidecar").start() as sidecar:
            for path in [*routes, "/probe", "/scrape", "/federate"]:
                for params in ({"target": bait.url}, {"url": bait.url}, {"module": bait.url}):
                    httpx.get(sidecar.base_url + path, params=params, timeout=5)
                    httpx.post(sidecar.base_url + path, params=params, timeout=5)
            time.sleep(0.3)
        assert bait.requests == []
        assert len(good_server.requests) >= 2
    finally:
        bait.stop()


@pytest.mark.parametrize("url", ["http://user:pw@127.0.0.1:8000/metrics", "http://:pw@127.0.0.1:8000/metrics",
                                 "file:///etc/passwd", "gopher://127.0.0.1/", "http://[::1/metrics"])
def test_target_urls_are_http_without_credentials(url: str) -> None:
    with pytest.raises(ConfigError, match=r"targets\[0\]\.url"):
        config_from_mapping({"targets": [{"url": url}]}, "test")


# ---------- bearer token and TLS for reaching vLLM ----------

def test_bearer_token_is_sent_reread_and_never_logged(tmp_path: Path, good_server: HostileServer,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    token_file = write(tmp_path / "token", TOKEN + "\n")
    target = TargetConfig("vllm", good_server.url, timeout=1.0, bearer_token_file=str(token_file))
    caplog.set_level(logging.DEBUG)
    assert collect(target).up is True
    assert f"Authorization: Bearer {TOKEN}".encode() in good_server.requests[-1]
    write(token_file, "rotated-token\n")
    assert collect(target).up is True
    assert b"Authorization: Bearer rotated-token" in good_server.requests[-1]
    # Broken token files: a header-injection attempt and a missing file fail cleanly, without echoing the token.
    write(token_file, f"{TOKEN}\r\nX-Injected: 1")
    view = collect(target)
    assert view.up is False and view.last_error is not None and view.last_error.startswith("connect")
    token_file.unlink()
    assert collect(target).up is False
    assert all(b"X-Injected" not in line for request in good_server.requests for line in request)
    logged = "\n".join(f"{r.getMessage()} {getattr(r, 'fields', {})}" for r in caplog.records)
    assert "collection failed" in logged
    assert TOKEN not in logged and "rotated-token" not in logged
    assert TOKEN not in repr(view)


@pytest.fixture(scope="module")
def tls_server(certs: Certs) -> Iterator[HostileServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    server = serve(scripted(lambda: v1_body(300, 200)), ssl=context)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mtls_server(certs: Certs) -> Iterator[HostileServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca))
    context.load_cert_chain(certs.server_cert, certs.server_key)
    context.verify_mode = ssl.CERT_REQUIRED
    server = serve(scripted(lambda: v1_body(300, 200)), ssl=context)
    yield server
    server.stop()


def test_tls_to_vllm_verifies_against_the_configured_ca(certs: Certs, tls_server: HostileServer) -> None:
    assert collect(TargetConfig("vllm", tls_server.url, tls=TLSConfig(ca_file=str(certs.ca)))).up is True
    wrong = collect(TargetConfig("vllm", tls_server.url, tls=TLSConfig(ca_file=str(certs.other_ca))))
    assert wrong.up is False and (wrong.last_error or "").startswith("connect")
    assert collect(TargetConfig("vllm", tls_server.url)).up is False  # system CAs do not know our CA
    skip = TLSConfig(insecure_skip_verify=True)
    assert collect(TargetConfig("vllm", tls_server.url, tls=skip)).up is True


def test_tls_server_name_is_what_gets_verified(certs: Certs, tls_server: HostileServer) -> None:
    url = tls_server.url.replace("127.0.0.1", "localhost")
    named = TLSConfig(ca_file=str(certs.ca), server_name="vllm.internal")
    assert collect(TargetConfig("vllm", url, tls=named)).up is True
    wrong = TLSConfig(ca_file=str(certs.ca), server_name="not-in-the-cert.example")
    assert collect(TargetConfig("vllm", url, tls=wrong)).up is False


def test_tls_client_certificate_for_mtls_vllm(certs: Certs, mtls_server: HostileServer) -> None:
    with_cert = TLSConfig(ca_file=str(certs.ca), cert_file=str(certs.client_cert), key_file=str(certs.client_key))
    assert collect(TargetConfig("vllm", mtls_server.url, tls=with_cert)).up is True
    assert collect(TargetConfig("vllm", mtls_server.url, tls=TLSConfig(ca_file=str(certs.ca)))).up is False


def test_tls_files_gone_since_the_load_make_the_target_down_with_the_reason(certs: Certs, tmp_path: Path) -> None:
    """The collection loop builds its client from the files; when they went away it publishes a down view with
    the reason, every interval, instead of crashing or staying silent."""
    ca = tmp_path / "ca.crt"
    ca.write_bytes(certs.ca.read_bytes())
    target = TargetConfig("vllm", "https://127.0.0.1:1/metrics", tls=TLSConfig(ca_file=str(ca)))
    exporter = Exporter(Config(targets=(target,), windows=parse_windows("1m", "w")))
    ca.unlink()

    async def first_view() -> TargetView:
        running = asyncio.create_task(exporter.run())
        try:
            while (view := exporter.collectors["vllm"].view) is None:
                await asyncio.sleep(0.01)
            return view
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

    view = asyncio.run(asyncio.wait_for(first_view(), 30))
    assert view.up is False and (view.last_error or "").startswith("connect: tls_config: ")
    assert dict(view.errors)["connect"] == 1
    assert exporter.views() == [view] and exporter.ready()[0] is False


def test_tls_config_is_validated_at_load(certs: Certs, tmp_path: Path) -> None:
    def load(tls: dict[str, object]) -> Config:
        return config_from_mapping({"targets": [{"url": "https://127.0.0.1/metrics", "tls_config": tls}]}, "t")

    assert load({"ca_file": str(certs.ca)}).targets[0].tls == TLSConfig(ca_file=str(certs.ca))
    for bad, message in [({"ca_file": str(tmp_path / "nope.crt")}, "cannot load"),
                         ({"cert_file": str(certs.client_cert)}, "go together"),
                         ({"cert_file": str(certs.client_key), "key_file": str(certs.client_key)}, "cannot load"),
                         ({"insecure_skip_verify": "yes"}, "true or false"),
                         ({"ca": "x"}, "unknown key")]:
        with pytest.raises(ConfigError, match=message):
            load(bad)


# ---------- the sidecar's own endpoints: exporter-toolkit web config ----------

def web_config(tmp_path: Path, text: str) -> WebSecurity:
    return WebSecurity(load_web_config(str(write(tmp_path / "web.yml", text))))


@pytest.fixture
def secured_sidecar(tmp_path: Path, password_hash: str, good_server: HostileServer) -> Iterator[str]:
    security = web_config(tmp_path, f"basic_auth_users:\n  prometheus: {password_hash}\n")
    exporter = Exporter(Config(targets=(TargetConfig("vllm", good_server.url),), windows=parse_windows("1m", "w")))
    from specdecode_exporter.sidecar.reload import Reloader

    app = build_app(exporter, run_collection=False, reloader=Reloader(exporter, lambda: exporter.config),
                    security=security)
    with ThreadedServer(app, bind_socket(), name="sidecar").start() as server:
        yield server.base_url


@pytest.mark.parametrize(("method", "path"), [("GET", "/metrics"), ("GET", "/"), ("GET", "/api/v1/status"),
                                              ("POST", "/-/reload"), ("GET", "/nope")])
def test_basic_auth_protects_every_endpoint_but_the_probes(secured_sidecar: str, method: str, path: str) -> None:
    url = secured_sidecar + path
    anonymous = httpx.request(method, url, timeout=5)
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Basic ")
    assert httpx.request(method, url, auth=("prometheus", "wrong"), timeout=5).status_code == 401
    assert httpx.request(method, url, auth=("nobody", PASSWORD), timeout=5).status_code == 401
    assert httpx.request(method, url, headers={"Authorization": "Basic !!notbase64"}, timeout=5).status_code == 401
    authorised = httpx.request(method, url, auth=("prometheus", PASSWORD), timeout=5)
    assert authorised.status_code == (404 if path == "/nope" else 200)


def test_probes_need_no_credentials(secured_sidecar: str) -> None:
    assert httpx.get(secured_sidecar + "/healthz", timeout=5).status_code == 200
    assert httpx.get(secured_sidecar + "/readyz", timeout=5).status_code == 503  # no collection yet; not 401


def test_a_password_over_72_bytes_is_checked_not_a_500(tmp_path: Path, good_server: HostileServer) -> None:
    """bcrypt reads a password's first 72 bytes (htpasswd's hashes are made so); bcrypt 5 raises on more, which
    answered any client sending a long password with a 500 and an error line."""
    long_password = "p" * 72
    password_hash = bcrypt.hashpw(long_password.encode(), bcrypt.gensalt(rounds=4)).decode()
    security = web_config(tmp_path, f"basic_auth_users:\n  prometheus: '{password_hash}'\n")
    exporter = Exporter(Config(targets=(TargetConfig("vllm", good_server.url),), windows=parse_windows("1m", "w")))
    app = build_app(exporter, run_collection=False, security=security)
    with ThreadedServer(app, bind_socket(), name="sidecar").start() as server:
        url = server.base_url + "/metrics"
        assert httpx.get(url, auth=("prometheus", long_password + "extra"), timeout=5).status_code == 200
        assert httpx.get(url, auth=("prometheus", "q" * 100), timeout=5).status_code == 401
        assert httpx.get(url, auth=("nobody", "q" * 100), timeout=5).status_code == 401


def test_bcrypt_results_are_cached(tmp_path: Path) -> None:
    slow_hash = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=10)).decode()
    security = web_config(tmp_path, f"basic_auth_users:\n  u: '{slow_hash}'\n")
    started = time.perf_counter()
    assert security.check("u", "pw")
    first = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(100):
        assert security.check("u", "pw")
        assert not security.check("u", "other")
    repeated = (time.perf_counter() - started) / 200
    assert repeated < first / 20, (first, repeated)
    assert not security.check("unknown-user", "pw")


def _bcrypt_spy(monkeypatch: pytest.MonkeyPatch, block: threading.Event | None = None,
                blocked_password: bytes = b"") -> list[bytes]:
    """Record each bcrypt.checkpw password; a check of a password starting with blocked_password waits for block."""
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def checkpw(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        if block is not None and blocked_password and password.startswith(blocked_password):
            block.wait(60)
        else:
            time.sleep(0.3)  # long enough that concurrent first checks overlap
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", checkpw)
    return calls


async def _request(security: WebSecurity, user: str, password: str) -> int:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    header = b"Basic " + base64.b64encode(f"{user}:{password}".encode())
    scope = {"type": "http", "path": "/metrics", "headers": [(b"authorization", header)], "client": ("t", 1)}
    await BasicAuthMiddleware(app, security)(scope, None, send)  # type: ignore[arg-type]
    status: int = sent[0]["status"]
    return status


def test_concurrent_first_logins_share_one_bcrypt_run(tmp_path: Path, password_hash: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    security = web_config(tmp_path, f"basic_auth_users:\n  prometheus: {password_hash}\n")
    calls = _bcrypt_spy(monkeypatch)

    async def main() -> tuple[list[int], list[int]]:
        good = await asyncio.gather(*(_request(security, "prometheus", PASSWORD) for _ in range(8)))
        bad = await asyncio.gather(*(_request(security, "prometheus", "wrong") for _ in range(8)))
        for _ in range(8):  # sequential repeats are cache hits
            good.append(await _request(security, "prometheus", PASSWORD))
            bad.append(await _request(security, "prometheus", "wrong"))
        return list(good), list(bad)

    good, bad = asyncio.run(main())
    assert good == [200] * 16
    assert bad == [401] * 16  # a shared or cached wrong password is never let in
    assert calls == [PASSWORD.encode(), b"wrong"]


def test_cached_credentials_do_not_wait_behind_a_bcrypt_flood(tmp_path: Path, password_hash: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """50 clients with unique wrong passwords hold bcrypt; Prometheus's cached credentials still get in at once."""
    security = web_config(tmp_path, f"basic_auth_users:\n  prometheus: {password_hash}\n")
    release = threading.Event()
    calls = _bcrypt_spy(monkeypatch, release, b"flood-")

    async def main() -> None:
        assert await _request(security, "prometheus", PASSWORD) == 200  # first login: bcrypt, then cached
        flood = [asyncio.ensure_future(_request(security, "prometheus", f"flood-{i}")) for i in range(50)]
        try:
            while sum(c.startswith(b"flood-") for c in calls) < 2:  # the flood now holds bcrypt threads
                await asyncio.sleep(0.01)
            for _ in range(5):
                # Old code: every worker thread is blocked in bcrypt, so this waits for `release` (timeout).
                assert await asyncio.wait_for(_request(security, "prometheus", PASSWORD), 20) == 200
            assert not release.is_set() and not any(task.done() for task in flood)
            # The flood took only the bcrypt limiter's threads, not anyio's whole pool of 40.
            assert sum(c.startswith(b"flood-") for c in calls) <= BCRYPT_THREADS
        finally:
            release.set()
        assert await asyncio.gather(*flood) == [401] * 50

    asyncio.run(main())
    assert calls.count(PASSWORD.encode()) == 1


def test_parse_basic_header() -> None:
    assert parse_basic(b"Basic dTpwOnc=") == ("u", "p:w")
    assert parse_basic(b"Bearer x") is None
    assert parse_basic(b"Basic dXNlcg==") is None  # no colon


@pytest.mark.parametrize(
    ("text", "message"),
    [("basic_auth_users:\n  u: plaintext\n", "bcrypt hash"),
     ("basic_auth_users:\n  u: $2b$12$tooshort\n", "not a valid bcrypt hash"),
     ("basic_auth_user:\n  u: x\n", "unknown key .*did you mean 'basic_auth_users'"),
     ("tls_server_config:\n  cert_file: server.crt\n", r"web\.yml: tls_server_config\.key_file: required$"),
     ("tls_server_config:\n  cert_file: a\n  key_fil: b\n",
      r"tls_server_config\.key_fil: unknown key \(did you mean 'key_file'\?\)$"),
     ("tls_server_config:\n  cert_file: 3\n  key_file: b\n",
      r"tls_server_config\.cert_file: expected a non-empty string, got 3$"),
     ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n",
      r"tls_server_config\.cipher_suites: not supported by specdecode-exporter; remove it$"),
     ("basic_auth_users: [u]\n", r"basic_auth_users: expected a mapping of user name to bcrypt hash, got \['u'\]$"),
     ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "cannot load"),
     ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
      "not supported"),
     ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
      "client_ca_file: required"),
     ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS9\n",
      r"tls_server_config\.min_version: expected one of TLS10, TLS11, TLS12, TLS13, got 'TLS9'$"),
     ("http_server_config:\n  http2: true\n", "not supported"),
     ("tls_server_config: [\n", "invalid YAML")],
)
def test_bad_web_config_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        load_web_config(str(write(tmp_path / "web.yml", text)))
    assert "\n" not in str(error.value)
    assert str(error.value).startswith(str(tmp_path / "web.yml"))


def test_web_config_paths_are_relative_to_the_file(certs: Certs) -> None:
    config = load_web_config(str(write(certs.ca.parent / "web.yml",
                                       "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")))
    assert config.tls is not None and config.tls.cert_file == str(certs.server_cert)
