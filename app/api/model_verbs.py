"""Load and unload a model for a client: the verbs behind `POST /models/load`,
`POST /models/unload` and Ollama's `keep_alive`, and who may use them.

- `lifecycle_target` finds the one local backend a model name (an id, alias or adapter, or
  a backend's own name) stands for.
- `check_lifecycle`: the admin (its key; without one, a loopback client, as the admin
  routes), or a client key that says `lifecycle: true` for a model in its scope. An unload
  frees VRAM another client may be using, so a key may not do it unless its entry says so.
- `load` starts or wakes the backend by the same path as a request's wake (admission,
  priorities, zones, `min_resident_s`), so a load is refused where a request would wait or
  be refused, and says why. `unload` drains, then releases as the backend's `idle:` says
  (sleep or stop), as the idle reaper would.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from starlette.requests import Request

from app.api.deps import plane_of, require_admin
from app.errors import AuthenticationFailed, Conflict, ModelNotFound, PermissionDenied
from app.lifecycle.backend import Backend
from app.lifecycle.state import BackendState, StopReason
from app.routing.registry import Registry
from app.services import Services

logger = logging.getLogger(__name__)

_AT_REST: Final = frozenset({BackendState.STOPPED, BackendState.SLEEPING, BackendState.FAILED})
_BEGIN_TURNS: Final = 10


def lifecycle_target(services: Services, model: str, registry: Registry | None = None) -> Backend:
    """The backend `model` names in `registry` (the request's plane's; None: the running
    one): an id, alias or adapter of one local backend, or the backend's name. 404 for an
    unknown name; 409 for a replica group (which replica is the client's to say) or a
    backend the gateway does not manage."""
    names = registry if registry is not None else services.plane.registry
    entry = next((e for e in names.entries if e.id == model), None)
    if entry is not None and entry.group is not None:
        raise Conflict(
            f"model '{model}' is served by the replica group '{entry.group}' "
            f"({', '.join(entry.replicas)}): load or unload one replica by its backend name"
        )
    name = entry.backend if entry is not None else model
    backend = services.backends.get(name)
    if backend is None:
        raise ModelNotFound(model)
    if not backend.runtime.managed:
        raise Conflict(
            f"model '{model}' runs on backend '{name}', which the gateway does not start or "
            f"stop ({backend.runtime.describe()})"
        )
    return backend


def check_lifecycle(request: Request, services: Services, model: str) -> None:
    """Pass for the admin, or a client key with `lifecycle: true` whose scope holds `model`;
    401 for a missing or unknown key, 403 (saying what the key lacks) otherwise."""
    try:
        require_admin(request, services)
        return
    except (AuthenticationFailed, PermissionDenied):
        pass  # not the admin: a client key may still be allowed
    key = plane_of(request).auth.check_client(request.headers.get("authorization"))
    key.check_model(model)
    if not key.lifecycle:
        raise PermissionDenied(
            f"Key '{key.name}' may not load or unload models: its entry in keys.yaml needs "
            "`lifecycle: true` (an unload frees VRAM another client may be using). The "
            "admin key may."
        )


async def load(services: Services, backend: Backend, *, wait: bool) -> None:
    """Start or wake `backend` as a request's wake does. `wait`: until it is ready (raises
    `BackendUnavailable` with the reason when it does not get there); else begin it in a
    task the services own and return at once (its state, on `/models`, says how it goes:
    a start that fails is logged and shown there, not raised)."""
    if backend.blocks:
        raise Conflict(
            f"backend '{backend.name}' is blocked by {'; '.join(backend.blocks.values())}; "
            "it cannot be loaded until that ends"
        )
    logger.info("load backend=%s wait=%s", backend.name, wait)
    if wait:
        await backend.start()
    else:
        task = services.loads.spawn(backend.start_logged("load"), f"load:{backend.name}")
        # The start begins under the backend's lock, a loop turn or two from now: let it,
        # so the answer (and a `/models` read right after it) shows it loading.
        for _ in range(_BEGIN_TURNS):
            if task.done() or backend.state not in _AT_REST:
                break
            await asyncio.sleep(0)


async def unload(backend: Backend) -> None:
    """Drain, then release as `idle:` says (sleep or stop). Idempotent: an unloaded
    backend stays so. Raises `BackendUnavailable` when its runtime could not stop it."""
    logger.info("unload backend=%s", backend.name)
    await backend.give_back(StopReason.UNLOAD, backend.config.idle)
