"""Anthropic's Messages API inbound, with the official `anthropic` SDK against the gateway
in process and a fake vLLM that speaks only OpenAI chat (so every call is translated),
a backend that speaks `/v1/messages` itself (passed through), and errors in Anthropic's
envelope."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import pytest
from aiohttp import web
from pydantic import SecretStr

from tests.fakes.servers import (
    TOOL_CALLING,
    FakeServer,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
    sdk_http,
    serve_app,
)

KEY = "client-key"
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@dataclass
class World:
    gw: Gateway
    sdk: anthropic.AsyncAnthropic
    upstream: FakeServer
    native: list[dict[str, Any]]  # what the backend that speaks messages received


@pytest.fixture
async def w() -> AsyncIterator[World]:
    native: list[dict[str, Any]] = []

    async def messages(request: web.Request) -> web.Response:
        native.append({"path": request.path, "body": await request.json(),
                       "headers": dict(request.headers)})  # fmt: skip
        if request.path.endswith("/count_tokens"):
            return web.json_response({"input_tokens": 42})
        return web.json_response(
            {"id": "msg_native", "type": "message", "role": "assistant", "model": "native-model",
             "content": [{"type": "text", "text": "native answer"}], "stop_reason": "end_turn",
             "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 2}}
        )  # fmt: skip

    app = web.Application()

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app.router.add_get("/health", health)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", messages)
    async with (
        serve_app(app) as native_url,
        fake_vllm(models=["local-model"], max_tokens=4, **TOOL_CALLING) as upstream,
    ):
        settings = gateway_settings(
            {
                "local": {
                    "url": upstream.url,
                    "models": ["local-model"],
                    "aliases": ["qwen"],
                    "messages": "translate",
                },  # an image older than vLLM 0.33
                "native": {
                    "url": native_url,
                    "models": ["native-model"],
                    "endpoints": ["chat", "messages"],
                },
            },
            api_keys=(SecretStr(KEY),),
        )
        async with gateway(settings) as gw, sdk_http(gw) as http:
            sdk = anthropic.AsyncAnthropic(
                base_url="http://gateway", api_key=KEY, http_client=http, max_retries=0
            )
            yield World(gw, sdk, upstream, native)


async def last_sent(w: World) -> dict[str, Any]:
    sent: dict[str, Any] = (await w.upstream.stats())["requests"][-1]
    return sent


async def test_messages_create_is_translated_to_chat_and_back(w: World) -> None:
    message = await w.sdk.messages.create(
        model="qwen",
        max_tokens=4,  # the fake always writes max_tokens tokens: a "length" finish
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}],
        stop_sequences=["###"],
        extra_body={"temperature": 0.2, "top_k": 5},  # not in this SDK's signature
    )
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == "qwen"  # the name the client used
    assert message.content[0].type == "text"
    assert message.content[0].text
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 4
    assert message.usage.input_tokens > 0
    sent = await last_sent(w)
    assert sent["path"] == "/v1/chat/completions"
    body = sent["body"]
    assert body["model"] == "local-model"
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert (body["max_tokens"], body["temperature"], body["top_k"]) == (4, 0.2, 5)
    assert body["stop"] == ["###"]


async def test_messages_stream_yields_anthropics_events_and_the_same_text(w: World) -> None:
    async with w.sdk.messages.stream(
        model="qwen", max_tokens=4, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start"
    assert "content_block_delta" in kinds
    assert kinds[-1] == "message_stop"
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 4
    assert final.content[0].type == "text"
    assert final.content[0].text
    sent = await last_sent(w)
    assert sent["body"]["stream"] is True
    assert sent["body"]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_round_trip(w: World, stream: bool) -> None:
    question: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first: anthropic.types.Message
    if stream:
        async with w.sdk.messages.stream(
            model="qwen", max_tokens=64, tools=[WEATHER], messages=question
        ) as events:
            first = await events.get_final_message()
    else:
        first = await w.sdk.messages.create(
            model="qwen", max_tokens=64, tools=[WEATHER], messages=question
        )
    assert first.stop_reason == "tool_use"
    call = next(block for block in first.content if block.type == "tool_use")
    assert call.name == "get_weather"
    assert isinstance(call.input, dict)
    result: Any = {"type": "tool_result", "tool_use_id": call.id, "content": "18 C, sunny"}
    answer = await w.sdk.messages.create(
        model="qwen",
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            *question,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
    )
    assert answer.stop_reason == "max_tokens"  # text this time, cut at max_tokens by the fake
    assert answer.content[0].type == "text"
    sent = (await last_sent(w))["body"]["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == call.id
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert sent[-1] == {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}


async def test_a_wrong_key_is_an_authentication_error_in_anthropics_envelope(w: World) -> None:
    wrong = w.sdk.with_options(api_key="not-the-key")
    with pytest.raises(anthropic.AuthenticationError) as info:
        await wrong.messages.create(
            model="qwen", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "authentication_error"
    raw = await w.gw.client.post(
        "/v1/messages",
        headers={"authorization": f"Bearer {KEY}"},  # a bearer token works too
        json={"model": "qwen", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
    )
    assert raw.status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "kind", "words"),
    [
        ({"model": "nope", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
         404, "not_found_error", "nope"),
        ({"model": "qwen", "messages": [{"role": "user", "content": "x"}]},
         400, "invalid_request_error", "max_tokens"),
        ({"model": "qwen", "max_tokens": 8,
          "messages": [{"role": "user", "content": [{"type": "document"}]}]},
         400, "invalid_request_error", "document"),
    ],
)  # fmt: skip
async def test_errors_are_in_anthropics_envelope(
    w: World, body: dict[str, Any], status: int, kind: str, words: str
) -> None:
    response = await w.gw.client.post("/v1/messages", headers={"x-api-key": KEY}, json=body)
    assert response.status_code == status
    payload = response.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == kind
    assert words in payload["error"]["message"]


async def test_count_tokens_asks_vllms_tokenizer(w: World) -> None:
    counted = await w.sdk.messages.count_tokens(
        model="qwen", messages=[{"role": "user", "content": "hello world"}]
    )
    sent = await last_sent(w)
    assert sent["path"] == "/tokenize"
    assert sent["body"]["messages"] == [{"role": "user", "content": "hello world"}]
    direct = await w.upstream.client.post("/tokenize", json=sent["body"])
    assert counted.input_tokens == direct.json()["count"] > 0


async def test_a_backend_that_speaks_messages_gets_them_as_sent(w: World) -> None:
    message = await w.sdk.messages.create(
        model="native-model",
        max_tokens=16,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"anthropic-beta": "tools-2024-04-04"},
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == "native answer"
    received = w.native[-1]
    assert received["path"] == "/v1/messages"
    assert received["body"]["messages"] == [{"role": "user", "content": "hi"}]
    assert received["headers"]["anthropic-beta"] == "tools-2024-04-04"
    assert "x-api-key" not in {name.lower() for name in received["headers"]}  # ours stays here
    counted = await w.sdk.messages.count_tokens(
        model="native-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens == 42
    assert w.native[-1]["path"] == "/v1/messages/count_tokens"
    assert json.dumps(w.native[-1]["body"]).count("hi") == 1
