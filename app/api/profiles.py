"""Admin API of the GPU profiles (`gpu_profiles.yaml`). Admin auth on every route.

GET  /profiles                      the profiles, which is active, what each enables
POST /profiles/{name}/activate      switch: disabled backends drain and stop, enabled
                                    ones become startable (pinned ones start now)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Path

from app.api.deps import AdminDep, ServicesDep
from app.api.views import Json
from app.lifecycle.profile_switch import ProfileActivation, ProfileSwitch

router = APIRouter(tags=["admin"], dependencies=[AdminDep])

ProfileName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


@router.get("/profiles")
async def list_profiles(services: ServicesDep) -> dict[str, Any]:
    return profiles_view(services.profiles, services.backends)


@router.post("/profiles/{name}/activate")
async def activate_profile(name: ProfileName, services: ServicesDep) -> dict[str, Any]:
    """Answers what changed: `disabled`, `enabled`, `stopped`, `started`, `drain_timeouts`."""
    return activation_view(await services.profiles.activate(name))


def profiles_view(switch: ProfileSwitch, backends: Iterable[str]) -> Json:
    """`GET /profiles`: each profile, whether active, and what it enables."""
    config = switch.profiles
    if config is None:
        return {"active": None, "profiles": []}
    names = list(backends)
    profiles = [
        {
            "name": name,
            "active": name == switch.active,
            "description": profile.description,
            "vram_strategy": profile.vram_strategy,
            "gpu_total_gb": profile.gpu_total_gb,
            "target_utilization_pct": profile.target_utilization_pct,
            "enabled": [b for b in names if profile.enabled(b)],
            "disabled": [b for b in names if not profile.enabled(b)],
            "models": {n: m.model_dump(exclude_none=True) for n, m in profile.models.items()},
        }
        for name, profile in config.profiles.items()
    ]
    return {"active": switch.active, "profiles": profiles}


def activation_view(activation: ProfileActivation) -> Json:
    return {
        "active": activation.active,
        "previous": activation.previous,
        "changed": activation.changed,
        "disabled": list(activation.change.disable),
        "enabled": list(activation.change.enable),
        "stopped": list(activation.stopped),
        "started": list(activation.started),
        "drain_timeouts": list(activation.drain_timeouts),
        "failed": dict(activation.failed),
    }
