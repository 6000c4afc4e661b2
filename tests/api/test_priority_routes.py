"""`scheduling: priority` on every route vLLM schedules by `priority`: a low-priority key's
own `"priority": -100` never reaches the backend; the key's priority does (vLLM runs lower
values first, so a client writing its own would jump every queue)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.servers import fake_vllm, gateway, gateway_settings

SECRET = "sk-low-priority-batch"
# One valid body per route (the fake checks their shape as vLLM does).
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "once", "max_tokens": 2}),
    ("/v1/embeddings", {"input": "hello"}),
    ("/pooling", {"input": "hello"}),
    ("/classify", {"input": "hello"}),
    ("/score", {"text_1": "a cat", "text_2": "a dog"}),
    ("/v1/score", {"text_1": "a cat", "text_2": "a dog"}),
    ("/rerank", {"query": "cat", "documents": ["a cat", "a dog"]}),
    ("/v1/rerank", {"query": "cat", "documents": ["a cat", "a dog"]}),
    ("/v2/rerank", {"query": "cat", "documents": ["a cat", "a dog"]}),
]


@pytest.mark.parametrize(("path", "fields"), ROUTES, ids=[p for p, _ in ROUTES])
async def test_a_low_priority_keys_own_priority_is_replaced_on_every_scheduled_route(
    path: str, fields: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCH_KEY", SECRET)
    keys = {"batch": {"key_env": "BATCH_KEY", "priority": "low"}}
    async with fake_vllm(models=["m"], scheduling_policy="priority") as fake:
        backend = {
            "url": fake.url,
            "models": ["m"],
            "aliases": ["a"],
            "scheduling": "priority",
            "endpoints": ["chat", "completions", "embeddings", "pooling", "classify", "score",
                          "rerank"],
        }  # fmt: skip
        settings = gateway_settings({"b": backend}, client_keys={"keys": keys})
        async with gateway(settings) as gw:
            response = await gw.client.post(
                path,
                json={"model": "a", **fields, "priority": -100},
                headers={"authorization": f"Bearer {SECRET}"},
            )
            assert response.status_code == 200, response.text
            sent = (await fake.stats())["requests"][-1]
            assert sent["path"] == path
            assert sent["body"] == {"model": "m", **fields, "priority": 1}  # the key's: low
