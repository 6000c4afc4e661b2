"""Operations endpoints: liveness, readiness, Prometheus metrics. All open (no auth)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.responses import Response

from app.api.deps import ServicesDep
from app.lifecycle.state import BackendState
from app.metrics import CONTENT_TYPE

router = APIRouter(tags=["ops"])


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the process serves HTTP. Backends do not affect it."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(services: ServicesDep) -> JSONResponse:
    """Readiness: config loaded and every backend the gateway keeps running is healthy.

    Lazy backends are listed but do not count: stopped is their normal state."""
    backends: dict[str, Any] = {}
    all_ready = True
    for name, backend in services.backends.items():
        ok = backend.state is BackendState.READY and backend.healthy is True
        if not backend.lazy:
            all_ready &= ok
        backends[name] = {
            "ready": ok,
            "lifecycle": backend.config.lifecycle,
            "state": str(backend.state),
            "healthy": backend.healthy,
            "reason": backend.reason,
            "health_error": backend.health_error,
        }
    body = {"status": "ready" if all_ready else "not_ready", "backends": backends}
    return JSONResponse(body, status_code=200 if all_ready else 503)


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    return Response(services.metrics.render(), media_type=CONTENT_TYPE)
