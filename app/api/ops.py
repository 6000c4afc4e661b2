"""Operations endpoints: liveness, readiness, Prometheus metrics (open), and `/status`
(admin: everything the control plane knows, in one JSON document)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.responses import Response

from app.api.deps import AdminDep, ServicesDep
from app.api.vram import backend_view, zone_view
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


@router.get("/status", dependencies=[AdminDep])
async def status(services: ServicesDep) -> dict[str, Any]:
    """GPUs (last snapshot and its age), backends (state, VRAM planned and measured, in
    flight, waiting, what blocks them), holds (zones, the yield), the active profile,
    the fallback chains, and the last 100 events. Reads state only: it never calls NVML
    or a backend."""
    profile = services.profiles.profile
    gpu = services.gpu_status()
    totals = {g["index"]: g["total_mib"] for g in gpu.get("gpus") or []}
    backends = []
    for name, backend in services.backends.items():
        view = backend_view(backend)
        planned = None
        if profile is not None:
            planned = profile.planned_mib(name, totals.get(backend.config.gpus[0]))
        view["vram"] = {
            "configured_mib": backend.config.vram_mib,
            "profile_mib": planned,
            "admission_mib": backend.vram_mib,
            "footprint": None if backend.footprint is None else backend.footprint.as_dict(),
            "measured_mib": backend.measured_mib,
        }
        backends.append(view)
    return {
        "gateway": {
            "started_at": services.started_at,
            "uptime_s": round(time.time() - services.started_at, 1),
        },
        "gpu": gpu,
        "backends": backends,
        "holds": {
            "yield": services.vram_yield.view(),
            "zones": [zone_view(z) for z in services.arbiter.zones.values() if z.kind == "zone"],
            "placed_mib": services.arbiter.placed_mib(),
        },
        "profile": {"active": services.profiles.active},
        "fallback": services.fallback_status(),
        "events": services.events.recent(),
    }
