"""Models for clients that manage them, as llama.cpp's router does (ggml-org/llama.cpp
tools/server/README.md "Using multiple models"; tools/server/server-models.cpp
`init_routes`): the same routes, bodies and event shapes, over the gateway's own lifecycle.

GET  /models          the models the caller may use, as `/v1/models` lists them (`status`)
GET  /models/sse      their state changes as server-sent events (`data:` lines, no names)
POST /models/load     {"model": NAME, "wait": true}: start or wake it; answers when ready
                      (or at once with `"wait": false`)
POST /models/unload   {"model": NAME}: drain, then release it as its `idle:` says

Reading needs what `/v1/models` needs (a client key, which sees its scope; the admin sees
all). Loading and unloading need the admin, or a client key with `lifecycle: true` for a
model in its scope (`app.api.model_verbs`). Unlike llama.cpp, a load of a loaded model and
an unload of an unloaded one succeed (nothing to do): an agent may say what it wants
without reading the state first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import StreamingResponse

from app.api import model_verbs
from app.api.deps import ServicesDep, json_body, plane_of, require_admin
from app.api.middleware import context_of
from app.api.model_cards import Json, backend_status, backend_statuses, listed, model_status
from app.errors import AuthenticationFailed, InvalidRequest, PermissionDenied
from app.events import Subscription
from app.jsonwire import json_bytes
from app.lifecycle.backend import Backend
from app.services import Services

router = APIRouter(tags=["models"])

KEEPALIVE_S: Final = 15.0
MIN_INTERVAL_S: Final = 0.1  # a burst of changes (progress lines) is one push
# What moves by itself: a load's seconds left is no change of state.
VOLATILE: Final = frozenset({"eta_s"})


class LoadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=512)
    wait: bool = True  # until it is ready; false: answer at once, it loads meanwhile


class UnloadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=512)


def _documented(body: type[BaseModel]) -> dict[str, Any]:
    """The body in the OpenAPI schema (`json_body` reads it itself, so FastAPI cannot)."""
    schema = {"application/json": {"schema": body.model_json_schema()}}
    return {"requestBody": {"required": True, "content": schema}}


def reader_scope(request: Request, services: Services) -> Callable[[str], bool]:
    """Which names the caller may see: all for the admin, else its client key's scope
    (401 without a known key)."""
    try:
        require_admin(request, services)
        return lambda _: True
    except (AuthenticationFailed, PermissionDenied):
        pass
    key = plane_of(request).auth.check_client(request.headers.get("authorization"))
    context_of(request.scope).key = key.name  # in the request's access line, as for /v1/models
    return key.allows


@router.get("/models")
async def list_models(request: Request, services: ServicesDep) -> dict[str, Any]:
    """As `GET /v1/models`: each model the caller may use, with its `status`."""
    allowed = reader_scope(request, services)
    return listed(services, plane_of(request).registry, allowed)


@router.post("/models/load", openapi_extra=_documented(LoadBody))
async def load_model(
    request: Request,
    services: ServicesDep,
    body: Annotated[LoadBody | None, Depends(json_body(LoadBody))],
) -> dict[str, Any]:
    """Starts or wakes the model's backend as a request would (admission, priorities,
    zones, `min_resident_s`); 409 saying what blocks it, 503 with the reason when it does
    not get ready. `"wait": false` answers once the load has begun."""
    if body is None:
        raise InvalidRequest("The body needs 'model': the model to load.", param="model")
    model_verbs.check_lifecycle(request, services, body.model)
    backend = model_verbs.lifecycle_target(services, body.model, plane_of(request).registry)
    await model_verbs.load(services, backend, wait=body.wait)
    return answer(backend, body.model)


@router.post("/models/unload", openapi_extra=_documented(UnloadBody))
async def unload_model(
    request: Request,
    services: ServicesDep,
    body: Annotated[UnloadBody | None, Depends(json_body(UnloadBody))],
) -> dict[str, Any]:
    """Drains the model's backend, then sleeps or stops it as its `idle:` says."""
    if body is None:
        raise InvalidRequest("The body needs 'model': the model to unload.", param="model")
    model_verbs.check_lifecycle(request, services, body.model)
    backend = model_verbs.lifecycle_target(services, body.model, plane_of(request).registry)
    await model_verbs.unload(backend)
    return answer(backend, body.model)


def answer(backend: Backend, model: str) -> Json:
    """llama.cpp's `{"success": true}`, with the backend's status now."""
    return {"success": True, "model": model, "status": backend_status(backend)}


@router.get("/models/sse")
async def model_events(request: Request, services: ServicesDep) -> StreamingResponse:
    """Each model's status now, then every change, as llama.cpp's router sends them."""
    allowed = reader_scope(request, services)
    subscription = services.events.subscribe()
    return StreamingResponse(
        _stream(services, allowed, subscription),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


def statuses(services: Services, allowed: Callable[[str], bool]) -> dict[str, Json]:
    """Each visible model's status now (a model whose backend is gone left out), by the
    running plane's names: a stream that outlives a reload lists the new ones."""
    by_backend = backend_statuses(services.backends)
    now = {
        entry.id: model_status(entry, by_backend)
        for entry in services.plane.registry.entries
        if allowed(entry.id)
    }
    return {name: status for name, status in now.items() if status is not None}


def steady(status: Json) -> Json:
    """`status` without what moves by itself (`VOLATILE`): what counts as a change."""
    return {
        k: steady(v) if isinstance(v, dict) else v for k, v in status.items() if k not in VOLATILE
    }


def changes(before: Mapping[str, Json], now: Mapping[str, Json]) -> list[Json]:
    """The events from `before` to `now`, in llama.cpp's shape: `model_status` for a model
    whose status changed (or that is new), `model_remove` for one that went."""
    events = [
        {"model": name, "event": "model_status", "data": status_event(status)}
        for name, status in now.items()
        if name not in before or steady(before[name]) != steady(status)
    ]
    events += [{"model": name, "event": "model_remove"} for name in before if name not in now]
    return events


def status_event(status: Json) -> Json:
    """A status as `/models/sse` says it: llama.cpp's `{"status": VALUE, ...}` (the value
    a string there), the rest of the object beside it (progress, reason...)."""
    rest = {k: v for k, v in status.items() if k != "value"}
    return {"status": status["value"], **rest}


def data(event: Json) -> bytes:
    return b"data: " + json_bytes(event) + b"\n\n"


async def _stream(
    services: Services, allowed: Callable[[str], bool], sub: Subscription
) -> AsyncGenerator[bytes, None]:
    try:
        sent: dict[str, Json] = {}
        while True:
            sub.take()  # what changes from here on wakes it again
            now = statuses(services, allowed)
            for event in changes(sent, now):
                yield data(event)
            sent = now
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    await sub.wake.wait()
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if sub.dropped or sub.ended is not None:
                return  # too far behind, or the gateway is stopping
            await asyncio.sleep(MIN_INTERVAL_S)
    finally:
        sub.close()
