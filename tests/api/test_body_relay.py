"""The request body is parsed once and written at most once: the common case (no alias, no
priority backend, no limit lowered, no usage asked for) reaches the backend as the client's
exact bytes; a body that changes in several ways at once (an alias's model, the stream's
usage for a key counting tokens, the key's priority) is serialised once, where it is sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

import app.api.openai
import app.routing.local
import app.upstreams.provider
from app.jsonwire import json_bytes
from tests.fakes.servers import FakeServer, fake_vllm, gateway, gateway_settings

SECRET = "sk-counted-batch"
JSON = {"content-type": "application/json"}


async def last_raw(fake: FakeServer) -> bytes:
    raw: str = (await fake.stats())["requests"][-1]["raw"]
    return raw.encode("latin-1")


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        (
            "/v1/chat/completions",
            b'{ "messages" :[ {"content":"h\\u00e9llo \xc3\xa9", "role":"user"}],\n'
            b'\t"max_tokens": 2 ,"model":"m",  "temperature": 1.50, "seed": 7 }  ',
        ),
        (
            "/v1/completions",
            b'{"prompt":"once" , "model" : "m","max_tokens":2,"temperature":1.0e0}',
        ),
        ("/v1/embeddings", b'\n{"input":["a" ,"b"],"model":"m" ,"extra":{"z":1,"a":[]}}\n'),
    ],
)
async def test_the_common_case_relays_the_clients_exact_bytes(path: str, raw: bytes) -> None:
    async with fake_vllm(models=["m"], max_tokens=2) as fake:
        backend = {"url": fake.url, "models": ["m"], "endpoints": ["chat", "completions",
                   "embeddings"]}  # fmt: skip
        async with gateway(gateway_settings({"b": backend})) as gw:
            response = await gw.client.post(path, content=raw, headers=JSON)
            assert response.status_code == 200, response.text
            assert await last_raw(fake) == raw


async def test_a_body_changed_three_ways_is_serialised_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written: list[Any] = []

    def counted(value: object, **options: Any) -> bytes:
        if isinstance(value, dict) and "messages" in value:
            written.append(value)
        return json_bytes(value, **options)

    for module in (app.api.openai, app.routing.local, app.upstreams.provider):
        monkeypatch.setattr(module, "json_bytes", counted)
    monkeypatch.setenv("BATCH_KEY", SECRET)
    keys = {"batch": {"key_env": "BATCH_KEY", "priority": "low", "tpm": 100000}}
    messages = [{"role": "user", "content": "hi"}]
    async with fake_vllm(models=["m"], scheduling_policy="priority", max_tokens=2) as fake:
        backend = {"url": fake.url, "models": ["m"], "aliases": ["a"], "scheduling": "priority"}
        settings = gateway_settings({"b": backend}, client_keys={"keys": keys})
        async with gateway(settings) as gw:
            response = await gw.client.post(
                "/v1/chat/completions",
                content=json.dumps({"model": "a", "messages": messages, "stream": True}),
                headers={**JSON, "authorization": f"Bearer {SECRET}"},
            )
            assert response.status_code == 200, response.text
            sent = await last_raw(fake)
    assert len(written) == 1, written
    expected = {
        "model": "m",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "priority": 1,
    }
    assert json.loads(sent) == expected
    assert sent == json_bytes(written[0])
