"""Operations endpoints: liveness, readiness, Prometheus metrics (open), and `/status`
(admin: everything the control plane knows, in one JSON document)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.responses import Response

from app.api.deps import AdminDep, ServicesDep
from app.api.views import (
    backend_view,
    backend_vram_view,
    fallback_view,
    gpu_status_view,
    ready_view,
    yield_view,
    zone_view,
)
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
        view = ready_view(backend)
        if not backend.lazy:
            all_ready &= view["ready"]
        backends[name] = view
    body = {"status": "ready" if all_ready else "not_ready", "backends": backends}
    return JSONResponse(body, status_code=200 if all_ready else 503)


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    return Response(services.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/status", dependencies=[AdminDep])
async def status(services: ServicesDep) -> dict[str, Any]:
    """GPUs (last snapshot and its age), backends (state, VRAM planned and measured, in
    flight, waiting, what blocks them), holds (zones, the yield), the active profile,
    the fallback chains, and the last 100 events. Reads state only: it never calls NVML
    or a backend."""
    profile = services.profiles.profile
    monitor = services.gpu_monitor
    gpu = gpu_status_view(None if monitor is None else monitor.status())
    totals = {g["index"]: g["total_mib"] for g in gpu["gpus"]}
    backends = []
    for name, backend in services.backends.items():
        planned = None
        if profile is not None:
            planned = profile.planned_mib(name, totals.get(backend.config.gpus[0]))
        backends.append({**backend_view(backend), "vram": backend_vram_view(backend, planned)})
    return {
        "gateway": {
            "started_at": services.started_at,
            "uptime_s": round(time.time() - services.started_at, 1),
        },
        "gpu": gpu,
        "backends": backends,
        "holds": {
            "yield": yield_view(services.vram_yield.current),
            "zones": [zone_view(z) for z in services.arbiter.zones.values() if z.kind == "zone"],
            "placed_mib": services.arbiter.placed_mib(),
        },
        "profile": {"active": services.profiles.active},
        "fallback": fallback_view(services.cloud.status()),
        "events": services.events.recent(),
    }
