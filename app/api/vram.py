"""Admin API of the GPUs' memory: VRAM zones and the yield. Admin auth on every route.

GET  /vram/zones                    zones held and what the GPUs look like
POST /vram/zones/{zone}/acquire     make room for an outside workload, then hold it
POST /vram/zones/{zone}/release     give it back; blocked backends wake on demand
GET  /vram/yield                    the VRAM yield held, as measured when it was taken
POST /vram/yield                    free the GPU for a game (drain, stop or sleep)
POST /vram/restore                  end a hold (or all); the last one's end gives it
                                    back: pinned backends now, lazy on demand

Each works on one host's GPUs: the local one unless the request names another of
`hosts:` (`"host"` in a body, `?host=` on a GET, `{"host": ...}` on the restore). A
release finds the zone on whichever host holds it (zone names are unique across hosts).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt

from app.api.deps import AdminDep, ServicesDep, json_body
from app.api.views import expires_in_s, restore_view, yield_outcome_view, yield_view, zone_view
from app.errors import Conflict, InvalidRequest
from app.gpu.telemetry import free_mib
from app.vram.yield_answers import YieldRequest
from app.vram.zones import YIELD_ZONE

router = APIRouter(tags=["admin"], dependencies=[AdminDep])

ZoneName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


HostName = Annotated[str | None, Field(min_length=1, max_length=64)]


class ZoneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: HostName = None  # none: the local host
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
    host: HostName = None  # none: the local host


class RestoreBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: HostName = None  # none: the local host
    # End this holder's hold only (its yield's `reason`); none: every hold.
    reason: str | None = Field(default=None, min_length=1, max_length=128)


HostQuery = Annotated[str | None, Query(min_length=1, max_length=64)]


@router.get("/vram/zones")
async def list_zones(services: ServicesDep, host: HostQuery = None) -> dict[str, Any]:
    arbiter = services.hosts.named(host).arbiter
    reading = await arbiter.read_gpus()
    placed = arbiter.placed_mib()
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
            for g in reading.gpus
            if not g.lost
        ]
    )
    return {
        "host": arbiter.host,
        "probe": arbiter.probe_name,
        "gpus": gpus,
        "zones": [zone_view(z) for z in arbiter.book.zones.values()],
    }


@router.post("/vram/zones/{zone}/acquire")
async def acquire_zone(
    zone: ZoneName,
    request: Annotated[ZoneRequest | None, Depends(json_body(ZoneRequest))],
    services: ServicesDep,
) -> dict[str, Any]:
    """Evicts lazy backends until `mib` is free on the GPU of `host` (default: the local
    one), then holds it for `holder`.

    Acquiring a zone already held by the same holder renews its expiry; 409 when it is
    held by someone else (on any host) or the memory cannot be freed (the message says
    what holds it).
    """
    _not_the_yield(zone)
    if request is None:
        raise InvalidRequest("The request body must be a JSON object with mib and holder.")
    host = services.hosts.named(request.host)
    with services.hosts.zone_name(zone, host):
        grant = await host.arbiter.acquire_zone(
            zone,
            holder=request.holder,
            mib=request.mib,
            gpu=request.gpu,
            ttl_s=request.ttl_s,
            below_priority=request.priority,
        )
    reading = await host.arbiter.read_gpus()
    free = None
    if reading is not None and reading.usable(grant.zone.gpu) is not None:
        free = free_mib(reading, grant.zone.gpu)
    return {
        **zone_view(grant.zone),
        "granted": True,
        "renewed": grant.renewed,
        "freed_mib": grant.freed_mib,
        "stopped": list(grant.zone.stopped) if not grant.renewed else [],
        "free_mib": free,
        "expires_in_s": expires_in_s(grant.zone.expires_at),
    }


@router.post("/vram/zones/{zone}/release")
async def release_zone(zone: ZoneName, services: ServicesDep) -> dict[str, Any]:
    _not_the_yield(zone)
    released = services.hosts.holding_zone(zone).arbiter.book.release_zone(zone)
    return {**zone_view(released), "released": True, "unblocked": list(released.stopped)}


def _not_the_yield(zone: str) -> None:
    if zone == YIELD_ZONE:
        raise Conflict(
            f"zone {YIELD_ZONE!r} is the VRAM yield's; use POST /vram/yield and POST /vram/restore"
        )


@router.get("/vram/yield")
async def yield_state(services: ServicesDep, host: HostQuery = None) -> dict[str, Any]:
    named = services.hosts.named(host)
    return {**yield_view(named.vram_yield.current), "host": named.name}


@router.post("/vram/yield")
async def take_yield(
    services: ServicesDep,
    request: Annotated[YieldBody | None, Depends(json_body(YieldBody))],
) -> dict[str, Any]:
    """Drains, then stops or puts to sleep the yieldable backends (lowest priority first)
    until `min_free_mib` is free, and holds the memory. `freed_mib` is measured. A call
    while a yield holds adds (or renews) the caller's own hold, keyed by its `reason`, and
    takes nothing more: it answers the yield held (`"already": true`), naming the caller's
    hold (`reason`, `expires_at`) and every holder (`holds`)."""
    body = request or YieldBody()
    host = services.hosts.named(body.host)
    ask = YieldRequest(**body.model_dump(exclude={"host"}))
    return yield_outcome_view(await host.vram_yield.yield_vram(ask))


@router.post("/vram/restore")
async def restore_yield(
    services: ServicesDep,
    request: Annotated[RestoreBody | None, Depends(json_body(RestoreBody))],
) -> dict[str, Any]:
    """With a `reason`: ends that holder's hold of the yield of the local host (or the
    body's `host`); without: every hold. When no hold remains the yield ends: pinned
    backends are woken or started now, lazy ones on demand (`ended`: the holds it
    ended). While others hold on it answers `{"state": "yielded", "restored": false}`
    with the `holds` that remain. Without a yield: `{"state": "none", "restored":
    false}`."""
    body = request or RestoreBody()
    host = services.hosts.named(body.host)
    return restore_view(await host.vram_yield.restore(holder=body.reason), host.name)
