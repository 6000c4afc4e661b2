"""Ollama's API on the gateway, driven by Ollama's own Python client (`ollama`), unmodified:
list, ps, show, chat streamed and not, generate, embed, `keep_alive: 0` unloading (after an
answer, and Open WebUI's eject), an empty-prompt load, and refusals in Ollama's format."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from pydantic import SecretStr

from app.api.ollama.keep_alive import REFUSED_EVENT
from app.lifecycle.state import BackendState
from app.runtimes.base import Runtime
from app.runtimes.external import ExternalRuntime
from app.services import Seams
from app.settings.backends import BackendConfig
from app.vram.holders import residents
from tests.api.test_lifecycle_api import lazy, lifecycle_gateway
from tests.api.test_model_verbs import services_of, state
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeServer,
    FakeVllmRuntime,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
)
from tests.fakes.waits import until

OPS, AGENT = "sk-ops-ollama", "sk-agent-ollama"
ADMIN = "admin-ollama"
HI = [{"role": "user", "content": "Say hello"}]
MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPS_KEY", OPS)
    monkeypatch.setenv("AGENT_KEY", AGENT)


@asynccontextmanager
async def world(
    tmp_path: Path, *, keys: bool = False, **fields: Any
) -> AsyncIterator[tuple[Gateway, FakeServer, FakeVllmRuntime]]:
    """A lazy chat backend the gateway starts (`lazy-model`), an embedding server
    (`embed-model`); with `keys`, an admin key and two client keys: `ops` (lifecycle) and
    `agent` (not)."""
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"], max_tokens=4, task="generate")
    extra: dict[str, Any] = {}
    if keys:
        extra = {
            "admin_key": SecretStr(ADMIN),
            "client_keys": {"keys": {
                "ops": {"key_env": "OPS_KEY", "lifecycle": True},
                "agent": {"key_env": "AGENT_KEY", "models": ["lazy-model"]},
            }},
        }  # fmt: skip
    async with fake_vllm(models=["embed-model"], task="embed") as embedder:
        backends = {
            "lazy": lazy(port, idle_ttl_s=300),
            "embedder": {"url": embedder.url, "models": ["embed-model"]},
        }
        settings = gateway_settings(backends, state_dir=tmp_path / "var",
                                    gpu={"probe": "sim"}, **extra, **fields)  # fmt: skip

        def runtime_for(name: str, config: BackendConfig) -> Runtime:
            return runtime if name == "lazy" else ExternalRuntime(str(config.url))

        async with gateway(settings, seams=Seams(runtime_factory=runtime_for)) as gw:
            yield gw, embedder, runtime


def client(gw: Gateway, key: str | None = None) -> ollama.AsyncClient:
    """Ollama's client as an application builds it (host, headers), over the app in process."""
    transport = httpx.ASGITransport(app=gw.app, client=("127.0.0.1", 50002))
    headers = {"Authorization": f"Bearer {key}"} if key is not None else None
    return ollama.AsyncClient(host="http://localhost", headers=headers, transport=transport)


def tokens(gw: Gateway, route: str, kind: str) -> float:
    value = gw.registry.get_sample_value(
        "microscheduler_tokens_total", {"route": route, "type": kind}
    )
    return value or 0.0


