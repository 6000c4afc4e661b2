"""create_app(settings, *, seams) -> FastAPI. Nothing is built at import time."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from app import logs
from app.api import (
    backends,
    handlers,
    messages,
    openai,
    openapi,
    ops,
    profiles,
    stream,
    ui,
    vram,
)
from app.api.fastpath import GatewayApp
from app.auth import exposure_warnings
from app.metrics import Metrics
from app.services import Seams, Services
from app.settings import Settings

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    seams: Seams | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    metrics = Metrics(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for warning in exposure_warnings(
            settings.host, api_keys=bool(settings.api_keys), admin_key=bool(settings.admin_key)
        ):
            logger.warning("exposed: %s", warning)
        services = Services(settings, metrics, seams or Seams())
        app.state.services = services
        await services.start()
        # What start-up built lives as long as the app: keep it out of every later GC pass
        # (full collections of it paused the loop for ~50 ms under load).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await services.close()
            logs.drain()  # no request is left: write the queued access lines

    app = GatewayApp(
        metrics=metrics,
        access_log=settings.access_log,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.server.body_timeout_s,
        fast_routes=[*openai.routes, *messages.routes],
        title="microscheduler",
        summary="OpenAI-compatible gateway for local vLLM servers sharing one GPU.",
        lifespan=lifespan,
    )
    handlers.install(app)
    app.include_router(ops.router)
    app.include_router(stream.router)
    app.include_router(backends.router)
    app.include_router(vram.router)
    app.include_router(profiles.router)
    app.router.routes.extend(openai.routes)
    app.router.routes.extend(messages.routes)
    app.router.routes.extend(ui.routes)
    openapi.install(app)
    return app
