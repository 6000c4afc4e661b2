"""The Anthropic provider through the gateway, with the official `openai` SDK as the client:
translation both ways, streaming and not, tool calls, stop reasons, usage, in-stream
errors before and after content, and the endpoints it does not offer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from app.services import Services
from app.sim.anthropic import FakeAnthropic, FakeAnthropicServer
from tests.fakes.provider import cloud_settings, fake_anthropic
from tests.fakes.servers import TOOL_CALLING, FakeServer, Gateway, fake_vllm, gateway, sdk_http

KEY = "sk-ant-test-0123456789"
CLAUDE = "claude-sonnet-4-5"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@dataclass
class World:
    gw: Gateway
    sdk: openai.AsyncOpenAI
    claude: FakeAnthropicServer
    local: FakeServer

    @property
    def fake(self) -> FakeAnthropic:
        return self.claude.fake

    @property
    def services(self) -> Services:
        services: Services = self.gw.app.state.services
        return services

    async def faults(self, **faults: Any) -> None:
        self.fake.faults.update(faults)


@asynccontextmanager
async def world(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    entries: list[str],
    chain: dict[str, Any] | None = None,
    provider: dict[str, Any] | None = None,
    **faults: Any,
) -> AsyncIterator[World]:
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", KEY)
    async with (
        fake_anthropic(KEY, **faults) as claude,
        fake_vllm(models=["local-model"], max_tokens=4, **TOOL_CALLING) as local,
    ):
        claude.fake.config.max_input_tokens = 1000
        settings = cloud_settings(
            {
                "reasoning": {
                    "url": local.url,
                    "models": ["local-model"],
                    "aliases": ["reasoning"],
                    "role": "reasoning",
                    # the fake serves embeddings too; a generate runner would not
                    "endpoints": ["chat", "completions", "embeddings", "responses"],
                }
            },
            {
                "claude": {
                    "kind": "anthropic",
                    "base_url": claude.url,
                    "api_key_env": "ANTHROPIC_TEST_KEY",
                    "model": CLAUDE,
                    "max_tokens": 512,
                    **(provider or {}),
                }
            },
            {"reasoning": {"entries": entries, **(chain or {})}},
            state_dir=tmp_path / "var",
        )
        async with gateway(settings) as gw, sdk_http(gw) as http:
            sdk = openai.AsyncOpenAI(
                base_url="http://gateway/v1", api_key="unused", http_client=http, max_retries=0
            )
            yield World(gw, sdk, claude, local)


def sent(w: World) -> dict[str, Any]:
    body: dict[str, Any] = w.fake.requests[-1]["body"]
    return body


async def test_a_chat_completion_is_translated_both_ways(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, ["claude"]) as w:
        raw = await w.sdk.chat.completions.with_raw_response.create(
            model="reasoning", messages=MESSAGES, stop=["never"], temperature=1.6
        )
        assert raw.headers["x-microscheduler-route"] == "claude"
        reply = raw.parse()
        assert reply.object == "chat.completion"
        assert reply.model == CLAUDE
        assert reply.id.startswith("chatcmpl-msg_")
        assert reply.choices[0].message.content == "Hello from the fake Anthropic API."
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 7
        assert reply.usage.prompt_tokens > 0
        record = w.fake.requests[-1]
        assert record["key_ok"] is True
        assert record["headers"]["anthropic-version"] == "2023-06-01"
        assert record["headers"]["x-api-key"] == "<redacted>"
        body = record["body"]
        assert body["model"] == CLAUDE
        assert body["system"] == "Be brief."
        assert body["messages"] == [{"role": "user", "content": "What is the weather in Paris?"}]
        assert body["max_tokens"] == 512  # the provider's default: the request set none
        assert body["stop_sequences"] == ["never"]
        assert body["temperature"] == 1  # clamped to Anthropic's range
        tokens = w.gw.registry.get_sample_value(
            "microscheduler_tokens_total", {"route": "claude", "type": "completion"}
        )
        assert tokens == 7


async def test_a_stream_is_translated_to_openai_chunks_with_usage(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, ["claude"]) as w:
        stream = await w.sdk.chat.completions.create(
            model="reasoning",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Hello from the fake Anthropic API."
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 7
        assert len({c.id for c in chunks}) == 1
        assert sent(w)["stream"] is True


async def test_stream_usage_is_counted_even_when_the_client_did_not_ask(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, ["claude"]) as w:
        stream = await w.sdk.chat.completions.create(
            model="reasoning", messages=MESSAGES, stream=True
        )
        chunks = [chunk async for chunk in stream]
        assert all(c.usage is None for c in chunks)
        tokens = w.gw.registry.get_sample_value(
            "microscheduler_tokens_total", {"route": "claude", "type": "completion"}
        )
        assert tokens == 7


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_go_both_ways(
    stream: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, ["claude"], reply="tool_use") as w:
        if stream:
            chunks = [
                c
                async for c in await w.sdk.chat.completions.create(
                    model="reasoning", messages=MESSAGES, tools=TOOLS, stream=True
                )
            ]
            calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
            assert calls[0].id is not None
            assert calls[0].id.startswith("toolu_")
            assert calls[0].function is not None
            assert calls[0].function.name == "get_weather"
            arguments = "".join(tc.function.arguments or "" for tc in calls if tc.function)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            call_id = calls[0].id
        else:
            reply = await w.sdk.chat.completions.create(
                model="reasoning", messages=MESSAGES, tools=TOOLS, tool_choice="required"
            )
            message = reply.choices[0].message
            assert message.tool_calls is not None
            call = message.tool_calls[0]
            assert call.type == "function"
            assert call.function.name == "get_weather"
            arguments, finish, call_id = (
                call.function.arguments,
                reply.choices[0].finish_reason,
                call.id,
            )
            assert sent(w)["tool_choice"] == {"type": "any"}
        assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"}
        assert finish == "tool_calls"
        assert sent(w)["tools"][0]["name"] == "get_weather"
        assert sent(w)["tools"][0]["input_schema"]["required"] == ["city"]

        # The tool's answer goes back as a tool_result the fake pairs with its tool_use.
        await w.faults(reply="text")
        history: list[ChatCompletionMessageParam] = [
            *MESSAGES,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "18 C, sunny"},
        ]
        reply = await w.sdk.chat.completions.create(
            model="reasoning", messages=history, tools=TOOLS
        )
        assert reply.choices[0].finish_reason == "stop"
        last = sent(w)["messages"][-1]
        assert last["role"] == "user"
        assert last["content"][0]["type"] == "tool_result"
        assert last["content"][0]["tool_use_id"] == call_id


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("request_fields", "faults", "finish"),
    [
        ({"max_tokens": 3}, {}, "length"),
        ({"stop": ["fake"]}, {}, "stop"),
        ({}, {"stop_reason": "refusal"}, "content_filter"),
        ({}, {"stop_reason": "end_turn"}, "stop"),
    ],
)
async def test_stop_reasons_map_to_finish_reasons(
    request_fields: dict[str, Any],
    faults: dict[str, Any],
    finish: str,
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    async with world(monkeypatch, tmp_path, ["claude"], **faults) as w:
        if stream:
            chunks = [
                c
                async for c in await w.sdk.chat.completions.create(
                    model="reasoning", messages=MESSAGES, stream=True, **request_fields
                )
            ]
            got = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            reply = await w.sdk.chat.completions.create(
                model="reasoning", messages=MESSAGES, **request_fields
            )
            got = reply.choices[0].finish_reason
        assert got == finish


async def test_an_error_event_after_content_ends_in_band_and_asks_no_one_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # message_start, content_block_start, ping, one text delta, then `error`.
    async with world(monkeypatch, tmp_path, ["claude", "reasoning"], stream_error_after=4) as w:
        stream = await w.sdk.chat.completions.create(
            model="reasoning", messages=MESSAGES, stream=True
        )
        received: list[str] = []

        async def read_all() -> None:
            async for chunk in stream:
                received.append(chunk.choices[0].delta.content or "")

        with pytest.raises(openai.APIError, match="Overloaded"):
            await read_all()
        assert "".join(received) == "Hello"
        assert (await w.local.stats())["requests"] == []
        circuit = w.services.plane.cloud.status().circuits["claude"]
        assert (circuit.consecutive_failures, circuit.last_reason) == (1, "stream_error")
        outcome = w.gw.registry.get_sample_value(
            "microscheduler_provider_requests_total",
            {"provider": "claude", "outcome": "stream_error"},
        )
        assert outcome == 1


@pytest.mark.parametrize("after", [1, 3])  # after message_start; after the ping
async def test_an_error_event_before_any_content_falls_back(
    after: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, ["claude", "reasoning"], stream_error_after=after) as w:
        raw = await w.sdk.chat.completions.with_raw_response.create(
            model="reasoning", messages=MESSAGES, stream=True
        )
        assert raw.headers["x-microscheduler-route"] == "reasoning"
        assert raw.headers["x-microscheduler-fallbacks"] == "1; claude=stream_error"
        chunks = [c async for c in raw.parse()]
        assert chunks[0].model == "local-model"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("faults", "reason"),
    [
        ({"fail_status": 529, "fail_count": 1}, "overloaded"),
        ({"fail_status": 500, "fail_count": 1, "error_type": "overloaded_error"}, "overloaded"),
        ({"fail_status": 429, "fail_count": 1, "retry_after": "20"}, "rate_limited"),
        ({"fail_status": 401, "fail_count": 1}, "auth_misconfigured"),
        ({"stall_before_headers": True}, "timeout"),
    ],
)
async def test_anthropic_failures_fall_back(
    faults: dict[str, Any],
    reason: str,
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    async with world(
        monkeypatch,
        tmp_path,
        ["claude", "reasoning"],
        provider={"first_byte_timeout_s": 0.3},
        **faults,
    ) as w:
        cloud = w.services.plane.cloud
        raw = await w.sdk.chat.completions.with_raw_response.create(
            model="reasoning", messages=MESSAGES, stream=stream
        )
        assert raw.headers["x-microscheduler-fallbacks"] == f"1; claude={reason}"
        if reason == "rate_limited":
            assert 18 < cloud.status().circuits["claude"].retry_in_s <= 20


async def test_a_too_long_prompt_is_relayed_or_falls_back_as_the_chain_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    long: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 2000}]
    async with world(monkeypatch, tmp_path, ["claude", "reasoning"]) as w:
        with pytest.raises(openai.BadRequestError, match="prompt is too long") as info:
            await w.sdk.chat.completions.create(model="reasoning", messages=long)
        assert info.value.response.headers["x-microscheduler-route"] == "claude"
        assert (await w.local.stats())["requests"] == []
    async with world(
        monkeypatch, tmp_path, ["claude", "reasoning"], chain={"on_context_length": "next"}
    ) as w:
        raw = await w.sdk.chat.completions.with_raw_response.create(
            model="reasoning", messages=long
        )
        assert raw.headers["x-microscheduler-fallbacks"] == "1; claude=context_length"


async def test_a_request_anthropic_cannot_express_is_a_400_and_nothing_is_sent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, ["claude", "reasoning"]) as w:
        with pytest.raises(openai.BadRequestError) as info:
            await w.sdk.chat.completions.create(model="reasoning", messages=MESSAGES, n=2)
        assert info.value.param == "n"
        assert w.fake.received == 0
        assert (await w.local.stats())["requests"] == []


async def test_completions_and_embeddings_skip_anthropic(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, ["claude", "reasoning"]) as w:
        raw = await w.sdk.embeddings.with_raw_response.create(model="reasoning", input="hello")
        assert raw.headers["x-microscheduler-fallbacks"] == "1; claude=unsupported_endpoint"
        raw_completion = await w.sdk.completions.with_raw_response.create(
            model="reasoning", prompt="once", max_tokens=2
        )
        assert raw_completion.headers["x-microscheduler-route"] == "reasoning"
        assert w.fake.received == 0
    async with world(monkeypatch, tmp_path, ["claude"]) as w:
        # No entry serves completions at all: the 404 a single backend gives, not a 503
        # an SDK would retry.
        with pytest.raises(openai.NotFoundError) as info:
            await w.sdk.completions.create(model="reasoning", prompt="once")
        body = info.value.body
        assert isinstance(body, dict)
        assert body["code"] == "endpoint_not_served"
        assert "claude serves chat, messages" in body["message"]
        assert "retry-after" not in info.value.response.headers


async def test_messages_pass_through_to_anthropic_and_fall_back_translated_to_local(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    body = {"model": "reasoning", "max_tokens": 8, "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    async with world(monkeypatch, tmp_path, ["claude", "reasoning"]) as w:
        answer = await w.gw.client.post("/v1/messages", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-microscheduler-route"] == "claude"
        assert answer.json()["type"] == "message"
        # As sent, the provider's model put in: no round trip through OpenAI's format.
        assert sent(w) == {**body, "model": CLAUDE}

        await w.faults(fail_status=529, fail_count=1)
        answer = await w.gw.client.post("/v1/messages", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-microscheduler-route"] == "reasoning"
        assert answer.headers["x-microscheduler-fallbacks"].startswith("1; claude=")
        message = answer.json()
        assert message["type"] == "message"
        assert message["model"] == "reasoning"
        local = (await w.local.stats())["requests"][-1]
        assert local["path"] == "/v1/chat/completions"


async def test_responses_skip_anthropic_in_a_chain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async with world(monkeypatch, tmp_path, ["claude", "reasoning"]) as w:
        raw = await w.sdk.responses.with_raw_response.create(model="reasoning", input="hi")
        assert raw.headers["x-microscheduler-fallbacks"] == "1; claude=unsupported_endpoint"
        assert raw.headers["x-microscheduler-route"] == "reasoning"
        assert w.fake.received == 0