async def test_version_tags_show_and_ps_as_ollama_lists_them(tmp_path: Path) -> None:
    async with world(tmp_path) as (gw, _embedder, _runtime):
        api = client(gw)
        version = (await gw.client.get("/api/version")).json()["version"]
        assert [int(part) for part in version.split(".")]  # Open WebUI reads dotted ints
        listed = await api.list()
        names = {m.model: m for m in listed.models}
        assert set(names) == {"lazy-model:latest", "embed-model:latest"}
        assert names["lazy-model:latest"].size == 12000 * MIB  # its footprint (vram_mib)
        # Loaded: the external embedding server only (no idle stop: "forever").
        (external,) = (await api.ps()).models
        assert external.model == "embed-model:latest"
        assert external.expires_at is not None
        assert external.expires_at.year >= 2100
        shown = await api.show("lazy-model")
        assert shown.capabilities == ["completion"]
        assert (await api.show("embed-model:latest")).capabilities == ["embedding"]

        await api.chat(model="lazy-model", messages=HI, stream=False)
        running = (await api.ps()).models  # the longest time left first, as Ollama sorts
        assert [m.model for m in running] == ["embed-model:latest", "lazy-model:latest"]
        model = running[1]
        assert model.size == 12000 * MIB
        assert model.expires_at is not None
        left = (model.expires_at - datetime.now(UTC)).total_seconds()
        assert 250 < left <= 300  # idle_ttl_s counting down from the answer's end


async def test_chat_whole_and_streamed_with_ollamas_counts(tmp_path: Path) -> None:
    async with world(tmp_path) as (gw, _embedder, _runtime):
        api = client(gw)
        options = {"temperature": 0.2, "num_predict": 3, "mystery": 1}  # `mystery`: ignored
        answer = await api.chat(
            model="lazy-model:latest", messages=HI, stream=False, options=options
        )
        assert answer.done is True
        assert answer.done_reason == "length"  # num_predict reached, as Ollama says it
        assert answer.message.role == "assistant"
        assert answer.message.content
        assert answer.eval_count == 3
        assert answer.prompt_eval_count
        assert answer.prompt_eval_count > 0
        assert answer.total_duration
        assert answer.total_duration > 0
        assert answer.model == "lazy-model:latest"  # as the client named it

        parts = [
            part async for part in await api.chat(model="lazy-model", messages=HI, stream=True)
        ]
        assert all(p.done is False for p in parts[:-1])
        assert parts[-1].done is True
        assert "".join(p.message.content or "" for p in parts)
        last = parts[-1]
        assert last.done_reason in ("stop", "length")
        assert last.eval_count
        assert last.eval_count > 0
        assert last.prompt_eval_count == answer.prompt_eval_count
        assert last.eval_duration is not None
        assert last.total_duration is not None
        # Counted like any other request: both answers' tokens on the route's counters.
        assert tokens(gw, "lazy", "completion") == 3 + last.eval_count
        assert tokens(gw, "lazy", "prompt") == 2 * last.prompt_eval_count


async def test_generate_and_embed(tmp_path: Path) -> None:
    async with world(tmp_path) as (gw, embedder, _runtime):
        api = client(gw)
        answer = await api.generate(model="lazy-model", prompt="Why is the sky blue?",
                                    system="Be brief.", stream=False)  # fmt: skip
        assert answer.response
        assert answer.done
        assert answer.eval_count
        streamed = [
            p async for p in await api.generate(model="lazy-model", prompt="Hi", stream=True)
        ]
        assert streamed[-1].done
        assert "".join(p.response or "" for p in streamed)

        embedded = await api.embed(model="embed-model", input=["one", "two"])
        assert len(embedded.embeddings) == 2
        assert all(len(vector) == 8 for vector in embedded.embeddings)  # the fake's dim
        sent = (await embedder.stats())["requests"][-1]
        assert sent["path"] == "/v1/embeddings"
        assert sent["body"]["input"] == ["one", "two"]


async def test_keep_alive_zero_unloads_after_the_answer(tmp_path: Path) -> None:
    async with world(tmp_path) as (gw, _embedder, runtime):
        backend = services_of(gw).backends["lazy"]
        answer = await client(gw).chat(model="lazy-model", messages=HI, stream=False, keep_alive=0)
        assert answer.message.content  # answered first
        await until(lambda: state(backend) is BackendState.STOPPED)
        assert runtime.stops == 1


