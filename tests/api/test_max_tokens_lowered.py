"""A `max_tokens` above what the model can give: vLLM 0.33 refuses `max_tokens >
max_model_len` with a 400 (vllm/renderers/params.py), and Claude Code asks for 32,000 by
default. The gateway learns each backend's `max_model_len` from its `/v1/models` and lowers
the limit to it (`x-microscheduler-max-tokens-lowered`), unless `lower_max_tokens: false`.
Against the fake vLLM with `--max-model-len 8192`, which answers as vLLM does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.fakes.servers import FakeServer, Gateway, fake_vllm, gateway, gateway_settings

HEADER = "x-microscheduler-max-tokens-lowered"
HI = [{"role": "user", "content": "hello"}]


@asynccontextmanager
async def world(**backend: Any) -> AsyncIterator[tuple[Gateway, FakeServer]]:
    async with fake_vllm(
        models=["qwen"], task="generate", max_tokens=4, max_model_len=8192
    ) as fake:
        settings = gateway_settings({"local": {"url": fake.url, "models": ["qwen"], **backend}})
        async with gateway(settings) as gw:
            yield gw, fake


async def last_body(fake: FakeServer) -> dict[str, Any]:
    body: dict[str, Any] = (await fake.stats())["requests"][-1]["body"]
    return body


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("stream", [False, True])
async def test_chat_asking_more_than_the_context_is_lowered_and_said(
    field: str, stream: bool
) -> None:
    async with world() as (gw, fake):
        response = await gw.client.post(
            "/v1/chat/completions",
            json={"model": "qwen", "messages": HI, field: 32000, "stream": stream},
        )
        assert response.status_code == 200, response.text
        assert response.headers[HEADER] == "32000->8192"
        sent = await last_body(fake)
        assert sent[field] == 8192
        assert sent["messages"] == HI


async def test_a_limit_that_fits_is_sent_byte_for_byte() -> None:
    async with world() as (gw, fake):
        raw = b'{"model": "qwen", "messages": [{"role": "user", "content": "hi"}], '
        raw += b'"max_tokens": 8192}'
        response = await gw.client.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        )
        assert response.status_code == 200, response.text
        assert HEADER not in response.headers
        assert (await fake.stats())["requests"][-1]["body"]["max_tokens"] == 8192


async def test_completions_and_responses_are_lowered_too() -> None:
    async with world() as (gw, fake):
        completion = await gw.client.post(
            "/v1/completions", json={"model": "qwen", "prompt": "hi", "max_tokens": 9000}
        )
        assert completion.status_code == 200, completion.text
        assert completion.headers[HEADER] == "9000->8192"
        assert (await last_body(fake))["max_tokens"] == 8192
        response = await gw.client.post(
            "/v1/responses", json={"model": "qwen", "input": "hi", "max_output_tokens": 32000}
        )
        assert response.status_code == 200, response.text
        assert response.headers[HEADER] == "32000->8192"
        assert (await last_body(fake))["max_output_tokens"] == 8192


async def test_the_opt_out_gets_vllms_400() -> None:
    async with world(lower_max_tokens=False) as (gw, fake):
        response = await gw.client.post(
            "/v1/chat/completions", json={"model": "qwen", "messages": HI, "max_tokens": 32000}
        )
        assert response.status_code == 400, response.text
        assert "cannot be greater than max_model_len=8192" in response.json()["error"]["message"]
        assert HEADER not in response.headers
        assert (await last_body(fake))["max_tokens"] == 32000


MESSAGES = {
    "model": "qwen",
    "max_tokens": 32000,
    "messages": [{"role": "user", "content": "hello"}],
}


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_asking_more_than_the_context_are_lowered_and_said(stream: bool) -> None:
    async with world() as (gw, fake):
        response = await gw.client.post(
            "/v1/messages",
            json={**MESSAGES, "stream": stream},
            headers={"anthropic-version": "2023-06-01"},
        )
        assert response.status_code == 200, response.text
        assert response.headers[HEADER] == "32000->8192"
        sent = await last_body(fake)
        limits = {k: v for k, v in sent.items() if k in ("max_tokens", "max_completion_tokens")}
        assert limits
        assert set(limits.values()) == {8192}


async def test_messages_with_the_opt_out_get_the_400_in_anthropics_envelope() -> None:
    async with world(lower_max_tokens=False) as (gw, _fake):
        response = await gw.client.post(
            "/v1/messages", json=MESSAGES, headers={"anthropic-version": "2023-06-01"}
        )
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["type"] == "error"
        assert "cannot be greater than max_model_len=8192" in body["error"]["message"]
