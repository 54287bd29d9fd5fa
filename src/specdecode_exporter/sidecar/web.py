"""The ASGI app (Starlette): /metrics, /healthz, /readyz, /api/v1/status and the landing page; and the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from specdecode_exporter.core.httpserver import IDLE_KEEP_ALIVE, QuietServer, bind_socket
from specdecode_exporter.core.log import event
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
              run_collection: bool) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """What runs beside the app, started and stopped with it: the tap's process, the collection loops and SIGHUP."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
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


def _reload_endpoint(reloader: Reloader) -> Callable[[Request], Awaitable[PlainTextResponse]]:
    async def reload(_: Request) -> PlainTextResponse:  # on the event loop, like the collection loops it changes
        ok, message = reloader.reload()
        return PlainTextResponse(("ok: " if ok else "failed: ") + message + "\n", status_code=200 if ok else 400)

    return reload


def build_app(exporter: Exporter, run_collection: bool = True, reloader: Reloader | None = None,
              security: WebSecurity | None = None, tap: TapRuntime | None = None) -> Starlette:
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

    async def healthz(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    async def readyz(_: Request) -> PlainTextResponse:
        ready, reason = exporter.ready()
        return PlainTextResponse(("ok" if ready else f"not ready: {reason}") + "\n", status_code=200 if ready else 503)

    async def status(_: Request) -> JSONResponse:
        return JSONResponse(await current_status())

    async def landing(_: Request) -> HTMLResponse:
        return HTMLResponse(status_html(await current_status(), config.web.telemetry_path))

    routes = [Route(config.web.telemetry_path, metrics), Route("/healthz", healthz), Route("/readyz", readyz),
              Route("/api/v1/status", status), Route("/", landing)]
    if reloader is not None:
        routes.append(Route("/-/reload", _reload_endpoint(reloader), methods=["POST"]))
    middleware = ([Middleware(BasicAuthMiddleware, security=security)] if security is not None and security.users
                  else [])
    app = Starlette(routes=routes, middleware=middleware,
                    lifespan=_lifespan(exporter, reloader, tap, run_collection))
    app.state.startup_failed = False
    # /metrics/ is not /metrics: Starlette's redirect to the slashless path builds its Location from the client's
    # Host header, which lets a request name any host to be sent to.
    app.router.redirect_slashes = False
    return app


def serve(config: Config, load: Callable[[], Config] | None = None, security: WebSecurity | None = None) -> int:
    """Run the sidecar until SIGTERM/SIGINT; SIGHUP or POST /-/reload calls ``load`` again. Returns the exit code."""
    exporter = Exporter(config)
    reloader = Reloader(exporter, load or (lambda: config), security)
    host, port = split_listen_address(config.web.listen_address)
    try:
        tap = tap_runtime(config, exporter.views, lambda: exporter.config)
    except OSError as exc:
        event(logging.ERROR, "cannot listen", listen_address=config.proxy.listen_address if config.proxy else "",
              detail=exc.strerror or str(exc), what="request tap",
              change_with="--proxy.listen-address (proxy.listen_address in the config file)")
        return 1
    # uvloop where installed (the tap's relay is a few µs a chunk cheaper on it), else asyncio's own loop.
    # The TLS context is ours, so that a reload can swap the certificate in place.
    context = security.ssl_context if security is not None else None
    app = build_app(exporter, reloader=reloader, security=security, tap=tap)
    uv_config = uvicorn.Config(app, host=host,
                               port=port, log_config=None, access_log=False, timeout_graceful_shutdown=5,
                               lifespan="on", loop="auto", timeout_keep_alive=IDLE_KEEP_ALIVE,
                               ssl_context_factory=(lambda _config, _default: context) if context else None)
    server = QuietServer(uv_config)
    event(logging.INFO, "starting", version=exporter_version(), listen_address=config.web.listen_address,
          telemetry_path=config.web.telemetry_path, targets=",".join(t.url for t in config.targets),
          interval=f"{config.collect.interval:g}s", windows=",".join(w.name for w in config.windows),
          tls=security is not None and security.ssl_context is not None,
          basic_auth=security is not None and bool(security.users),
          request_tap=f"{config.proxy.listen_address} -> {config.proxy.upstream}" if config.proxy else "off",
          routing=f"{route.mode} -> {route.fallback_upstream}" if (route := config.proxy and config.proxy.route)
          else "off")
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        event(logging.ERROR, "cannot listen", listen_address=config.web.listen_address, detail=exc.strerror or str(exc),
              change_with="--web.listen-address (web.listen_address in the config file)")
        return 1
    # uvicorn re-raises a captured SIGTERM once it has shut down gracefully, with the handler found before it
    # started: with this one that means "stop" (also before uvicorn listens) and the process exits 0.
    def stop(_signum: int, _frame: object) -> None:
        server.request_exit()

    signal.signal(signal.SIGTERM, stop)
    tune_gc()
    server.run(sockets=[sock])
    if app.state.startup_failed:
        return 1
    event(logging.INFO, "stopped")
    return 0