async def test_open_webui_eject_and_an_empty_prompt_load(tmp_path: Path) -> None:
    async with world(tmp_path) as (gw, _embedder, _runtime):
        backend = services_of(gw).backends["lazy"]
        loaded = await client(gw).generate(model="lazy-model")  # no prompt: load
        assert loaded.done_reason == "load"
        assert state(backend) is BackendState.READY
        # Open WebUI's eject, byte for byte: the name with `:latest`, `prompt: ""`, no
        # `stream` (routers/ollama.py `unload_model`).
        body = {"model": "lazy-model:latest", "keep_alive": 0, "prompt": ""}
        ejected = await gw.client.post("/api/generate", content=json.dumps(body))
        assert ejected.status_code == 200
        assert ejected.json()["done_reason"] == "unload"
        assert state(backend) is BackendState.STOPPED  # at once, before the answer
        # A chat without messages does the same (Ollama's ChatHandler).
        loaded_by_chat = await client(gw).chat(model="lazy-model", messages=[])
        assert loaded_by_chat.done_reason == "load"
        assert state(backend) is BackendState.READY
        unloaded = await client(gw).chat(model="lazy-model", messages=[], keep_alive=0)
        assert unloaded.done_reason == "unload"
        assert unloaded.message.role == "assistant"
        assert state(backend) is BackendState.STOPPED


async def test_refusals_are_in_ollamas_format(tmp_path: Path) -> None:
    async with world(tmp_path, keys=True) as (gw, _embedder, _runtime):
        backend = services_of(gw).backends["lazy"]
        agent = client(gw, AGENT)
        with pytest.raises(ollama.ResponseError) as unknown:
            await agent.chat(model="nowhere", messages=HI)
        assert unknown.value.status_code == 404
        with pytest.raises(ollama.ResponseError) as out_of_scope:  # a refused load
            await agent.generate(model="embed-model")
        assert out_of_scope.value.status_code == 403
        await agent.chat(model="lazy-model", messages=HI, stream=False)  # learns its context
        with pytest.raises(ollama.ResponseError) as too_long:
            await agent.chat(model="lazy-model", messages=HI, stream=False,
                             options={"num_ctx": 1_000_000})  # fmt: skip
        assert too_long.value.status_code == 400
        assert "num_ctx" in too_long.value.error
        assert "8192" in too_long.value.error
        with pytest.raises(ollama.ResponseError) as not_served:
            await agent.embed(model="lazy-model", input="x")
        assert not_served.value.status_code == 404
        assert "(ollama, nor embeddings it translates to)" in not_served.value.error
        with pytest.raises(ollama.ResponseError) as no_key:
            await client(gw).list()
        assert no_key.value.status_code == 401
        assert no_key.value.error  # Ollama's `{"error": "..."}`, read by its client
        assert (await gw.client.get("/api/version")).status_code == 200  # no key, as Ollama

        # keep_alive 0 from a key that may not unload: answered, not unloaded, said why.
        answer = await agent.chat(model="lazy-model", messages=HI, stream=False, keep_alive=0)
        assert answer.message.content
        events = [e for e in services_of(gw).events.recent() if e["kind"] == REFUSED_EVENT]
        assert events
        assert "lifecycle: true" in events[-1]["reason"]
        assert state(backend) is BackendState.READY
        # Its eject is a 403 in Ollama's format; the ops key (lifecycle) may.
        with pytest.raises(ollama.ResponseError) as denied:
            await agent.generate(model="lazy-model", keep_alive=0)
        assert denied.value.status_code == 403
        assert "lifecycle: true" in denied.value.error
        ejected = await client(gw, OPS).generate(model="lazy-model", keep_alive=0)
        assert ejected.done_reason == "unload"
        assert state(backend) is BackendState.STOPPED


