"""The ASGI app (FastAPI): /metrics, /healthz, /readyz, /api/v1/status and the landing page; and the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from specdecode_exporter.core.net.httpserver import ConnectionGuard, bind_socket, server_config
from specdecode_exporter.core.process.log import event
from specdecode_exporter.sidecar.collection import Exporter
from specdecode_exporter.sidecar.config import Config, split_listen_address
from specdecode_exporter.sidecar.expose import exporter_version
from specdecode_exporter.sidecar.heap import collect_after_response, tune_gc
from specdecode_exporter.sidecar.metrics_page import MetricsPage
from specdecode_exporter.sidecar.proxy import TapRuntime, tap_runtime
from specdecode_exporter.sidecar.reload import Reloader
from specdecode_exporter.sidecar.status import status_json
from specdecode_exporter.sidecar.status_page import status_html
from specdecode_exporter.sidecar.webconfig import BasicAuthMiddleware, WebSecurity


def _on_sighup(reloader: Reloader | None) -> Callable[[], None]:
    """Reload on SIGHUP while the app runs (main thread only); returns the undo."""
    if reloader is None:
        return lambda: None
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, reloader.reload)
    except (NotImplementedError, RuntimeError, ValueError, AttributeError):  # not the main thread, or no SIGHUP
        return lambda: None
    def undo() -> None:
        loop.remove_signal_handler(signal.SIGHUP)

    return undo


def _lifespan(exporter: Exporter, reloader: Reloader | None, tap: TapRuntime | None,
              run_collection: bool) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """What runs beside the app, started and stopped with it: the tap's process, the collection loops and SIGHUP."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if tap is not None:  # a process of its own: nothing this loop does delays a relayed token
            try:
                await tap.start()
            except RuntimeError as exc:  # before anything else starts: nothing to undo
                event(logging.ERROR, "cannot start the request tap", detail=str(exc))
                app.state.startup_failed = True
                raise
        task = asyncio.create_task(exporter.run(), name="collection") if run_collection else None
        undo_sighup = _on_sighup(reloader)
        try:
            yield
        finally:
            undo_sighup()
            if tap is not None:
                await tap.stop()
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return lifespan


def _reload_endpoint(reloader: Reloader) -> Callable[[], Awaitable[PlainTextResponse]]:
    async def reload() -> PlainTextResponse:  # on the event loop, like the collection loops it changes
        ok, message = reloader.reload()
        return PlainTextResponse(("ok: " if ok else "failed: ") + message + "\n", status_code=200 if ok else 400)

    return reload


def build_app(exporter: Exporter, run_collection: bool = True, reloader: Reloader | None = None,
              security: WebSecurity | None = None, tap: TapRuntime | None = None) -> FastAPI:
    config: Config = exporter.config  # what the listener was built with; a reload changes exporter.config
    page = MetricsPage(exporter.views, reloader, tap)
    if tap is not None:  # after each collection the tap's router hears the break-even it found
        exporter.collected = tap.push_break_evens

    async def current_status() -> dict[str, object]:
        if tap is not None:
            await tap.refresh()
        now = exporter.clock()
        stats = tap.stats() if tap is not None else None
        return status_json(exporter.views(), exporter.ready(), exporter_version(), now - exporter.started_at,
                           exporter.config, now, tap.view() if tap is not None else None,
                           tap.routes() if tap is not None else None,
                           stats.fallback_available if stats is not None else None,
                           tap.variances() if tap is not None else ())

    async def metrics(request: Request) -> Response:
        body, headers = await page.render(request.headers.get("accept", ""),
                                          request.headers.get("accept-encoding", ""))
        return Response(body, headers=headers,
                        background=BackgroundTask(collect_after_response, len(body)))  # once the response is sent

    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    async def readyz() -> PlainTextResponse:
        ready, reason = exporter.ready()
        return PlainTextResponse(("ok" if ready else f"not ready: {reason}") + "\n", status_code=200 if ready else 503)

    async def status() -> JSONResponse:
        return JSONResponse(await current_status())

    async def landing() -> HTMLResponse:
        return HTMLResponse(status_html(await current_status(), config.web.telemetry_path))

    # No API documentation (docs_url, redoc_url, openapi_url): nothing to document, and no page of the sidecar
    # that serves a script from a CDN. /metrics/ is not /metrics (redirect_slashes): the redirect to the slashless
    # path builds its Location from the client's Host header, which lets a request name any host to be sent to.
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False,
                  lifespan=_lifespan(exporter, reloader, tap, run_collection))
    app.add_exception_handler(HTTPException, _plain_error)
    for path, endpoint in ((config.web.telemetry_path, metrics), ("/healthz", healthz), ("/readyz", readyz),
                           ("/api/v1/status", status), ("/", landing)):
        app.add_api_route(path, endpoint, methods=["GET", "HEAD"])
    if reloader is not None:
        app.add_api_route("/-/reload", _reload_endpoint(reloader), methods=["POST"])
    if security is not None and security.users:
        app.add_middleware(BasicAuthMiddleware, security=security)
    app.state.startup_failed = False
    return app


