"""Operations endpoints: liveness, readiness, Prometheus metrics (open, or admin when an
admin key is set and the gateway listens beyond loopback: it names every client key), and
`/status` (admin: everything the control plane knows, in one JSON document)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.api.deps import AdminDep, MetricsDep, ServicesDep
from app.api.handlers import JSONBody
from app.api.views import ready_view, status_view
from app.lifecycle.view import BackendView
from app.metrics import CONTENT_TYPE

router = APIRouter(tags=["ops"])


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the process serves HTTP. Backends do not affect it."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(services: ServicesDep) -> JSONBody:
    """Readiness: config loaded and every backend the gateway keeps running is healthy.

    Lazy backends are listed but do not count: stopped is their normal state."""
    backends: dict[str, Any] = {}
    all_ready = True
    for name, backend in services.backends.items():
        view = ready_view(BackendView.of(backend))
        if not backend.lazy:
            all_ready &= view["ready"]
        backends[name] = view
    body = {"status": "ready" if all_ready else "not_ready", "backends": backends}
    return JSONBody(body, status_code=200 if all_ready else 503)


@router.get("/metrics", dependencies=[MetricsDep])
async def metrics(services: ServicesDep) -> Response:
    return Response(services.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/status", dependencies=[AdminDep])
async def status(services: ServicesDep, request: Request) -> dict[str, Any]:
    """GPUs (last snapshot and its age), backends (state, VRAM planned and measured, in
    flight, waiting, what blocks them), holds (zones, the yield), the active profile,
    the fallback chains, the last 100 events, and the client connections (the cap, how
    it was sized, its use). Reads state only: it never calls NVML or a backend."""
    view = status_view(services)
    connections = request.app.state.connections  # None: not run by `serve` (tests)
    view["gateway"]["connections"] = None if connections is None else connections()
    return view
