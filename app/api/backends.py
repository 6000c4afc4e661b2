"""Admin API of the backends. Admin auth on every route.

GET  /backends                      state, in-flight, waiting, last start, VRAM
POST /backends/{name}/start         start (or join the start) and wait for the outcome
POST /backends/{name}/stop          drain, then stop
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.deps import AdminDep, ServicesDep
from app.api.views import backend_view
from app.errors import Conflict, ErrorCode, NotFound
from app.lifecycle.backend import Backend
from app.lifecycle.state import StopReason
from app.lifecycle.view import BackendView
from app.services import Services
from app.settings import ReleaseConfig

router = APIRouter(tags=["admin"], dependencies=[AdminDep])


def _backend(services: Services, name: str) -> Backend:
    backend = services.backends.get(name)
    if backend is None:
        raise NotFound(
            f"no backend named {name!r} (configured: {', '.join(services.backends)})",
            code=ErrorCode.BACKEND_NOT_FOUND,
        )
    return backend


@router.get("/backends")
async def list_backends(services: ServicesDep) -> dict[str, Any]:
    return {"backends": [backend_view(BackendView.of(b)) for b in services.backends.values()]}


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
    return backend_view(BackendView.of(backend))


@router.post("/backends/{name}/stop")
async def stop_backend(name: str, services: ServicesDep) -> dict[str, Any]:
    """Drains requests in flight (up to the backend's `drain_timeout_s`), then stops it.
    The next request for it wakes it again."""
    backend = _backend(services, name)
    if not backend.runtime.managed:
        raise Conflict(
            f"backend {name!r} is not managed by the gateway ({backend.runtime.describe()})"
        )
    await backend.stop(StopReason.ADMIN)
    return backend_view(BackendView.of(backend))


@router.post("/backends/{name}/sleep")
async def sleep_backend(name: str, services: ServicesDep) -> dict[str, Any]:
    """Drains, then puts the server to sleep (vLLM sleep mode, its `yield.level`, level 1
    only within its host RAM budget): the process stays and wakes in seconds. For
    backends with sleep mode (`sleep_mode`, or a `method: sleep`); a server
    that turns out not to offer sleep mode is stopped instead (the answer's state says)."""
    backend = _backend(services, name)
    if not backend.runtime.managed:
        raise Conflict(
            f"backend {name!r} is not managed by the gateway ({backend.runtime.describe()})"
        )
    memory = backend.memory
    if not memory.sleep_supported:
        raise Conflict(
            f"backend {name!r} does not use sleep mode (yield.method: {memory.yield_method}; "
            "sleep_mode: true says its server offers it)"
        )
    how = memory.yield_how
    method = "sleep" if how.method == "sleep" else "auto"
    await backend.give_back(
        StopReason.ADMIN, ReleaseConfig.model_validate({"method": method, "level": how.level})
    )
    return backend_view(BackendView.of(backend))
