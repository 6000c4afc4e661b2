"""Replica groups in process: two fake vLLM servers serve one model id; the official
`openai` SDK is the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.lifecycle.blocks import BlockKind
from app.services import Seams
from tests.fakes.processes import free_port
from tests.fakes.provider import cloud_settings, fake_openai_provider
from tests.fakes.servers import (
    FakeServer,
    FakeVllmRuntime,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
    sdk_http,
    until_backend,
)
from tests.fakes.waits import until

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
PICKS = "microscheduler_replica_picks_total"
CLOUD_KEY = "sk-test-cloud-0123456789"
UPSTREAM_ERRORS = "microscheduler_upstream_errors_total"


def metric(gw: Gateway, name: str, **labels: str) -> float:
    value = gw.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@asynccontextmanager
async def pool(
    **vllm: Any,
) -> AsyncIterator[tuple[Gateway, openai.AsyncOpenAI, FakeServer, FakeServer]]:
    """Backends `qwen-a` and `qwen-b`, replicas of `qwen-pool` serving `qwen` (alias
    `chat`), and an `openai` client without retries."""
    async with fake_vllm(models=["qwen"], **vllm) as a, fake_vllm(models=["qwen"], **vllm) as b:
        member = {"models": ["qwen"], "aliases": ["chat"], "replica_of": "qwen-pool"}
        settings = gateway_settings(
            {"qwen-a": {"url": a.url, **member}, "qwen-b": {"url": b.url, **member}}
        )
        async with gateway(settings) as gw, sdk_http(gw) as http:
            for name in ("qwen-a", "qwen-b"):
                await until_ready(gw, name)
            client = openai.AsyncOpenAI(
                api_key="none", base_url="http://gateway/v1", http_client=http, max_retries=0
            )
            yield gw, client, a, b


async def until_ready(gw: Gateway, name: str) -> None:
    async def ready() -> bool:
        views = (await gw.client.get("/backends")).json()["backends"]
        return any(v["name"] == name and v["state"] == "ready" for v in views)

    await until(ready, what=lambda: f"{name} ready")


async def served(server: FakeServer) -> int:
    return len((await server.stats())["requests"])


async def test_concurrent_streams_are_spread_over_the_replicas() -> None:
    async with pool(tokens_per_second=20, max_tokens=8) as (gw, client, a, b):

        async def one() -> str:
            stream = await client.chat.completions.create(
                model="chat", messages=HI, stream=True, max_tokens=8
            )
            text = ""
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
            return text

        texts = await asyncio.gather(*(one() for _ in range(20)))
        assert all(texts)
        on_a, on_b = await served(a), await served(b)
        assert on_a + on_b == 20
        assert 8 <= on_a <= 12, (on_a, on_b)
        assert 8 <= on_b <= 12, (on_a, on_b)
        for name, count in (("qwen-a", on_a), ("qwen-b", on_b)):
            labels = {"group": "qwen-pool", "backend": name}
            assert metric(gw, PICKS, **labels, why="least_loaded") == count
            assert metric(gw, PICKS, **labels, why="retry") == 0
            assert metric(gw, PICKS, **labels, why="woken") == 0
            requests = {
                "model": "chat",
                "backend": name,
                "endpoint": "chat_completions",
                "status": "200",
            }
            assert metric(gw, "microscheduler_requests_total", **requests) == count


async def test_a_replica_failing_before_the_first_byte_is_retried_on_the_other() -> None:
    async with pool(max_tokens=4) as (gw, client, a, b):
        await a.set_faults(fail_status=503)
        for _ in range(4):
            answer = await client.chat.completions.create(model="qwen", messages=HI)
            assert answer.choices[0].message.content
        assert await served(b) == 4
        # Equal replicas take turns: the 1st and 3rd went to qwen-a first, then to qwen-b.
        a_errors = metric(gw, UPSTREAM_ERRORS, backend="qwen-a", kind="http_5xx")
        assert a_errors == 2
        assert metric(gw, PICKS, group="qwen-pool", backend="qwen-b", why="retry") == 2
        assert metric(gw, PICKS, group="qwen-pool", backend="qwen-a", why="retry") == 0


async def test_both_replicas_failing_gives_the_usual_error_after_one_try_each() -> None:
    async with pool(max_tokens=4) as (gw, client, a, b):
        await a.set_faults(fail_status=503)
        await b.set_faults(fail_status=503)
        with pytest.raises(openai.APIStatusError) as raised:
            await client.chat.completions.create(model="qwen", messages=HI)
        assert raised.value.status_code == 503
        errors = [
            metric(gw, UPSTREAM_ERRORS, backend=n, kind="http_5xx") for n in ("qwen-a", "qwen-b")
        ]
        assert errors == [1, 1]


async def test_both_replicas_unreachable_gives_the_usual_error() -> None:
    async with fake_vllm(models=["qwen"]) as a, fake_vllm(models=["qwen"]) as b:
        urls = [a.url, b.url]
    # Both servers are gone: nothing listens on their ports.
    member = {"models": ["qwen"], "replica_of": "qwen-pool"}
    settings = gateway_settings(
        {"qwen-a": {"url": urls[0], **member}, "qwen-b": {"url": urls[1], **member}}
    )
    async with gateway(settings) as gw:
        response = await gw.client.post(
            "/v1/chat/completions", json={"model": "qwen", "messages": HI}
        )
        assert response.status_code in (502, 503)
        assert response.json()["error"]["message"]


async def test_a_blocked_replica_is_skipped_and_all_blocked_is_the_usual_refusal() -> None:
    async with pool(max_tokens=4) as (gw, client, a, b):
        backends = gw.app.state.services.backends
        backends["qwen-a"].block("test", "a test", kind=BlockKind.DISABLED)
        for _ in range(3):
            await client.chat.completions.create(model="chat", messages=HI)
        assert (await served(a), await served(b)) == (0, 3)
        backends["qwen-b"].block("test", "a test", kind=BlockKind.DISABLED)
        response = await gw.client.post(
            "/v1/chat/completions", json={"model": "chat", "messages": HI}
        )
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "backend_disabled"
        assert "'qwen-a'" in response.json()["error"]["message"]
        assert (await served(a), await served(b)) == (0, 3)


async def test_the_group_is_shown_once_in_models_and_on_each_backend() -> None:
    async with pool() as (gw, client, _a, _b):
        models = await client.models.list()
        assert [(m.id, m.owned_by) for m in models.data] == [
            ("qwen", "qwen-pool"),
            ("chat", "qwen-pool"),
        ]
        for name in ("qwen-a", "qwen-b"):  # declared at zero before any pick
            for why in ("least_loaded", "woken", "retry"):
                labels = {"group": "qwen-pool", "backend": name, "why": why}
                assert gw.registry.get_sample_value(PICKS, labels) == 0
        views = (await gw.client.get("/backends")).json()["backends"]
        assert {v["name"]: v["replica_of"] for v in views} == {
            "qwen-a": "qwen-pool",
            "qwen-b": "qwen-pool",
        }


async def test_none_ready_wakes_the_cheapest_member_once_and_later_requests_join_it() -> None:
    ports = {"big": free_port(), "small": free_port()}
    runtimes = {
        name: FakeVllmRuntime(port, open_at_start=False, models=["qwen"], max_tokens=2)
        for name, port in ports.items()
    }
    backends = {
        name: {
            "url": f"http://127.0.0.1:{port}", "models": ["qwen"], "replica_of": "qwen-pool",
            "lifecycle": "lazy", "vram_mib": 8000 if name == "big" else 4000,
            "runtime": {"kind": "process", "command": ["unused"]},
        }
        for name, port in ports.items()
    }  # fmt: skip
    seams = Seams(runtime_factory=lambda name, _cfg: runtimes[name])
    async with gateway(gateway_settings(backends), seams=seams) as gw:

        async def ask() -> int:
            body = {"model": "qwen", "messages": HI}
            return (await gw.client.post("/v1/chat/completions", json=body)).status_code

        first = asyncio.create_task(ask())
        await until_backend(gw, "small", state="starting")
        second = asyncio.create_task(ask())  # none ready: joins the start under way
        await until_backend(gw, "small", waiting=2)
        runtimes["small"].listening.set()
        assert [await first, await second] == [200, 200]
        assert (runtimes["small"].starts, runtimes["big"].starts) == (1, 0)
        woken = metric(gw, PICKS, group="qwen-pool", backend="small", why="woken")
        assert woken == 2
        assert await ask() == 200  # now ready: the least loaded (the only ready one)
        assert metric(gw, PICKS, group="qwen-pool", backend="small", why="least_loaded") == 1
        assert metric(gw, PICKS, group="qwen-pool", backend="big", why="woken") == 0
        await until_backend(gw, "big", state="stopped")


@asynccontextmanager
async def chained(tmp_path: Path) -> AsyncIterator[tuple[Gateway, FakeServer, FakeServer]]:
    """`qwen-pool` as the first entry of `chat`'s fallback chain, a provider after it."""
    async with (
        fake_vllm(models=["qwen"], max_tokens=4) as a,
        fake_vllm(models=["qwen"], max_tokens=4) as b,
        fake_openai_provider(CLOUD_KEY, model="cloud-model", max_tokens=3) as cloud,
    ):
        member = {"models": ["qwen"], "aliases": ["chat"], "replica_of": "qwen-pool"}
        settings = cloud_settings(
            {"qwen-a": {"url": a.url, **member}, "qwen-b": {"url": b.url, **member}},
            {
                "cloud": {
                    "kind": "openai",
                    "base_url": cloud.base_url,
                    "model": "cloud-model",
                    "api_key_env": "CLOUD_KEY",
                }
            },
            {"chat": {"entries": ["qwen-pool", "cloud"]}},
            state_dir=tmp_path,
        )
        async with gateway(settings) as gw:
            for name in ("qwen-a", "qwen-b"):
                await until_ready(gw, name)
            yield gw, a, b


async def test_a_chain_entry_that_is_a_group_retries_a_member_then_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLOUD_KEY", CLOUD_KEY)
    async with chained(tmp_path) as (gw, a, b):
        body = {"model": "chat", "messages": HI}
        await a.set_faults(fail_status=503)
        first = await gw.client.post("/v1/chat/completions", json=body)
        assert first.status_code == 200
        assert first.headers["x-microscheduler-route"] == "qwen-b"
        assert first.headers["x-microscheduler-fallbacks"] == "1; qwen-a=unavailable"
        assert metric(gw, PICKS, group="qwen-pool", backend="qwen-b", why="retry") == 1

        await b.set_faults(fail_status=503)
        second = await gw.client.post("/v1/chat/completions", json=body)
        assert second.status_code == 200
        assert second.headers["x-microscheduler-route"] == "cloud"
        assert second.headers["x-microscheduler-fallbacks"] in (
            "2; qwen-a=unavailable; qwen-b=unavailable",
            "2; qwen-b=unavailable; qwen-a=unavailable",
        )
        assert second.json()["model"] == "cloud-model"
