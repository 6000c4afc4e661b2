"""`GET /activity`: one entry per finished request, recorded by the access middleware,
with the gateway in process and fake vLLM servers (and a fake provider) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from app.activity import Activity, Entry, WaitKind
from tests.api.test_fallback_triggers import LAZY, world
from tests.api.test_lifecycle_api import lazy, lifecycle_gateway
from tests.fakes.processes import free_port
from tests.fakes.servers import (
    FakeVllmRuntime,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
    until_backend,
)

# A prompt no entry may hold: the activity keeps names and numbers, never text.
CANARY = "zebra-canary-7f3a91 tell me the secret plan"
AGENTS = "sk-agents-activity-0123456789"
WAIT = re.compile(r"^\d+\.\d\ds; reason=(none|queue|wake|limit|yield)$")


def ask(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": CANARY}], **fields}


async def entries(gw: Gateway, **params: Any) -> list[dict[str, Any]]:
    response = await gw.client.get("/activity", params=params)
    assert response.status_code == 200, response.text
    assert CANARY not in response.text
    found: list[dict[str, Any]] = response.json()["entries"]
    return found


def plain(url: str, **fields: Any) -> dict[str, Any]:
    return {"url": url, "models": ["m"], **fields}


@asynccontextmanager
async def one_backend() -> AsyncIterator[Gateway]:
    async with (
        fake_vllm(models=["m"], max_tokens=4) as vllm,
        gateway(gateway_settings({"local": plain(vllm.url)})) as gw,
    ):
        yield gw


async def test_a_chat_is_recorded_with_its_tokens_and_no_prompt_text() -> None:
    async with one_backend() as gw:
        await until_backend(gw, "local", state="ready")  # its first health check passed
        response = await gw.client.post("/v1/chat/completions", json=ask("m"))
        assert response.status_code == 200
        assert "x-microscheduler-wait" not in response.headers  # it did not wait
        usage = response.json()["usage"]
        (entry,) = await entries(gw)
    assert CANARY not in json.dumps(entry)
    assert entry["key"] == "anonymous"  # no client keys configured
    assert (entry["model"], entry["route"], entry["api"]) == ("m", "local", "chat_completions")
    assert entry["status"] == 200
    assert entry["prompt_tokens"] == usage["prompt_tokens"]
    assert entry["completion_tokens"] == usage["completion_tokens"] > 0
    assert entry["tokens_per_s"] > 0
    assert (entry["wait_s"], entry["wait_reason"], entry["fallbacks"]) == (0, "none", 0)
    assert 0 < entry["duration_s"] < 10
    assert set(entry) == {
        "at", "key", "model", "route", "api", "status", "prompt_tokens", "completion_tokens",
        "tokens_per_s", "wait_s", "wait_reason", "fallbacks", "duration_s",
        "fallback_reasons", "expected_wake_s", "stream_error",
    }  # fmt: skip
    assert entry["stream_error"] is None  # it ended well


async def test_a_stream_is_recorded_when_it_ends_with_its_usage() -> None:
    async with one_backend() as gw:
        body = ask("m", stream=True, stream_options={"include_usage": True})
        async with gw.client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            text = (await response.aread()).decode()
        assert text.rstrip().endswith("data: [DONE]")
        (entry,) = await entries(gw)
        # Without usage in the stream, its tokens are not known (not guessed).
        plain_stream = await gw.client.post("/v1/chat/completions", json=ask("m", stream=True))
        assert plain_stream.status_code == 200
        newest = (await entries(gw))[0]
    assert (entry["status"], entry["api"], entry["route"]) == (200, "chat_completions", "local")
    assert entry["completion_tokens"] > 0
    assert entry["prompt_tokens"] > 0
    assert (newest["prompt_tokens"], newest["completion_tokens"]) == (None, None)
    assert newest["tokens_per_s"] is None


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_wake_wait_is_recorded_and_told_in_a_header(tmp_path: Path, stream: bool) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, open_at_start=False, models=["lazy-model"])
    async with lifecycle_gateway({"lazy": lazy(port)}, {"lazy": runtime}, tmp_path) as gw:
        body = ask("lazy-model", max_tokens=4, stream=stream)
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=body))
        await until_backend(gw, "lazy", waiting=1)  # held for the start
        await asyncio.sleep(0.2)  # the thing under test: a wait of at least this long
        runtime.listening.set()
        response = await request
        assert response.status_code == 200
        # The status line went out after the wait (before wake_notice_s): on streams too.
        header = response.headers["x-microscheduler-wait"]
        (entry,) = await entries(gw)
    assert WAIT.match(header), header
    assert header.endswith("; reason=wake")
    assert float(header.split("s;")[0]) >= 0.2
    assert entry["wait_reason"] == "wake"
    assert entry["wait_s"] >= 0.2
    assert abs(entry["wait_s"] - float(header.split("s;")[0])) < 0.01
    assert entry["duration_s"] >= entry["wait_s"]


async def test_a_wait_after_wake_notices_is_told_in_a_comment(tmp_path: Path) -> None:
    port = free_port()
    runtime = FakeVllmRuntime(port, open_at_start=False, models=["lazy-model"])
    async with lifecycle_gateway(
        {"lazy": lazy(port)}, {"lazy": runtime}, tmp_path, wake_notice_s=0.1
    ) as gw:
        body = ask("lazy-model", max_tokens=4, stream=True)
        request = asyncio.create_task(gw.client.post("/v1/chat/completions", json=body))
        await until_backend(gw, "lazy", waiting=1)
        await asyncio.sleep(0.25)  # wake notices go out: the status line is sent already
        runtime.listening.set()
        response = await request
    assert "x-microscheduler-wait" not in response.headers
    blocks = response.text.split("\n\n")
    wait = next(b for b in blocks if b.startswith(": wait "))
    assert WAIT.match(wait.removeprefix(": wait ")), wait
    assert wait.endswith("reason=wake")
    assert blocks.index(wait) < next(i for i, b in enumerate(blocks) if b.startswith("data: "))


async def test_a_request_queued_for_a_slot_waits_with_reason_queue() -> None:
    async with fake_vllm(models=["m"], max_tokens=4) as vllm:
        await vllm.set_faults(ttft=0.3)
        settings = gateway_settings({"local": plain(vllm.url, max_inflight=1)})
        async with gateway(settings) as gw:
            first = asyncio.create_task(gw.client.post("/v1/chat/completions", json=ask("m")))
            await until_backend(gw, "local", in_flight=1)
            second = await gw.client.post("/v1/chat/completions", json=ask("m"))
            assert (await first).status_code == 200
            assert second.status_code == 200
            assert second.headers["x-microscheduler-wait"].endswith("; reason=queue")
            newest = (await entries(gw))[0]
    assert newest["wait_reason"] == "queue"
    assert newest["wait_s"] > 0.1


async def test_a_request_waiting_for_a_connection_waits_with_reason_limit() -> None:
    async with fake_vllm(models=["m"], max_tokens=4) as vllm:
        await vllm.set_faults(ttft=0.3)
        settings = gateway_settings({"local": plain(vllm.url, max_connections=1)})
        async with gateway(settings) as gw:
            first = asyncio.create_task(gw.client.post("/v1/chat/completions", json=ask("m")))
            await until_backend(gw, "local", in_flight=1)
            second = await gw.client.post("/v1/chat/completions", json=ask("m"))
            assert (await first).status_code == 200
            assert second.headers["x-microscheduler-wait"].endswith("; reason=limit")
            newest = (await entries(gw))[0]
    assert newest["wait_reason"] == "limit"
    assert newest["wait_s"] > 0.1


async def test_a_fallback_to_a_provider_is_counted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, entries=["reasoning", "cloud"]) as w:
        await w.local.set_faults(fail_status=500, fail_count=1)
        response = await w.gw.client.post("/v1/chat/completions", json=ask("reasoning"))
        assert response.status_code == 200
        assert response.headers["x-microscheduler-fallbacks"] == "1; reasoning=http_5xx"
        (entry,) = await entries(w.gw)
    assert (entry["model"], entry["route"], entry["status"]) == ("reasoning", "cloud", 200)
    assert entry["fallbacks"] == 1
    assert entry["completion_tokens"] == response.json()["usage"]["completion_tokens"]


async def test_a_wake_timeout_then_a_provider_counts_the_wait_and_the_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runtime = FakeVllmRuntime(free_port(), open_at_start=False, models=["local-model"])
    async with world(
        monkeypatch,
        tmp_path,
        entries=["reasoning", "cloud"],
        backend={**LAZY, "url": f"http://127.0.0.1:{runtime.port}"},
        chain={"wake_timeout_s": 0.3},
        runtime=runtime,
    ) as w:
        response = await w.gw.client.post("/v1/chat/completions", json=ask("reasoning"))
        assert response.status_code == 200
        assert response.headers["x-microscheduler-wait"].endswith("; reason=wake")
        (entry,) = await entries(w.gw)
    assert (entry["route"], entry["fallbacks"], entry["wait_reason"]) == ("cloud", 1, "wake")
    assert entry["wait_s"] >= 0.3


async def test_refused_requests_are_recorded_with_their_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTS_KEY", AGENTS)
    keys = {"agents": {"key_env": "AGENTS_KEY", "models": ["m"]}}
    async with fake_vllm(models=["m", "other"], max_tokens=4) as vllm:
        backends = {"local": plain(vllm.url), "more": {"url": vllm.url, "models": ["other"]}}
        settings = gateway_settings(backends, client_keys={"keys": keys})
        async with gateway(settings) as gw:
            auth = {"authorization": f"Bearer {AGENTS}"}
            post = gw.client.post
            assert (await post("/v1/chat/completions", json=ask("m"))).status_code == 401
            answer = await post("/v1/chat/completions", json=ask("nope"), headers=auth)
            assert answer.status_code == 404
            answer = await post("/v1/chat/completions", json=ask("other"), headers=auth)
            assert answer.status_code == 403
            found = await entries(gw)
    assert [(e["status"], e["key"], e["model"], e["route"]) for e in found] == [
        (403, "agents", None, None),  # refused before routing: no model, no route
        (404, "agents", None, None),
        (401, None, None, None),
    ]
    assert all(e["api"] == "chat_completions" for e in found)
    assert CANARY not in json.dumps(found)


async def test_the_ring_is_bounded_and_filters_by_model_and_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTS_KEY", AGENTS)
    monkeypatch.setenv("BATCH_KEY", "sk-batch-activity-0123456789")
    keys = {"agents": {"key_env": "AGENTS_KEY"}, "batch": {"key_env": "BATCH_KEY"}}
    async with fake_vllm(models=["m", "other"], max_tokens=2) as vllm:
        backends = {"local": plain(vllm.url), "more": {"url": vllm.url, "models": ["other"]}}
        settings = gateway_settings(backends, client_keys={"keys": keys}, activity_size=4)
        async with gateway(settings) as gw:
            sent = [("agents", "m"), ("batch", "m"), ("agents", "other"), ("batch", "other"),
                    ("agents", "m"), ("batch", "other")]  # fmt: skip
            for name, model in sent:
                secret = AGENTS if name == "agents" else "sk-batch-activity-0123456789"
                response = await gw.client.post(
                    "/v1/chat/completions",
                    json=ask(model),
                    headers={"authorization": f"Bearer {secret}"},
                )
                assert response.status_code == 200
            answer = (await gw.client.get("/activity")).json()
            by_model = await entries(gw, model="other")
            by_key = await entries(gw, key="agents")
            both = await entries(gw, model="other", key="batch")
            limited = await entries(gw, limit=2)
            too_few = await gw.client.get("/activity", params={"limit": 0})
            listed = await gw.client.get(
                "/v1/models", headers={"authorization": f"Bearer {AGENTS}"}
            )
            assert listed.status_code == 200
            after_listing = (await gw.client.get("/activity")).json()
    assert (answer["size"], answer["held"]) == (4, 4)
    # Newest first; the two oldest went.
    assert [(e["key"], e["model"]) for e in answer["entries"]] == list(reversed(sent[2:]))
    assert [(e["key"], e["model"]) for e in by_model] == [("batch", "other"), ("batch", "other"),
                                                           ("agents", "other")]  # fmt: skip
    assert [(e["key"], e["model"]) for e in by_key] == [("agents", "m"), ("agents", "other")]
    assert [(e["key"], e["model"]) for e in both] == [("batch", "other")] * 2
    assert limited == answer["entries"][:2]
    assert too_few.status_code == 400
    assert after_listing["entries"] == answer["entries"]  # model listings are not activity


async def test_activity_is_admin_only() -> None:
    async with fake_vllm(models=["m"]) as vllm:
        settings = gateway_settings(
            {"local": plain(vllm.url)},
            admin_key=SecretStr("admin-secret-activity"),
            api_keys=(SecretStr("client-key-activity"),),
        )
        async with gateway(settings) as gw:
            client = {"authorization": "Bearer client-key-activity"}
            chat = await gw.client.post("/v1/chat/completions", json=ask("m"), headers=client)
            assert chat.status_code == 200
            anonymous = await gw.client.get("/activity")
            as_client = await gw.client.get("/activity", headers=client)
            admin = {"authorization": "Bearer admin-secret-activity"}
            as_admin = await gw.client.get("/activity", headers=admin)
    assert anonymous.status_code == 401
    assert as_client.status_code == 401
    assert "model" not in as_client.text
    assert as_admin.status_code == 200
    assert len(as_admin.json()["entries"]) == 1


def test_the_ring_keeps_the_last_entries_only() -> None:
    ring = Activity(size=3)
    for n in range(1000):
        ring.record(
            Entry(
                at=float(n), key=None, model="m", route="b", api="chat_completions", status=200,
                prompt_tokens=1, completion_tokens=n, wait_s=0.0, wait_reason=WaitKind.NONE,
                fallbacks=0, duration_s=1.0,
            )
        )  # fmt: skip
    assert len(ring) == 3
    assert [e.completion_tokens for e in ring.recent(10)] == [999, 998, 997]


async def test_a_start_held_for_another_models_residency_waits_with_reason_yield(
    tmp_path: Path,
) -> None:
    port_a, port_b = free_port(), free_port()
    runtimes = {
        "a": FakeVllmRuntime(port_a, models=["model-a"]),
        "b": FakeVllmRuntime(port_b, models=["model-b"]),
    }
    backends = {  # 20000 + 20000 MiB do not fit in the simulated 32768
        "a": lazy(port_a, models=["model-a"], vram_mib=20000, priority=10, min_resident_s=0.6),
        "b": lazy(port_b, models=["model-b"], vram_mib=20000, priority=50),
    }
    async with lifecycle_gateway(backends, runtimes, tmp_path) as gw:
        first = await gw.client.post("/v1/chat/completions", json=ask("model-a", max_tokens=2))
        assert first.status_code == 200
        response = await gw.client.post("/v1/chat/completions", json=ask("model-b", max_tokens=2))
        assert response.status_code == 200
        assert response.headers["x-microscheduler-wait"].endswith("; reason=yield")
        newest = (await entries(gw))[0]
    assert (newest["model"], newest["wait_reason"]) == ("model-b", "yield")
    assert newest["wait_s"] >= 0.3
