"""GPU profiles switched at run time through the admin API, against in-process fakes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from app.runtimes.base import Runtime
from app.services import Seams
from app.settings import BackendConfig
from app.settings.profiles import GpuProfilesConfig
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    chat,
    gateway,
    gateway_settings,
    until_backend,
)

PROFILES = {
    "profiles": {
        "dev": {
            "gpu_total_gb": 32,
            "target_utilization_pct": 76,
            "models": {
                "orchestrator": {"vram_pct": 40},
                "reasoning": {"vram_pct": 35, "sleep_mode": True},
            },
        },
        "production": {
            "target_utilization_pct": 92,
            "models": {"orchestrator": {"vram_pct": 92}, "reasoning": {"enabled": False}},
        },
    },
    "active": "dev",
}


@asynccontextmanager
async def profile_gateway(
    tmp_path: Path, runtimes: dict[str, FakeVllmRuntime], **reasoning: Any
) -> AsyncIterator[Gateway]:
    process = {"kind": "process", "command": ["unused"]}
    backends = {
        "orchestrator": {
            "url": f"http://127.0.0.1:{runtimes['orchestrator'].port}",
            "models": ["orch-model"],
            "runtime": process,
        },
        "reasoning": {
            "url": f"http://127.0.0.1:{runtimes['reasoning'].port}",
            "models": ["reasoning-model"],
            "runtime": process,
            **reasoning,
        },
    }

    def runtime_for(name: str, config: BackendConfig) -> Runtime:
        return runtimes[name]

    settings = gateway_settings(
        backends,
        state_dir=tmp_path / "var",
        gpu_profiles=GpuProfilesConfig.model_validate(PROFILES),
    )
    async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
        yield gw


def fakes(**reasoning: Any) -> dict[str, FakeVllmRuntime]:
    return {
        "orchestrator": FakeVllmRuntime(free_port(), models=["orch-model"]),
        "reasoning": FakeVllmRuntime(free_port(), models=["reasoning-model"], **reasoning),
    }


async def test_activation_drains_then_stops_disabled_backends(tmp_path: Path) -> None:
    runtimes = fakes(max_tokens=12, tokens_per_second=40)
    async with profile_gateway(tmp_path, runtimes) as gw:
        await until_backend(gw, "reasoning", state="ready")
        listed = (await gw.client.get("/profiles")).json()
        assert listed["active"] == "dev"
        assert [p["name"] for p in listed["profiles"]] == ["dev", "production"]
        assert listed["profiles"][1]["disabled"] == ["reasoning"]

        stream = asyncio.create_task(
            gw.client.post("/v1/chat/completions", json=chat("reasoning-model", stream=True))
        )
        await until_backend(gw, "reasoning", in_flight=1)  # under way: 12 tokens at 40/s
        switched = (await gw.client.post("/profiles/production/activate")).json()
        assert switched["active"] == "production"
        assert switched["previous"] == "dev"
        assert switched["disabled"] == ["reasoning"]
        assert switched["stopped"] == ["reasoning"]
        assert switched["drain_timeouts"] == []
        finished = await stream
        assert finished.text.rstrip().endswith("data: [DONE]")
        assert '"error"' not in finished.text  # drained, not cut
        assert runtimes["reasoning"].stops == 1

        refused = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "backend_disabled"
        assert "GPU profile 'production'" in error["message"]
        assert refused.headers["retry-after"] == "10"
        metrics = (await gw.client.get("/metrics")).text
        assert 'microscheduler_profile_active{profile="production"} 1.0' in metrics
        assert 'microscheduler_backend_enabled{backend="reasoning"} 0.0' in metrics

        back = (await gw.client.post("/profiles/dev/activate")).json()
        assert back["enabled"] == ["reasoning"]
        assert back["started"] == ["reasoning"]  # pinned: started again at once
        await until_backend(gw, "reasoning", state="ready")
        served = await gw.client.post("/v1/chat/completions", json=chat("reasoning-model"))
        assert served.status_code == 200


async def test_the_active_profile_survives_a_restart(tmp_path: Path) -> None:
    async with profile_gateway(tmp_path, fakes()) as gw:
        await gw.client.post("/profiles/production/activate")
    runtimes = fakes()
    async with profile_gateway(tmp_path, runtimes) as gw:
        assert (await gw.client.get("/profiles")).json()["active"] == "production"
        await until_backend(gw, "orchestrator", state="ready")
        assert runtimes["reasoning"].starts == 0  # disabled: never started
        status = (await gw.client.get("/status")).json()
        assert status["profile"]["active"] == "production"


async def test_sleep_mode_in_a_profile_sets_the_yield_method(tmp_path: Path) -> None:
    async with profile_gateway(tmp_path, fakes()) as gw:
        views = {v["name"]: v for v in (await gw.client.get("/backends")).json()["backends"]}
        assert views["reasoning"]["yield_method"] == "sleep"  # dev: sleep_mode: true
        # Its own (default) method, auto: without sleep mode, that is a stop.
        assert views["orchestrator"]["yield_method"] == "auto"
        assert views["orchestrator"]["sleep_mode"] is False
        assert views["reasoning"]["sleep_mode"] is True


async def test_an_unknown_profile_is_404_in_openais_shape(tmp_path: Path) -> None:
    async with profile_gateway(tmp_path, fakes()) as gw:
        response = await gw.client.post("/profiles/gaming/activate")
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "profile_not_found"
        assert "profiles: dev, production" in error["message"]
        assert (await gw.client.get("/profiles")).json()["active"] == "dev"
