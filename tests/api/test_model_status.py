"""`GET /v1/models` says each model's state in llama.cpp's router shape (`status.value`:
loaded, loading with its progress, sleeping, unloaded, failed), and the official openai
SDK, unmodified, keeps it as an extra field. Fake vLLM runtimes in process on 127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.api.test_lifecycle_api import CHAT, lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, Gateway, sdk_http
from tests.fakes.waits import until


async def statuses(gw: Gateway) -> dict[str, dict[str, Any]]:
    """Each listed id's `status`, as the openai SDK reads `/v1/models`."""
    async with sdk_http(gw) as http:
        sdk = openai.AsyncOpenAI(
            api_key="none", base_url="http://gateway/v1", http_client=http, max_retries=0
        )
        page = await sdk.models.list()
    return {model.id: getattr(model, "status") for model in page.data}  # noqa: B009


async def test_the_sdk_reads_unloaded_loading_with_progress_then_loaded(tmp_path: Path) -> None:
    port, first, second = free_port(), free_port(), free_port()
    backends = {
        "lazy": lazy(port, aliases=["fast"]),
        # A replica group: its best member speaks for it.
        "g1": lazy(first, models=["group-model"], replica_of="g", vram_mib=8000),
        "g2": lazy(second, models=["group-model"], replica_of="g", vram_mib=8000),
    }
    runtimes = {
        "lazy": FakeVllmRuntime(port, models=["lazy-model"], open_at_start=False),
        "g1": FakeVllmRuntime(first, models=["group-model"]),
        "g2": FakeVllmRuntime(second, models=["group-model"]),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        before = await statuses(gw)
        assert before["lazy-model"] == {"value": "unloaded", "state": "stopped"}
        assert before["fast"] == before["lazy-model"]  # an alias: its backend's
        assert before["group-model"]["replicas"] == {"g1": "unloaded", "g2": "unloaded"}

        # A request wakes it; its server's port stays closed until the test opens it.
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=CHAT))

        async def loading() -> dict[str, Any] | None:
            status = (await statuses(gw))["lazy-model"]
            return status if status["value"] == "loading" else None

        status = await until(loading, what="lazy-model loading")
        assert status["state"] == "starting"
        progress = status["progress"]
        assert progress["stages"] == ["model"]
        assert progress["current"] == "model"
        assert 0 <= progress["value"] <= 1
        assert progress["percent"] == round(progress["value"] * 100)
        assert isinstance(progress["phase"], str)
        runtimes["lazy"].listening.set()
        assert (await request).status_code == 200
        group_chat = {**CHAT, "model": "group-model"}
        assert (await gw.client.post("/v1/chat/completions", json=group_chat)).status_code == 200
        after = await statuses(gw)
        retrieved = (await gw.client.get("/v1/models/fast")).json()
    assert after["lazy-model"] == {"value": "loaded", "state": "ready"}
    assert retrieved["status"] == after["lazy-model"]
    group = after["group-model"]
    assert group["value"] == "loaded"  # one member woke; the other is still unloaded
    assert sorted(group["replicas"].values()) == ["loaded", "unloaded"]


async def test_a_key_sees_the_status_of_its_models_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAM_KEY", "team-secret")
    port, other = free_port(), free_port()
    backends = {"lazy": lazy(port), "other": lazy(other, models=["other-model"])}
    runtimes = {
        "lazy": FakeVllmRuntime(port, models=["lazy-model"]),
        "other": FakeVllmRuntime(other, models=["other-model"]),
    }
    keys = {"keys": {"team": {"key_env": "TEAM_KEY", "models": ["lazy-model"]}}}
    async with lifecycle_gateway(backends, runtimes, tmp_path, client_keys=keys) as gw:
        response = await gw.client.get(
            "/v1/models", headers={"authorization": "Bearer team-secret"}
        )
    assert response.status_code == 200
    assert [(m["id"], m["status"]["value"]) for m in response.json()["data"]] == [
        ("lazy-model", "unloaded")
    ]
