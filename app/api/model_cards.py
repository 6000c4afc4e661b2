"""The model objects of `GET /v1/models` and `GET /models`: OpenAI's fields, vLLM's
`max_model_len`, and a `status` in llama.cpp's router shape, so a client that already reads
a llama.cpp router (Open WebUI, agents) sees which models are loaded, loading (how far),
asleep, unloaded or failed (why).

The shape is llama.cpp's (ggml-org/llama.cpp tools/server/README.md "Using multiple
models", `GET /models`; tools/server/server-models.cpp `get_router_models`): `status.value`
is `loaded`, `loading`, `sleeping` or `unloaded`, and a failure adds `failed: true`. Where
its names exist they are kept; the gateway adds `failed` as a value of its own (a failed
backend is not one a request wakes at once: it waits out its restart backoff), `reason`,
`state` (the backend's own state word), `blocked_by`, and for a replica group `replicas`.
While loading, `progress` has llama.cpp's `/models/sse` fields (`stages`, `current`,
`value`: the share of the one stage, `model`, done, 0-1) and vLLM's phase, `percent` and
`eta_s` as `/status` shows them (`load`).

Each listed name is served by a local backend (a fallback chain hangs off such a name), so
every entry has a status: an alias or a LoRA adapter has its backend's, a replica group its
best member's (loaded, then loading, sleeping, unloaded, failed)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from app.lifecycle.backend import Backend
from app.lifecycle.load import LoadStatus
from app.lifecycle.state import BackendState
from app.routing.registry import ModelEntry, Registry
from app.services import Services

Json = dict[str, Any]

# A backend's state as llama.cpp's router words it. `stopping` is on its way out: a request
# now waits for the stop, then starts it again, as for an unloaded model.
VALUES: Final[Mapping[BackendState, str]] = {
    BackendState.READY: "loaded",
    BackendState.STARTING: "loading",
    BackendState.SLEEPING: "sleeping",
    BackendState.STOPPED: "unloaded",
    BackendState.STOPPING: "unloaded",
    BackendState.FAILED: "failed",
}
# Which member of a replica group speaks for it: the first of these it has.
RANK: Final = ("loaded", "loading", "sleeping", "unloaded", "failed")
STAGE: Final = "model"  # llama.cpp's stages are what it loads; a vLLM server is one


def progress_view(load: LoadStatus) -> Json:
    """A load under way in llama.cpp's `progress` fields, with vLLM's phase."""
    return {
        "stages": [STAGE],
        "current": STAGE,
        "value": round(load.percent / 100, 2),
        "phase": load.phase,
        "percent": load.percent,
        "eta_s": load.eta_s,
    }


def backend_status(backend: Backend) -> Json:
    """One backend's `status` object, from the four things it shows (read directly: a
    whole `BackendView` per listed name made `/v1/models` seven times slower)."""
    return status_of(backend.state, backend.reason, backend.load(), backend.blocks.values())


def status_of(
    state: BackendState, reason: str | None, load: LoadStatus | None, blocks: Iterable[str]
) -> Json:
    """A `status` object from a backend's state, its reason, its load under way (shown
    while it starts) and what blocks it (VRAM zones, the yield)."""
    value = VALUES[state]
    status: Json = {"value": value, "state": str(state)}
    if state is BackendState.STARTING and load is not None:
        status["progress"] = progress_view(load)
    if value == "failed":
        status["failed"] = True
    if reason is not None:
        status["reason"] = reason
    blocked_by = sorted(blocks)
    if blocked_by:
        status["blocked_by"] = blocked_by
    return status


def group_status(members: Mapping[str, Json]) -> Json:
    """A replica group's status: its best member's, with each member's `value`."""
    best = min(members.values(), key=lambda status: RANK.index(status["value"]))
    return {**best, "replicas": {name: status["value"] for name, status in members.items()}}


def model_status(entry: ModelEntry, statuses: Mapping[str, Json]) -> Json | None:
    """The `status` of one listed name, from its backends' (`statuses`, by backend name;
    None: its backend is gone, a reload under way)."""
    members = {
        name: statuses[name] for name in entry.replicas or (entry.backend,) if name in statuses
    }
    if not members:
        return None
    if entry.group is None:
        return next(iter(members.values()))
    return group_status(members)


def backend_statuses(backends: Mapping[str, Backend]) -> dict[str, Json]:
    """Every backend's status, once for a whole list (aliases share their backend's)."""
    return {name: backend_status(backend) for name, backend in backends.items()}


def listed(services: Services, registry: Registry, allowed: Callable[[str], bool]) -> Json:
    """`GET /v1/models` and `GET /models`: the names of `registry` (the request's plane's)
    `allowed`, each with its state."""
    statuses = backend_statuses(services.backends)
    return model_list(
        registry,
        services.started_at,
        allowed=allowed,
        max_len=lambda entry: max_model_len_of(entry, services.backends),
        status=lambda entry: model_status(entry, statuses),
    )


def card(services: Services, entry: ModelEntry) -> Json:
    """`GET /v1/models/{id}`: one name, with its state."""
    max_len = max_model_len_of(entry, services.backends)
    status = model_status(entry, backend_statuses(services.backends))
    return model_view(entry, services.started_at, max_len, status)


def model_list(
    registry: Registry,
    created: float,
    *,
    allowed: Callable[[str], bool] | None = None,
    max_len: Callable[[ModelEntry], int | None] | None = None,
    status: Callable[[ModelEntry], Json | None] | None = None,
) -> Json:
    """`GET /v1/models` in OpenAI's list shape: the names `allowed` (the client key's);
    `max_len`: each entry's `max_model_len` (`max_model_len_of`; None: not known);
    `status`: each entry's (`model_status`)."""
    return {
        "object": "list",
        "data": [
            model_view(
                e,
                created,
                None if max_len is None else max_len(e),
                None if status is None else status(e),
            )
            for e in registry.entries
            if allowed is None or allowed(e.id)
        ],
    }


def model_view(
    entry: ModelEntry,
    created: float,
    max_model_len: int | None = None,
    status: Json | None = None,
) -> Json:
    """One model id or alias as OpenAI's model object (`GET /v1/models/{id}`), with vLLM's
    `max_model_len` (vllm/entrypoints/serve/engine/protocol.py `ModelCard`: null when not
    known) and its `status` (left out when not known); OpenAI's SDKs keep fields they do
    not declare."""
    card: Json = {
        "id": entry.id,
        "object": "model",
        "created": int(created),
        "owned_by": entry.group or entry.backend,  # a replica group, not one replica
        "root": entry.root,
        "parent": entry.parent,  # a LoRA adapter's base model, as vLLM lists it
        "max_model_len": max_model_len,
    }
    if status is not None:
        card["status"] = status
    return card


def max_model_len_of(entry: ModelEntry, backends: Mapping[str, Backend]) -> int | None:
    """The longest sequence a request for `entry` may use: what its server said
    (`Served.max_model_len`), else its `model_info.max_model_len`; for a replica group
    the smallest of its members' (a request may reach any); None when none is known.
    Aliases and LoRA adapters have their backend's (vLLM lists an adapter without one,
    but serves it within its base model's)."""
    known = [
        length
        for member in entry.replicas or (entry.backend,)
        if (backend := backends.get(member)) is not None
        and (length := _max_model_len(backend)) is not None
    ]
    return min(known, default=None)


def _max_model_len(backend: Backend) -> int | None:
    learned = backend.serving.max_model_len
    if learned is not None:
        return learned
    info = backend.config.model_info
    return None if info is None else info.max_model_len
