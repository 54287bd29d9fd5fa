"""``--web.config.file``: TLS and basic auth for the sidecar's own endpoints, in the format of Prometheus'
exporter-toolkit (https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md)::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file, as in exporter-toolkit
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # optional
      min_version: TLS12                             # optional (default TLS12), max_version too
    basic_auth_users:
      prometheus: $2b$12$...         # bcrypt hash, e.g. from `htpasswd -nBC 12 "" | tr -d ':\\n'`

Basic auth protects every endpoint except ``/healthz`` and ``/readyz``: kubelet probes cannot send
credentials, and those two return only "ok"/"not ready" (no metric values, no target URLs). Keys of the
toolkit format that this implementation cannot honour are rejected at start rather than silently ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
from pydantic import BeforeValidator, Field

from specdecode_exporter.core.config.validation import (
    Choice,
    ConfigError,
    Context,
    Section,
    Text,
    fail,
    read_yaml,
    show,
    validate,
)
from specdecode_exporter.core.process.log import event

UNPROTECTED_PATHS = frozenset({"/healthz", "/readyz"})
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
# Accepted by exporter-toolkit, but Python's ssl module cannot ask for a client certificate without
# verifying it, so these would silently mean something else: refuse them.
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
BCRYPT_MAX_BYTES = 72  # what bcrypt reads of a password
_CACHE_LIMIT = 1024
# Threads that uncached bcrypt checks may take at once: a flood of wrong passwords queues behind these
# instead of taking all of anyio's 40 shared worker threads (which the rest of the sidecar needs too).
BCRYPT_THREADS = max(2, min(4, os.cpu_count() or 1))


def _client_auth(value: object) -> object:
    if value in UNSUPPORTED_CLIENT_AUTH:
        raise fail(f"{value} is not supported (Python's TLS cannot accept an unverified client certificate); use "
                   "VerifyClientCertIfGiven or RequireAndVerifyClientCert")
    return value


TLSVersion = Annotated[str, Choice(*TLS_VERSIONS)]


@dataclass(frozen=True, slots=True)
class TLSServerConfig(Section):
    """``tls_server_config``; relative paths are relative to the web config file, as in exporter-toolkit."""

    UNSUPPORTED = frozenset({"cert", "key", "client_ca", "cipher_suites", "curve_preferences",
                             "prefer_server_cipher_suites", "client_allowed_sans"})
    cert_file: Text
    key_file: Text
    client_auth_type: Annotated[str, Choice(*CLIENT_AUTH), BeforeValidator(_client_auth)] = "NoClientCert"
    client_ca_file: Text | None = None
    min_version: TLSVersion = "TLS12"
    max_version: TLSVersion | None = None

    def cross_check(self, context: Context) -> TLSServerConfig:
        if self.client_auth_type != "NoClientCert" and self.client_ca_file is None:
            raise fail(f"required with client_auth_type {self.client_auth_type}", "client_ca_file")
        base = context.get("base", Path())
        resolved = replace(self, cert_file=str(base / self.cert_file), key_file=str(base / self.key_file),
                           client_ca_file=None if self.client_ca_file is None else str(base / self.client_ca_file))
        try:
            resolved.ssl_context()
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise fail(f"cannot load the certificate or key: {getattr(exc, 'strerror', None) or exc}") from None
        return resolved

    def ssl_context(self) -> ssl.SSLContext:
        """Raises OSError / ssl.SSLError on bad files."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = TLS_VERSIONS[self.min_version]
        if self.max_version:
            context.maximum_version = TLS_VERSIONS[self.max_version]
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
        context.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return context


