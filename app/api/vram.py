"""Admin API of the control plane: backends and VRAM zones. Admin auth on every route.

GET  /backends                      state, in-flight, waiting, last start, VRAM
POST /backends/{name}/start         start (or join the start) and wait for the outcome
POST /backends/{name}/stop          drain, then stop
GET  /vram/zones                    zones held and what the GPUs look like
POST /vram/zones/{zone}/acquire     make room for an outside workload, then hold it
POST /vram/zones/{zone}/release     give it back; blocked backends wake on demand
GET  /vram/yield                    the VRAM yield held, as measured when it was taken
POST /vram/yield                    free the GPU for a game (drain, stop or sleep)
POST /vram/restore                  give it back: pinned backends now, lazy on demand
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt

from app.api.deps import AdminDep, ServicesDep
from app.errors import Conflict, NotFound
from app.lifecycle.backend import Backend
from app.lifecycle.vram_yield import YieldRequest
from app.lifecycle.zones import YIELD_ZONE, Zone
from app.services import Services

router = APIRouter(tags=["admin"], dependencies=[AdminDep])

ZoneName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class ZoneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mib: PositiveInt
    holder: str = Field(min_length=1, max_length=128)
    ttl_s: PositiveFloat | None = None  # none: held until released
    gpu: NonNegativeInt = 0
    # Evict only lazy backends with a priority below this; none: any lazy backend.
    priority: int | None = None


class YieldBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="gaming", min_length=1, max_length=128)
    # Stop once this much is free; none: take everything yieldable.
    min_free_mib: PositiveInt | None = None
    ttl_s: PositiveFloat | None = None  # none: until POST /vram/restore
    include_pinned: bool = False
    gpu: NonNegativeInt = 0


def backend_view(backend: Backend) -> dict[str, Any]:
    cfg = backend.config
    return {
        "name": backend.name,
        "state": str(backend.state),
        "reason": backend.reason,
        "lifecycle": cfg.lifecycle,
        "runtime": backend.runtime.describe(),
        "runtime_detail": backend.runtime_detail,
        "priority": cfg.priority,
        "in_flight": backend.in_flight,
        "waiting": backend.waiting,
        "idle_s": round(backend.idle_s(), 1),
        "idle_ttl_s": cfg.idle_ttl_s,
        "last_start_s": (None if backend.last_start_s is None else round(backend.last_start_s, 3)),
        "healthy": backend.healthy,
        "health_error": backend.health_error,
        "vram_mib": backend.vram_mib,
        "gpus": cfg.gpus,
        "holds_vram": backend.holds_vram,
        "blocked_by": sorted(backend.blocks.values()),
        "yield_method": backend.yield_method,
    }


def zone_view(zone: Zone) -> dict[str, Any]:
    return {
        "zone": zone.name,
        "holder": zone.holder,
        "gpu": zone.gpu,
        "mib": zone.mib,
        "granted_at": zone.granted_at,
        "expires_at": zone.expires_at,
        "kind": zone.kind,
        "blocks": list(zone.blocks),
    }


def _backend(services: Services, name: str) -> Backend:
    backend = services.backends.get(name)
    if backend is None:
        raise NotFound(
            f"no backend named {name!r} (configured: {', '.join(services.backends)})",
            code="backend_not_found",
        )
    return backend


@router.get("/backends")
async def list_backends(services: ServicesDep) -> dict[str, Any]:
    return {"backends": [backend_view(b) for b in services.backends.values()]}


@router.post("/backends/{name}/start")
async def start_backend(name: str, services: ServicesDep) -> dict[str, Any]:
    """Waits until the backend is ready (or its start failed: then 503 with the reason)."""
    backend = _backend(services, name)
    if backend.blocks:
        raise Conflict(
            f"backend {name!r} is blocked by {'; '.join(backend.blocks.values())}; "
            "release that first"
        )
    await backend.start()
    return backend_view(backend)


@router.post("/backends/{name}/stop")
async def stop_backend(name: str, services: ServicesDep) -> dict[str, Any]:
    """Drains requests in flight (up to the backend's `drain_timeout_s`), then stops it.
    The next request for it wakes it again."""
    backend = _backend(services, name)
    if not backend.runtime.managed:
        raise Conflict(
            f"backend {name!r} is not managed by the gateway ({backend.runtime.describe()})"
        )
    await backend.stop("admin")
    return backend_view(backend)


@router.get("/vram/zones")
async def list_zones(services: ServicesDep) -> dict[str, Any]:
    reading = await services.arbiter.probe.read()
    placed = services.arbiter.placed_mib()
    gpus = (
        None
        if reading is None
        else [
            {
                "gpu": g.index,
                "total_mib": g.total_mib,
                "used_mib": g.used_mib,
                "free_mib": g.free_mib,
                "placed_mib": placed.get(g.index, 0),
            }
            for g in reading.gpus.values()
        ]
    )
    return {
        "probe": services.arbiter.probe.name,
        "gpus": gpus,
        "zones": [zone_view(z) for z in services.arbiter.zones.values()],
    }


@router.post("/vram/zones/{zone}/acquire")
async def acquire_zone(
    zone: ZoneName, request: Annotated[ZoneRequest, Body()], services: ServicesDep
) -> dict[str, Any]:
    """Evicts lazy backends until `mib` is free on the GPU, then holds it for `holder`.

    Acquiring a zone already held by the same holder renews its expiry; 409 when it is
    held by someone else or the memory cannot be freed (the message says what holds it).
    """
    _not_the_yield(zone)
    grant = await services.arbiter.acquire_zone(
        zone,
        holder=request.holder,
        mib=request.mib,
        gpu=request.gpu,
        ttl_s=request.ttl_s,
        below_priority=request.priority,
    )
    reading = await services.arbiter.probe.read()
    free = None
    if reading is not None and grant.zone.gpu in reading.gpus:
        free = reading.gpus[grant.zone.gpu].free_mib
    return {
        **zone_view(grant.zone),
        "granted": True,
        "renewed": grant.renewed,
        "freed_mib": grant.freed_mib,
        "stopped": list(grant.zone.stopped) if not grant.renewed else [],
        "free_mib": free,
        "expires_in_s": (
            None if grant.zone.expires_at is None else round(grant.zone.expires_at - time.time(), 1)
        ),
    }


@router.post("/vram/zones/{zone}/release")
async def release_zone(zone: ZoneName, services: ServicesDep) -> dict[str, Any]:
    _not_the_yield(zone)
    released = services.arbiter.release_zone(zone)
    return {**zone_view(released), "released": True, "unblocked": list(released.stopped)}


def _not_the_yield(zone: str) -> None:
    if zone == YIELD_ZONE:
        raise Conflict(
            f"zone {YIELD_ZONE!r} is the VRAM yield's; use POST /vram/yield and POST /vram/restore"
        )


@router.get("/vram/yield")
async def yield_state(services: ServicesDep) -> dict[str, Any]:
    return services.vram_yield.view()


@router.post("/vram/yield")
async def take_yield(
    services: ServicesDep, request: Annotated[YieldBody | None, Body()] = None
) -> dict[str, Any]:
    """Drains, then stops or puts to sleep the yieldable backends (lowest priority first)
    until `min_free_mib` is free, and holds the memory. `freed_mib` is measured. A second
    call answers the yield already held (`"already": true`)."""
    body = request or YieldBody()
    return await services.vram_yield.yield_vram(YieldRequest(**body.model_dump()))


@router.post("/vram/restore")
async def restore_yield(services: ServicesDep) -> dict[str, Any]:
    """Ends the yield: pinned backends are woken or started now, lazy ones on demand.
    Without a yield it answers `{"state": "none", "restored": false}`."""
    return await services.vram_yield.restore()
