"""create_app(settings, *, seams) -> FastAPI. Nothing is built at import time."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

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
from app.api.middleware import RequestObserver
from app.metrics import Metrics
from app.services import Seams, Services
from app.settings import Settings


def create_app(
    settings: Settings,
    *,
    seams: Seams | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    metrics = Metrics(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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

    app = FastAPI(
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
    app.add_middleware(RequestObserver, metrics=metrics, access_log=settings.access_log)
    return app
