"""Admin API of the configuration: `POST /config/reload` (admin auth).

Reads the config directory again, validates it whole (as at start-up) and applies what
changed (`app.reload`); 400 listing every problem when it is invalid (the running
configuration stays). The answer says what was updated, restarted, added, removed, and
which changes need a restart of the gateway and were not applied."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.api.deps import AdminDep
from app.reload.apply import Reloader

router = APIRouter(tags=["config"], dependencies=[AdminDep])


@router.post("/config/reload")
async def reload_config(request: Request) -> dict[str, Any]:
    reloader: Reloader = request.app.state.reloader  # built by the lifespan (app.main)
    return await reloader.reload("api")