async def _plain_error(_: Request, exc: Exception) -> PlainTextResponse:
    """A 404 or 405 in plain text ("Not Found"), as the sidecar has always answered, not FastAPI's JSON."""
    assert isinstance(exc, HTTPException)
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)


def serve(config: Config, load: Callable[[], Config] | None = None, security: WebSecurity | None = None) -> int:
    """Run the sidecar until SIGTERM/SIGINT; SIGHUP or POST /-/reload calls ``load`` again. Returns the exit code."""
    exporter = Exporter(config)
    reloader = Reloader(exporter, load or (lambda: config), security)
    host, port = split_listen_address(config.web.listen_address)
    try:
        tap = tap_runtime(config, exporter.views, lambda: exporter.config)
    except OSError as exc:
        event(logging.ERROR, "cannot listen", listen_address=config.tap.listen_address if config.tap else "",
              detail=exc.strerror or str(exc), what="request tap",
              change_with="--tap.listen-address (tap.listen_address in the config file)")
        return 1
    # uvloop where installed (the tap's relay is a few µs a chunk cheaper on it), else asyncio's own loop.
    # The TLS context is ours, so that a reload can swap the certificate in place.
    context = security.ssl_context if security is not None else None
    app = build_app(exporter, reloader=reloader, security=security, tap=tap)
    server = uvicorn.Server(server_config(
        app, ConnectionGuard(), host=host, port=port, timeout_graceful_shutdown=5, lifespan="on", loop="auto",
        ssl_context_factory=(lambda _config, _default: context) if context else None))
    event(logging.INFO, "starting", version=exporter_version(), listen_address=config.web.listen_address,
          telemetry_path=config.web.telemetry_path, targets=",".join(t.url for t in config.targets),
          interval=f"{config.collect.interval:g}s", windows=",".join(w.name for w in config.windows),
          tls=security is not None and security.ssl_context is not None,
          basic_auth=security is not None and bool(security.users),
          request_tap=f"{config.tap.listen_address} -> {config.tap.upstream}" if config.tap else "off",
          routing=f"{route.mode} -> {route.fallback_upstream}" if (route := config.tap and config.tap.route)
          else "off")
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        event(logging.ERROR, "cannot listen", listen_address=config.web.listen_address, detail=exc.strerror or str(exc),
              change_with="--web.listen-address (web.listen_address in the config file)")
        return 1
    # uvicorn handles SIGTERM and SIGINT while it serves, and re-raises the signal once it has shut down, with the
    # handler found before it started: with this one a SIGTERM means "stop" (also one before uvicorn's handler is
    # in place: the server then stops as soon as it has started) and the process exits 0.
    def stop(_signum: int, _frame: object) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    tune_gc()
    server.run(sockets=[sock])
    if app.state.startup_failed:
        return 1
    event(logging.INFO, "stopped")
    return 0
