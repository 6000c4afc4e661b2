"""`VllmClient.learn` asks `/openapi.json` and `/v1/models` at once: a start's ready waits
for both, so one slow answer is the wait, not the sum."""

from __future__ import annotations

import asyncio
import json

import httpx

from app.upstreams.vllm import VllmClient

BASE = "http://vllm.test:8000"
MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}
OPENAPI = {"openapi": "3.1.0", "paths": {"/v1/chat/completions": {"post": {}}}}


async def test_the_two_questions_are_asked_together() -> None:
    asked: list[str] = []
    both = asyncio.Event()

    async def server(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if len(asked) == 2:
            both.set()
        # Each answer waits until both were asked: asked one after the other, the first
        # would wait for a second question that never comes (the wait below times out).
        await asyncio.wait_for(both.wait(), timeout=2)
        body = OPENAPI if request.url.path == "/openapi.json" else MODELS
        return httpx.Response(200, content=json.dumps(body).encode())

    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        answer = await VllmClient(client, BASE).learn(["m"])
    assert sorted(asked) == ["/openapi.json", "/v1/models"]
    assert answer is not None
    assert answer.learned.max_model_len == 4096
    assert answer.models == ("m",)