def _users(value: object) -> dict[str, bytes]:
    """basic_auth_users: user → bcrypt hash (checked here, so a bad hash fails at start, not at the first login)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise fail(f"expected a mapping of user name to bcrypt hash, got {show(value)}")
    users: dict[str, bytes] = {}
    for user, hashed in value.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise fail(f"user names are non-empty strings without ':', got {user!r}")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise fail("expected a bcrypt hash ($2a$, $2b$ or $2y$); plain-text passwords are not accepted", user)
        import bcrypt  # only where basic auth is configured: its extension is 0.7 MB of every sidecar's RSS

        try:
            bcrypt.checkpw(b"", hashed.encode())
        except ValueError:
            raise fail("not a valid bcrypt hash", user) from None
        users[user] = hashed.encode()
    return users


@dataclass(frozen=True, slots=True)
class WebConfig(Section):
    """The web config file: its keys are ``tls_server_config`` and ``basic_auth_users``."""

    UNSUPPORTED = frozenset({"http_server_config", "rate_limit"})
    NULL_IS_EMPTY = True
    path: str = field(default="", metadata={"key": False})
    tls: Annotated[TLSServerConfig | None, Field(alias="tls_server_config"),
                   BeforeValidator(lambda v: None if v == {} else v)] = None
    users: Annotated[Mapping[str, bytes], Field(alias="basic_auth_users"), BeforeValidator(_users)] = field(
        default_factory=dict)


def load_web_config(path: str) -> WebConfig:
    """Read and validate the web config (certificates loaded, hashes checked); one ConfigError line if bad."""
    data = read_yaml(path, "web config file")
    config: WebConfig = validate(WebConfig, data, path, context={"base": Path(path).resolve().parent})
    return replace(config, path=path)


class WebSecurity:
    """The live web config: the TLS context handed to uvicorn and the users that basic auth checks.

    ``reload()`` re-reads the file: new users apply at once; a new certificate and key are loaded into the
    same SSL context and apply to new connections. Turning TLS on or off needs a restart (the listener
    is already open)."""

    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self.ssl_context = config.tls.ssl_context() if config.tls else None
        self._cache: dict[bytes, bool] = {}
        self._lock = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None  # made on the event loop (older anyio needs one)
        self._pending: dict[bytes, _Pending] = {}  # event loop only; keyed like the cache, no plain passwords

    @property
    def users(self) -> Mapping[str, bytes]:
        return self.config.users

    def reload(self) -> list[str]:
        """Raises ConfigError (and changes nothing) when the file is bad; returns notes."""
        new = load_web_config(self.config.path)
        notes: list[str] = []
        if (new.tls is None) != (self.config.tls is None):
            raise ConfigError(f"{new.path}: turning TLS on or off needs a restart")
        if new.tls is not None and self.ssl_context is not None:
            if (new.tls.client_auth_type, new.tls.client_ca_file, new.tls.min_version, new.tls.max_version) != (
                    self.config.tls.client_auth_type, self.config.tls.client_ca_file,  # type: ignore[union-attr]
                    self.config.tls.min_version, self.config.tls.max_version):  # type: ignore[union-attr]
                raise ConfigError(f"{new.path}: changing client_auth_type, client_ca_file or TLS versions needs a "
                                  "restart; only cert_file/key_file and basic_auth_users reload")
            self.ssl_context.load_cert_chain(new.tls.cert_file, new.tls.key_file)
            notes.append("web TLS certificate reloaded")
        with self._lock:
            self.config = new
            self._cache.clear()
        return notes

    def _key(self, user: str, password: str) -> bytes:
        hashed = self.users.get(user)
        return hashlib.sha256(b"%s\0%s\0%s" % (user.encode(), password.encode(), hashed or b"")).digest()

    def _cached(self, key: bytes) -> bool | None:
        with self._lock:
            return self._cache.get(key)

    def check(self, user: str, password: str) -> bool:
        """bcrypt.checkpw (constant time in the password) with a cache of results, as exporter-toolkit does:
        bcrypt costs tens of milliseconds per check, and Prometheus sends the same credentials every scrape."""
        hashed = self.users.get(user)
        key = self._key(user, password)
        cached = self._cached(key)
        if cached is not None:
            return cached
        # An unknown user is checked against some user's hash anyway, so that a wrong user name costs as much
        # time as a wrong password (no user enumeration by timing).
        reference = hashed or next(iter(self.users.values()))
        import bcrypt  # imported by _users already, when the config named users

        # bcrypt reads 72 bytes of a password; bcrypt 5 raises on more (a 500 for any client sending a long one)
        # where htpasswd and older libraries, whose hashes these are, read the first 72.
        ok = bcrypt.checkpw(password.encode()[:BCRYPT_MAX_BYTES], reference) and hashed is not None
        with self._lock:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()  # a flood of wrong passwords cannot grow memory
            self._cache[key] = ok
        return ok

    async def check_async(self, user: str, password: str) -> bool:
        """``check`` for the event loop: a cached result is answered here, without a thread (so scrapes with
        cached credentials never queue behind bcrypt); an uncached one runs on one of BCRYPT_THREADS, and
        concurrent first checks of the same credentials share that one run."""
        key = self._key(user, password)
        while True:
            cached = self._cached(key)
            if cached is not None:
                return cached
            pending = self._pending.get(key)
            if pending is None:
                break
            await pending.done.wait()
            if pending.result is not None:
                return pending.result
            # The run we waited on failed or was cancelled: look again (cache, or run it ourselves).
        pending = self._pending[key] = _Pending()
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(BCRYPT_THREADS)
        try:
            pending.result = await anyio.to_thread.run_sync(self.check, user, password, limiter=self._limiter)
            return pending.result
        finally:
            del self._pending[key]
            pending.done.set()


@dataclass(slots=True)
class _Pending:
    """One bcrypt check in flight, which later identical checks wait for."""

    done: anyio.Event = field(default_factory=anyio.Event)
    result: bool | None = None

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def parse_basic(header: bytes) -> tuple[str, str] | None:
    scheme, _, encoded = header.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


class BasicAuthMiddleware:
    """ASGI middleware: 401 with a Basic challenge unless the request carries valid credentials."""

    def __init__(self, app: ASGIApp, security: WebSecurity) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.security.users or scope.get("path") in UNPROTECTED_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        credentials = parse_basic(header)
        if credentials is not None:
            # bcrypt is slow: check_async runs it on a worker thread so the event loop (and the collections)
            # keep running; cached credentials are answered without one.
            if await self.security.check_async(*credentials):
                await self.app(scope, receive, send)
                return
            event(logging.INFO, "basic auth failed", user=credentials[0][:64], client=_client(scope))
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"www-authenticate", b'Basic realm="specdecode-exporter"')]})
        await send({"type": "http.response.body", "body": b"Unauthorized\n"})


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown"