async def test_a_stream_held_by_a_wake_stays_ndjson(tmp_path: Path) -> None:
    """While the backend starts, a held stream gets empty `done: false` lines (not SSE
    comments, which Ollama's clients cannot parse), then the answer."""
    port = free_port()
    runtime = FakeVllmRuntime(port, models=["lazy-model"], max_tokens=4, startup_delay_s=0.4)
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path,
                                 wake_notice_s=0.1) as gw:  # fmt: skip
        response = await gw.client.post("/api/chat", json={"model": "lazy-model", "messages": HI})
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(text) for text in response.text.splitlines()]
        assert lines[0]["message"]["content"] == ""
        assert lines[0]["done"] is False
        assert lines[-1]["done"] is True
        assert "".join(line["message"]["content"] for line in lines)


async def test_a_keep_alive_duration_is_a_residency_floor(tmp_path: Path) -> None:
    """`keep_alive: "10m"` keeps it past its idle_ttl_s (the reaper's next look, a minute on,
    leaves it); `-1` pins it (not evictable, no expiry) until it is unloaded; a key that may
    not unload sets no floor, and the event says why."""
    async with world(tmp_path, keys=True) as (gw, _embedder, _runtime):
        backend = services_of(gw).backends["lazy"]
        ops, agent = client(gw, OPS), client(gw, AGENT)
        await agent.chat(model="lazy-model", messages=HI, stream=False, keep_alive="10m")
        assert backend.requests.floor.until is None
        events = [e for e in services_of(gw).events.recent() if e["kind"] == REFUSED_EVENT]
        assert len(events) == 1

        await ops.chat(model="lazy-model", messages=HI, stream=False, keep_alive="10m")
        (model,) = [m for m in (await ops.ps()).models if m.model == "lazy-model:latest"]
        assert model.expires_at is not None
        left = (model.expires_at - datetime.now(UTC)).total_seconds()
        assert 590 < left <= 600  # the floor, past idle_ttl_s (300)
        assert not await backend.stop_if_idle(time.monotonic() + 360)  # past the TTL: kept
        assert state(backend) is BackendState.READY

        await ops.generate(model="lazy-model", keep_alive=-1)  # a load that pins it
        (pinned,) = [r for r in residents([backend]) if r.name == "lazy"]
        assert pinned.lazy is False  # another model's start cannot evict it
        (model,) = [m for m in (await ops.ps()).models if m.model == "lazy-model:latest"]
        assert model.expires_at is not None
        assert model.expires_at.year >= 2100
        assert not await backend.stop_if_idle(time.monotonic() + 10**6)

        await ops.generate(model="lazy-model", keep_alive=0)  # the unload ends the pin
        assert state(backend) is BackendState.STOPPED
        assert backend.requests.floor.until is None


async def test_a_start_refused_by_a_keep_alive_says_so(tmp_path: Path) -> None:
    """Another model that needs the memory is refused with the keep_alive named: a pin
    (-1) as a pinned backend is, a duration longer than its start may wait at once."""
    port, other = free_port(), free_port()
    runtimes = {
        "lazy": FakeVllmRuntime(port, models=["lazy-model"], max_tokens=4, task="generate"),
        "big": FakeVllmRuntime(other, models=["big-model"], max_tokens=4, task="generate"),
    }
    backends = {"lazy": lazy(port), "big": lazy(other, models=["big-model"], vram_mib=24000)}
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        api = client(gw)
        await api.generate(model="lazy-model", keep_alive=-1)
        with pytest.raises(ollama.ResponseError) as pinned:
            await api.chat(model="big-model", messages=HI, stream=False)
        assert pinned.value.status_code == 503
        assert "backend lazy 12000 MiB (a client's keep_alive, until unloaded)" in (
            pinned.value.error
        )
        await api.generate(model="lazy-model", keep_alive=0)
        await api.generate(model="lazy-model", keep_alive="1h")
        with pytest.raises(ollama.ResponseError) as kept:
            await api.chat(model="big-model", messages=HI, stream=False)
        assert "(a client's keep_alive), longer than this start waits" in kept.value.error
