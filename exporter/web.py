"""FastAPI app: /metrics, /healthz, /readyz, /api/v1/status and the landing page; and the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from exporter.collection import Exporter
from exporter.config import Config, split_listen_address
from exporter.expose import SpecDecodeCollector, exporter_version
from exporter.httpserver import bind_socket
from exporter.log import event
from exporter.status import status_html, status_json


def build_registry(exporter: Exporter) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SpecDecodeCollector(exporter.views))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def build_app(exporter: Exporter, run_collection: bool = True) -> FastAPI:
    config: Config = exporter.config
    registry = build_registry(exporter)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(exporter.run(), name="collection") if run_collection else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    app = FastAPI(title="specdecode-exporter", version=exporter_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)

    def current_status() -> dict[str, object]:
        return status_json(exporter.views(), exporter.ready(), exporter_version(),
                           exporter.clock() - exporter.started_at, config.page_threshold)

    @app.get(config.telemetry_path)
    def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), media_type=content_type)

    @app.get("/healthz")
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    @app.get("/readyz")
    def readyz() -> PlainTextResponse:
        ready, reason = exporter.ready()
        return PlainTextResponse(("ok" if ready else f"not ready: {reason}") + "\n", status_code=200 if ready else 503)

    @app.get("/api/v1/status")
    def status() -> JSONResponse:
        return JSONResponse(current_status())

    @app.get("/", response_class=HTMLResponse)
    def landing() -> HTMLResponse:
        return HTMLResponse(status_html(current_status(), config.telemetry_path))

    return app


def serve(config: Config) -> int:
    """Run the sidecar until SIGTERM/SIGINT; returns the process exit code."""
    exporter = Exporter(config)
    host, port = split_listen_address(config.listen_address)
    server = uvicorn.Server(
        uvicorn.Config(build_app(exporter), host=host, port=port, log_config=None, access_log=False,
                       timeout_graceful_shutdown=5, lifespan="on")
    )
    event(logging.INFO, "starting", version=exporter_version(), listen_address=config.listen_address,
          telemetry_path=config.telemetry_path, targets=",".join(t.url for t in config.targets),
          interval=f"{config.collect_interval:g}s", windows=",".join(w.name for w in config.windows))
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        event(logging.ERROR, "cannot listen", listen_address=config.listen_address, detail=exc.strerror or str(exc))
        return 1
    server.run(sockets=[sock])
    event(logging.INFO, "stopped")
    return 0
