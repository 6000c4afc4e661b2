"""The fake vLLM keeps responses only with VLLM_ENABLE_RESPONSES_API_STORE=1, as vLLM 0.33
(vllm/envs.py; vllm/entrypoints/openai/responses/serving.py): without it `store` is
silently off, so follow-ups and `previous_response_id` answer vLLM's 404."""

from __future__ import annotations

import httpx
import pytest

from app.sim.vllm import FakeConfig, FakeVllmServer


async def _create(client: httpx.AsyncClient, **fields: object) -> httpx.Response:
    return await client.post("/v1/responses", json={"model": "m", "input": "hi", **fields})


async def test_without_the_variable_nothing_is_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ENABLE_RESPONSES_API_STORE", raising=False)
    config = FakeConfig(port=0, models=["m"], task="generate")
    async with (
        FakeVllmServer(config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5) as client,
    ):
        made = await _create(client)
        assert made.status_code == 200  # store=true (the default) silently ignored
        rid = made.json()["id"]
        got = await client.get(f"/v1/responses/{rid}")
        assert got.status_code == 404
        assert got.json()["error"]["message"] == f"Response with id '{rid}' not found."
        follow = await _create(client, previous_response_id=rid)
        assert follow.status_code == 404
        assert follow.json()["error"]["param"] == "response_id"
        background = await _create(client, background=True)
        assert background.status_code == 400
        assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in background.json()["error"]["message"]


async def test_with_the_variable_responses_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    config = FakeConfig(port=0, models=["m"], task="generate")
    async with (
        FakeVllmServer(config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=5) as client,
    ):
        rid = (await _create(client)).json()["id"]
        assert (await client.get(f"/v1/responses/{rid}")).status_code == 200
        follow = await _create(client, previous_response_id=rid)
        assert follow.status_code == 200
        assert follow.json()["previous_response_id"] == rid
        unknown = await _create(client, previous_response_id="resp_unknown")
        assert unknown.status_code == 404
        not_kept = (await _create(client, store=False)).json()["id"]
        assert (await client.get(f"/v1/responses/{not_kept}")).status_code == 404
