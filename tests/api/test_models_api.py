"""`/models`, `/models/load`, `/models/unload` and `/models/sse` as llama.cpp's router has
them, over the gateway's lifecycle: who may, a wait or not, a refusal that says why, and
a lazy wake streamed as loading (with its progress) then loaded. Fake vLLM runtimes in
process on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from app.api import models
from app.services import Services
from tests.api.test_lifecycle_api import CHAT, lazy, lifecycle_gateway, pinned
from tests.fakes.processes import free_port
from tests.fakes.servers import FakeVllmRuntime, Gateway
from tests.fakes.waits import until

ADMIN, OPS, AGENT = "admin-secret-models", "sk-ops-models", "sk-agent-models"
PREFIX = "(EngineCore_DP0 pid=1) INFO 11-29 08:20:01"
LOAD_START = f"{PREFIX} [gpu_model_runner.py:4979] Starting to load model lazy-model...\n"
HALF_THE_SHARDS = (
    "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.9it/s]\n"
)


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPS_KEY", OPS)
    monkeypatch.setenv("AGENT_KEY", AGENT)


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def services_of(gw: Gateway) -> Services:
    services: Services = gw.app.state.services
    return services


class TalkingRuntime(FakeVllmRuntime):
    """The fake runtime with an output (`OutputSource`): the lines the test puts in
    `lines`, read by the gateway for the load's progress as it reads vLLM's."""

    def __init__(self, port: int, **options: Any) -> None:
        super().__init__(port, **options)
        self.lines: asyncio.Queue[str] = asyncio.Queue()

    async def logs(self, *, tail: int, follow: bool) -> AsyncIterator[str]:
        for _ in ():
            yield ""

    async def run_output(self) -> AsyncIterator[str]:
        while True:
            yield await self.lines.get()


async def test_the_admin_loads_and_unloads_and_get_models_says_so(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    backends = {"lazy": lazy(port, aliases=["quick"], idle={"method": "stop"})}
    async with lifecycle_gateway(backends, {"lazy": runtime}, tmp_path) as gw:
        loaded = await gw.client.post("/models/load", json={"model": "quick"})
        listed = await gw.client.get("/models")
        again = await gw.client.post("/models/load", json={"model": "lazy-model"})
        unloaded = await gw.client.post("/models/unload", json={"model": "lazy-model"})
        after = await gw.client.get("/models")
    assert loaded.status_code == 200, loaded.text
    assert loaded.json() == {
        "success": True,
        "model": "quick",
        "status": {"value": "loaded", "state": "ready"},
    }
    assert {m["id"]: m["status"]["value"] for m in listed.json()["data"]} == {
        "lazy-model": "loaded",
        "quick": "loaded",
    }
    assert listed.json()["object"] == "list"
    assert again.json()["success"] is True  # loaded already: nothing to do
    assert runtime.starts == 1
    assert unloaded.status_code == 200, unloaded.text
    status = unloaded.json()["status"]
    assert status["value"] == "unloaded"
    assert "unload" in status["reason"]
    assert runtime.stops == 1
    assert after.json()["data"][0]["status"]["value"] == "unloaded"


async def test_a_load_without_wait_answers_while_it_loads(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"], open_at_start=False)
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
        begun = await gw.client.post("/models/load", json={"model": "lazy-model", "wait": False})
        runtime.listening.set()

        async def loaded() -> bool:
            listed = (await gw.client.get("/models")).json()["data"]
            return bool(listed[0]["status"]["value"] == "loaded")

        await until(loaded, what="lazy-model loaded")
    assert begun.status_code == 200, begun.text
    assert begun.json()["status"]["value"] == "loading"
    assert "progress" in begun.json()["status"]


async def test_a_key_without_lifecycle_may_not_load_or_unload(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    keys = {
        "ops": {"key_env": "OPS_KEY", "lifecycle": True, "models": ["lazy-model"]},
        "agent": {"key_env": "AGENT_KEY"},
    }
    async with lifecycle_gateway(
        {"lazy": lazy(port, aliases=["quick"])}, {"lazy": runtime}, tmp_path,
        admin_key=SecretStr(ADMIN), client_keys={"keys": keys},
    ) as gw:  # fmt: skip
        body = {"model": "lazy-model"}
        agent_load = await gw.client.post("/models/load", json=body, headers=bearer(AGENT))
        agent_unload = await gw.client.post("/models/unload", json=body, headers=bearer(AGENT))
        nobody = await gw.client.post("/models/load", json=body)
        out_of_scope = await gw.client.post(
            "/models/load", json={"model": "quick"}, headers=bearer(OPS)
        )
        starts_before_ops = runtime.starts
        ops = await gw.client.post("/models/load", json=body, headers=bearer(OPS))
        seen_by_ops = await gw.client.get("/models", headers=bearer(OPS))
    assert agent_load.status_code == 403
    assert agent_unload.status_code == 403
    error = agent_load.json()["error"]
    assert "lifecycle: true" in error["message"]
    assert error["code"] == "permission_denied"  # the gateway's (OpenAI's) envelope
    assert nobody.status_code == 401
    assert out_of_scope.status_code == 403
    assert starts_before_ops == 0  # none of the refused calls started it
    assert ops.status_code == 200, ops.text
    assert [m["id"] for m in seen_by_ops.json()["data"]] == ["lazy-model"]  # its scope


async def test_a_refused_load_says_why_in_the_apis_error_format(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
        held = await gw.client.post("/vram/yield", json={"reason": "game"})
        assert held.status_code == 200, held.text
        blocked = await gw.client.post("/models/load", json={"model": "lazy-model"})
        unknown = await gw.client.post("/models/load", json={"model": "nowhere"})
        empty = await gw.client.post("/models/load")
        listed = (await gw.client.get("/models")).json()["data"]
    assert blocked.status_code == 409
    assert "blocked by" in blocked.json()["error"]["message"]
    assert listed[0]["status"]["blocked_by"]  # the list says so before anyone tries
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert empty.status_code == 400
    assert runtime.starts == 0


async def test_a_load_is_refused_where_a_request_would_be_and_says_why(tmp_path: Path) -> None:
    """Admission decides a load as it decides a request's wake: a model that fits only by
    evicting a pinned one of higher priority gets the same 503, naming what holds the GPU;
    a replica group is loaded by one replica's name."""
    resident, big, first, second = free_port(), free_port(), free_port(), free_port()
    backends = {
        "pinned": pinned(resident),
        "big": lazy(big, models=["big-model"], vram_mib=20000),
        "g1": lazy(first, models=["group-model"], replica_of="g", vram_mib=4000),
        "g2": lazy(second, models=["group-model"], replica_of="g", vram_mib=4000),
    }
    runtimes = {
        "pinned": FakeVllmRuntime(resident, models=["pinned-model"]),
        "big": FakeVllmRuntime(big, models=["big-model"]),
        "g1": FakeVllmRuntime(first, models=["group-model"]),
        "g2": FakeVllmRuntime(second, models=["group-model"]),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        asked = await gw.client.post("/v1/chat/completions", json={**CHAT, "model": "big-model"})
        loaded = await gw.client.post("/models/load", json={"model": "big-model"})
        group = await gw.client.post("/models/load", json={"model": "group-model"})
        replica = await gw.client.post("/models/load", json={"model": "g2"})
        assert runtimes["pinned"].stops == 0  # not evicted for either
    assert asked.status_code == 503, asked.text
    assert loaded.status_code == 503, loaded.text
    assert loaded.json()["error"]["code"] == asked.json()["error"]["code"] == "backend_no_vram"
    assert "pinned" in loaded.json()["error"]["message"]
    assert group.status_code == 409
    assert "load or unload one replica by its backend name" in group.json()["error"]["message"]
    assert replica.status_code == 200, replica.text
    assert replica.json()["status"]["value"] == "loaded"


def parse(chunk: bytes) -> Any:
    """llama.cpp's `/models/sse` message: one `data:` line of JSON, no event name."""
    text = chunk.decode()
    assert text.startswith("data: "), text
    assert text.endswith("\n\n"), text
    return json.loads(text[len("data: ") :])


async def next_status(messages: AsyncGenerator[bytes, None]) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            chunk = await anext(messages)
            if not chunk.startswith(b":"):
                event: dict[str, Any] = parse(chunk)
                return event


async def test_sse_streams_a_lazy_wake_as_loading_with_progress_then_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "MIN_INTERVAL_S", 0.0)
    port = free_port()
    runtime = TalkingRuntime(port, models=["lazy-model"], open_at_start=False)
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
        services = services_of(gw)
        sub = services.events.subscribe()
        # The in-process transport buffers whole responses: read the route's generator.
        messages = models._stream(services, lambda _: True, sub)
        first = await next_status(messages)
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=CHAT))
        seen = [first]
        while seen[-1]["data"]["status"] != "loading":
            seen.append(await next_status(messages))
        runtime.lines.put_nowait(LOAD_START)
        runtime.lines.put_nowait(HALF_THE_SHARDS)
        while seen[-1]["data"].get("progress", {}).get("percent") != 40:
            seen.append(await next_status(messages))
        runtime.listening.set()
        while seen[-1]["data"]["status"] != "loaded":
            seen.append(await next_status(messages))
        assert (await request).status_code == 200
        services.events.end_streams("stopping")  # the gateway stops: the stream ends
        with pytest.raises(StopAsyncIteration):
            await next_status(messages)
    assert first == {
        "model": "lazy-model",
        "event": "model_status",
        "data": {"status": "unloaded", "state": "stopped"},
    }
    values = [event["data"]["status"] for event in seen]
    assert values[0] == "unloaded"
    assert values[-1] == "loaded"
    assert set(values[1:-1]) == {"loading"}
    progress = seen[-2]["data"]["progress"]
    assert progress["stages"] == ["model"]
    assert progress["current"] == "model"
    assert progress["value"] == 0.4
    assert progress["phase"] == "loading_weights"
    assert "progress" not in seen[-1]["data"]
    assert services.events.subscribers == 0  # closed with the stream


async def test_sse_needs_a_key_as_v1_models_does(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"])
    keys = {"agent": {"key_env": "AGENT_KEY"}}
    async with lifecycle_gateway(
        {"lazy": lazy(port)}, {"lazy": runtime}, tmp_path,
        admin_key=SecretStr(ADMIN), client_keys={"keys": keys},
    ) as gw:  # fmt: skip
        refused = await gw.client.get("/models/sse")
        listed = await gw.client.get("/models")
    assert refused.status_code == 401
    assert listed.status_code == 401


def test_a_change_is_an_event_a_seconds_left_is_not() -> None:
    loading = {"value": "loading", "state": "starting", "progress": {"percent": 5, "eta_s": 9}}
    later = {**loading, "progress": {"percent": 5, "eta_s": 8}}
    further = {**loading, "progress": {"percent": 40, "eta_s": 8}}
    assert models.changes({"m": loading}, {"m": later}) == []
    assert models.changes({"m": loading}, {"m": further}) == [
        {
            "model": "m",
            "event": "model_status",
            "data": {"status": "loading", "state": "starting", "progress": further["progress"]},
        }
    ]
    assert models.changes({"m": loading}, {}) == [{"model": "m", "event": "model_remove"}]
