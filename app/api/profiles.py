"""Admin API of the GPU profiles (`gpu_profiles.yaml`). Admin auth on every route.

GET  /profiles                      the profiles, which is active, what each enables
POST /profiles/{name}/activate      switch: disabled backends drain and stop, enabled
                                    ones become startable (pinned ones start now)
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from app.api.deps import AdminDep, ServicesDep
from app.api.views import activation_view, profiles_view

router = APIRouter(tags=["admin"], dependencies=[AdminDep])

ProfileName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


@router.get("/profiles")
async def list_profiles(services: ServicesDep) -> dict[str, Any]:
    return profiles_view(services.profiles, services.backends)


@router.post("/profiles/{name}/activate")
async def activate_profile(name: ProfileName, services: ServicesDep) -> dict[str, Any]:
    """Answers what changed: `disabled`, `enabled`, `stopped`, `started`, `drain_timeouts`."""
    return activation_view(await services.profiles.activate(name))
