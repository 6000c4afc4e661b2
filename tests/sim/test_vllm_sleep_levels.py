"""The fake vLLM's sleep levels: level 1 keeps the weights (offloaded), level 2 discards
them, and only the reload sequence of vLLM's sleep-mode docs brings them back
(`wake_up?tags=weights`, `collective_rpc` `reload_weights`, `wake_up?tags=kv_cache`).
After a level-2 wake without the reload the fake answers generation with a 500 (a real
vLLM answers garbage)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.fakes.servers import fake_vllm

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "alpha beta gamma"}]}
RELOAD = {"method": "reload_weights"}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with fake_vllm(dev_mode=True, models=["m1"]) as server:
        yield server.client


async def chat(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=CHAT)


async def sleeping(client: httpx.AsyncClient) -> Any:
    return (await client.get("/is_sleeping")).json()["is_sleeping"]


async def test_level_1_wakes_with_a_plain_wake_up(client: httpx.AsyncClient) -> None:
    assert (await client.post("/sleep", params={"level": 1})).status_code == 200
    assert (await client.post("/wake_up")).status_code == 200
    assert (await chat(client)).status_code == 200


@pytest.mark.parametrize(
    "wakes",
    [
        [None],  # a plain wake: every tag, no reload
        [["weights"], ["kv_cache"]],  # the tags of the sequence, without the reload
        [["kv_cache"], ["weights"]],
    ],
)
async def test_level_2_woken_without_reload_fails_generation_loudly(
    client: httpx.AsyncClient, wakes: list[list[str] | None]
) -> None:
    assert (await client.post("/sleep", params={"level": 2})).status_code == 200
    for tags in wakes:
        params = None if tags is None else {"tags": tags}
        assert (await client.post("/wake_up", params=params)).status_code == 200
    response = await chat(client)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "InternalServerError"
    assert error["code"] == 500
    assert "discarded by a level-2 sleep and not reloaded" in error["message"]
    assert "a real one would answer garbage" in error["message"]
    # Embeddings go through the same engine: they fail the same way.
    embed = await client.post("/v1/embeddings", json={"model": "m1", "input": "x"})
    assert embed.status_code == 500
    stats = (await client.get("/_fake/stats")).json()
    assert (stats["failed"], stats["completed"]) == (2, 0)


async def test_level_2_wakes_with_the_reload_sequence(client: httpx.AsyncClient) -> None:
    assert (await client.post("/sleep", params={"level": 2})).status_code == 200
    assert (await client.post("/wake_up", params={"tags": "weights"})).status_code == 200
    assert await sleeping(client) is True  # the KV cache still sleeps
    reload = await client.post("/collective_rpc", json=RELOAD)
    assert (reload.status_code, reload.json()) == (200, {"results": [None]})
    assert (await client.post("/wake_up", params={"tags": "kv_cache"})).status_code == 200
    assert await sleeping(client) is False
    assert (await client.post("/reset_prefix_cache")).status_code == 200
    response = await chat(client)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


async def test_the_reload_sequence_also_wakes_a_level_1_sleeper(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.post("/sleep", params={"level": 1})).status_code == 200
    await client.post("/wake_up", params={"tags": "weights"})
    assert (await client.post("/collective_rpc", json=RELOAD)).status_code == 200
    await client.post("/wake_up", params={"tags": "kv_cache"})
    assert (await chat(client)).status_code == 200


async def test_sleeping_again_at_level_2_does_not_discard_offloaded_weights(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/sleep", params={"level": 1})
    await client.post("/sleep", params={"level": 2})  # the weights tag sleeps: a no-op
    await client.post("/wake_up")
    assert (await chat(client)).status_code == 200


async def test_reload_while_the_weights_sleep_fails(client: httpx.AsyncClient) -> None:
    await client.post("/sleep", params={"level": 2})
    response = await client.post("/collective_rpc", json=RELOAD)
    assert response.status_code == 500
    assert "wake_up tags=weights first" in response.json()["error"]["message"]


async def test_collective_rpc_knows_reload_weights_only(client: httpx.AsyncClient) -> None:
    other = await client.post("/collective_rpc", json={"method": "sleep"})
    assert other.status_code == 400
    assert "unsupported method 'sleep'" in other.json()["error"]["message"]
    missing = await client.post("/collective_rpc", json={"args": []})
    assert missing.status_code == 400
    assert "Missing 'method'" in missing.json()["error"]["message"]
    not_json = await client.post("/collective_rpc", content=b"{")
    assert not_json.status_code == 400


async def test_reload_endpoints_need_dev_mode() -> None:
    async with fake_vllm(dev_mode=False) as server:
        assert (await server.client.post("/collective_rpc", json=RELOAD)).status_code == 404
        assert (await server.client.post("/reset_prefix_cache")).status_code == 404
