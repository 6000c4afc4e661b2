"""`GET /activity` (admin): the last requests, newest first (`app.activity`).

    GET /activity?limit=100&model=NAME&key=NAME

`limit` (1 or more; at most the ring's size, `activity_size`) bounds the answer; `model`
(the configured name a request was routed by) and `key` (a client key's name) keep only
the entries that match exactly."""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Query

from app.api.deps import AdminDep, ServicesDep

DEFAULT_LIMIT: Final = 100

router = APIRouter(tags=["ops"], dependencies=[AdminDep])


@router.get("/activity")
async def activity(
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1)] = DEFAULT_LIMIT,
    model: Annotated[str | None, Query(max_length=256)] = None,
    key: Annotated[str | None, Query(max_length=256)] = None,
) -> dict[str, Any]:
    """Each entry: `at` (arrival, Unix seconds), `key`, `model`, `route` (the backend or
    provider that answered), `api` (the endpoint's name), `status`, `prompt_tokens`,
    `completion_tokens` and `tokens_per_s` (None without usage in the answer), `wait_s`
    and `wait_reason` (`none`, `queue`, `wake`, `limit`, `yield`), `fallbacks`,
    `duration_s`, and `stream_error`: the error that ended a response whose status line
    had gone out (a stream ended by an error event keeps its 200; None: it ended well).
    Never a prompt or an answer."""
    ring = services.activity
    entries = ring.recent(min(limit, ring.size), model=model, key=key)
    return {"size": ring.size, "held": len(ring), "entries": [e.view() for e in entries]}
