"""The fake vLLM's native Anthropic Messages API (vLLM 0.33 serves it on generate models):
read with the official `anthropic` SDK (it parses answers and streams into its typed
objects), and httpx for the exact bytes and errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from app.sim.vllm import FakeConfig, FakeVllmServer

TOOL: Any = {"name": "Read", "input_schema": {"type": "object"}}


@pytest.fixture
async def server() -> AsyncIterator[FakeVllmServer]:
    config = FakeConfig(
        port=0, models=["m"], max_tokens=4, max_model_len=4096,
        enable_auto_tool_choice=True, tool_call_parser="hermes",
    )  # fmt: skip
    async with FakeVllmServer(config) as srv:
        yield srv


@pytest.fixture
async def client(server: FakeVllmServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as c:
        yield c


@pytest.fixture
async def sdk(server: FakeVllmServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=server.url, api_key="x", max_retries=0) as c:
        yield c


async def test_an_answer_and_a_stream_in_vllms_shapes(sdk: anthropic.AsyncAnthropic) -> None:
    messages: Any = [
        {"role": "user", "content": "hello there"},
        {"role": "system", "content": "A reminder inside the conversation."},
    ]
    answer = await sdk.messages.create(model="m", max_tokens=4, messages=messages)
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "hello there hello there"
    assert (answer.stop_reason, answer.usage.output_tokens) == ("max_tokens", 4)
    assert answer.id.startswith("chatcmpl-")  # vLLM keeps the chat completion's id
    async with sdk.messages.stream(model="m", max_tokens=2, messages=messages) as stream:
        final = await stream.get_final_message()
    assert final.content[0].type == "text"
    assert (final.content[0].text, final.stop_reason) == ("hello there", "max_tokens")
    assert final.usage.output_tokens == 2


async def test_the_stream_is_framed_as_vllm_writes_it(client: httpx.AsyncClient) -> None:
    body = {"model": "m", "max_tokens": 1, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    text = (await client.post("/v1/messages", json=body, headers={"x-request-id": "r"})).text
    assert text == "".join(
        f"event: {json.loads(data)['type']}\ndata: {data}\n\n"
        for data in (
            '{"type":"message_start","message":{"id":"chatcmpl-r","type":"message",'
            '"role":"assistant","content":[],"model":"m","stop_reason":null,'
            '"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":0}}}',
            '{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}',
            '{"type":"content_block_delta","delta":{"type":"text_delta","text":"hi"},"index":0}',
            '{"type":"content_block_stop","index":0}',
            '{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},'
            '"usage":{"input_tokens":1,"output_tokens":1}}',
            '{"type":"message_stop"}',
        )
    )


async def test_tool_changes_decide_the_tool_called(sdk: anthropic.AsyncAnthropic) -> None:
    grep = {"name": "Grep", "input_schema": {"type": "object"}}
    messages: Any = [
        {"role": "system", "content": [
            {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": grep}},
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Read"}}]},
        {"role": "user", "content": "find it"},
    ]  # fmt: skip
    answer = await sdk.messages.create(model="m", max_tokens=8, tools=[TOOL], messages=messages)
    assert answer.stop_reason == "tool_use"
    assert answer.content[0].type == "tool_use"
    assert answer.content[0].name == "Grep"


@pytest.mark.parametrize(
    ("body", "status", "anthropic_envelope"),
    [
        ({"model": "nope", "max_tokens": 8}, 404, True),
        ({"model": "m", "max_tokens": 5000}, 400, True),  # above --max-model-len
        ({"model": "m", "max_tokens": 0}, 400, False),  # FastAPI's validation: vLLM's shape
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Read"}}]}]},
         400, False),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": [
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Bash"}}]}]},
         400, True),
    ],
)  # fmt: skip
async def test_errors_as_vllm_answers_them(
    client: httpx.AsyncClient, body: dict[str, Any], status: int, anthropic_envelope: bool
) -> None:
    sent = {"messages": [{"role": "user", "content": "hi"}], **body}
    answer = await client.post("/v1/messages", json=sent)
    assert answer.status_code == status
    error = answer.json()
    if anthropic_envelope:
        assert error["type"] == "error"
        assert set(error["error"]) == {"type", "message"}
    else:
        assert error["error"]["code"] == 400


async def test_count_tokens(client: httpx.AsyncClient) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "one two three"}]}
    answer = await client.post("/v1/messages/count_tokens", json=body)
    assert answer.json() == {"input_tokens": 3, "context_management": {"original_input_tokens": 3}}
