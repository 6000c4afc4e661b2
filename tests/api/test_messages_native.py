"""`/v1/messages` on a vLLM generate backend: passed through (vLLM 0.33 serves Anthropic's
Messages API itself), its answers and streams relayed byte for byte, `count_tokens` too;
translated to chat only for a backend that opts out (`messages: translate`). Claude Code's
own request (tests/fixtures/claude_code_messages.json, system messages inside `messages`)
served both ways; usage counted once on both."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.servers import (
    TOOL_CALLING,
    FakeServer,
    Gateway,
    fake_vllm,
    gateway,
    gateway_settings,
)

CLIENT_KEY, BACKEND_KEY = "sk-dev-4c1d", "backend-secret-77"
CLAUDE_CODE: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "claude_code_messages.json").read_text()
)
HELLO = [{"role": "user", "content": "hello there"}]


@dataclass
class World:
    gw: Gateway
    native: FakeServer  # runner: generate (default): serves /v1/messages itself
    old: FakeServer  # messages: translate: an older image, answered through chat

    async def post(self, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
        sent = {"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01", **headers}
        return await self.gw.client.post(path, json=body, headers=sent)

    def tokens(self, backend: str, kind: str) -> float:
        labels = {"key": "dev", "route": backend, "type": kind}
        value = self.gw.registry.get_sample_value("microscheduler_key_tokens_total", labels)
        return 0.0 if value is None else value


@pytest.fixture
async def w(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    monkeypatch.setenv("DEV_KEY", CLIENT_KEY)
    monkeypatch.setenv("NATIVE_BACKEND_KEY", BACKEND_KEY)
    # Claude Code asks for 32,000 output tokens: a context that takes them.
    options = {"max_tokens": 4, "max_model_len": 262_144, **TOOL_CALLING}
    async with (
        fake_vllm(models=["served-model"], **options) as native,
        fake_vllm(models=["old-model"], **options) as old,
    ):
        settings = gateway_settings(
            {
                "native": {"url": native.url, "models": ["served-model"], "aliases": ["qwen"],
                           "api_key_env": "NATIVE_BACKEND_KEY"},
                "old": {"url": old.url, "models": ["old-model"], "aliases": ["older"],
                        "messages": "translate"},
            },
            client_keys={"keys": {"dev": {"key_env": "DEV_KEY"}}},
        )  # fmt: skip
        async with gateway(settings) as gw:
            yield World(gw, native, old)


async def received(fake: FakeServer) -> dict[str, Any]:
    last: dict[str, Any] = (await fake.stats())["requests"][-1]
    return last


def sse_data(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_generate_backend_gets_messages_as_sent_and_is_relayed_byte_for_byte(
    w: World, stream: bool
) -> None:
    body = {"model": "qwen", "max_tokens": 64, "messages": HELLO, "stream": stream}
    answer = await w.post("/v1/messages", body, **{"x-request-id": "req-1"})
    assert answer.status_code == 200
    sent = await received(w.native)
    assert sent["path"] == "/v1/messages"
    assert sent["body"] == {**body, "model": "served-model"}  # the alias put to the served name
    # The client's key never reaches the backend; the backend's own does.
    assert "x-api-key" not in sent["headers"]
    assert sent["headers"]["authorization"] == f"Bearer {BACKEND_KEY}"
    # The client's request id is not the backend's (vLLM would make it the request's id).
    assert "x-request-id" not in sent["headers"]
    # What the fake sends for this very request, asked directly: the same bytes but for
    # the message id, which it draws at random without a request id.
    direct = await w.native.client.post("/v1/messages", json=sent["body"])
    assert _without_id(answer.content) == _without_id(direct.content)
    assert answer.content.count(b'"id":"') == 1
    assert answer.headers["content-type"] == direct.headers["content-type"]
    if stream:
        assert sse_data(answer.text)[-1] == {"type": "message_stop"}
    assert (await w.old.stats())["requests"] == []


async def test_count_tokens_is_passed_through(w: World) -> None:
    body = {"model": "qwen", "messages": HELLO}
    answer = await w.post("/v1/messages/count_tokens", body)
    sent = await received(w.native)
    assert sent["path"] == "/v1/messages/count_tokens"
    assert sent["body"] == {**body, "model": "served-model"}
    direct = await w.native.client.post("/v1/messages/count_tokens", json=sent["body"])
    assert answer.status_code == 200
    assert answer.content == direct.content
    assert answer.json()["context_management"] == {"original_input_tokens": 2}  # vLLM's shape
    assert w.tokens("native", "prompt") == 0  # a count is no generation


async def test_vllms_errors_are_relayed_in_its_anthropic_envelope(w: World) -> None:
    body = {"model": "qwen", "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Bash"}}]},
    ]}  # fmt: skip
    answer = await w.post("/v1/messages", body)
    direct = await w.native.client.post("/v1/messages", json={**body, "model": "served-model"})
    assert answer.status_code == direct.status_code == 400
    assert answer.content == direct.content
    message = "tool_removal references tool 'Bash', which is not declared in tools"
    error = {"type": "invalid_request_error", "message": message}
    assert answer.json() == {"type": "error", "error": error}


async def test_the_opt_out_translates_to_chat_and_count_tokens_to_tokenize(w: World) -> None:
    answer = await w.post("/v1/messages", {"model": "older", "max_tokens": 4, "messages": HELLO})
    assert answer.status_code == 200
    assert answer.json()["type"] == "message"
    sent = await received(w.old)
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"] == HELLO
    counted = await w.post("/v1/messages/count_tokens", {"model": "older", "messages": HELLO})
    assert counted.status_code == 200
    assert list(counted.json()) == ["input_tokens"]  # the gateway's answer, from /tokenize
    assert (await received(w.old))["path"] == "/tokenize"
    assert (await w.native.stats())["requests"] == []


async def test_a_system_message_and_tool_changes_inside_messages_are_translated(w: World) -> None:
    tool = {"name": "Read", "input_schema": {"type": "object"}}
    added = {"name": "Grep", "description": "search", "input_schema": {"type": "object"}}
    body = {"model": "older", "max_tokens": 4, "system": "top", "tools": [tool], "messages": [
        {"role": "user", "content": "hello there"},
        {"role": "system", "content": [
            {"type": "text", "text": "A reminder."},
            {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": added}},
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Read"}}]},
        {"role": "user", "content": "go on"},
    ]}  # fmt: skip
    answer = await w.post("/v1/messages", body)
    assert answer.status_code == 200, answer.text
    chat = (await received(w.old))["body"]
    assert chat["messages"] == [
        {"role": "system", "content": "top"},
        {"role": "user", "content": "hello there"},
        {"role": "system", "content": "A reminder."},  # at its place
        {"role": "user", "content": "go on"},
    ]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "Grep", "description": "search", "parameters": {"type": "object"}}}]  # fmt: skip


@pytest.mark.parametrize("model", ["qwen", "older"])
async def test_claude_codes_request_is_served_both_ways(w: World, model: str) -> None:
    # The fake writes all of max_tokens (Claude Code asks for 32,000): keep it short.
    body = {**copy.deepcopy(CLAUDE_CODE["body"]), "model": model, "max_tokens": 8}
    headers = {k: v for k, v in CLAUDE_CODE["headers"].items() if k != "content-type"}
    answer = await w.post("/v1/messages", body, **headers)
    assert answer.status_code == 200, answer.text
    events = sse_data(answer.text)
    assert [events[0]["type"], events[-1]["type"]] == ["message_start", "message_stop"]
    roles = [m["role"] for m in CLAUDE_CODE["body"]["messages"]]
    assert roles == ["user", "system"]  # what Claude Code 2.1 sends: a system message inside
    if model == "qwen":
        sent = await received(w.native)
        assert sent["path"] == "/v1/messages"
        assert sent["body"] == {**body, "model": "served-model"}
        assert sent["headers"]["anthropic-beta"] == CLAUDE_CODE["headers"]["anthropic-beta"]
        return
    chat = (await received(w.old))["body"]
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "system"]
    assert chat["messages"][2]["content"] == CLAUDE_CODE["body"]["messages"][1]["content"]
    # Claude Code's per-request billing header is not part of the prompt (vLLM leaves it out).
    assert "x-anthropic-billing-header" not in chat["messages"][0]["content"]
    assert len(chat["tools"]) == len(CLAUDE_CODE["body"]["tools"])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["qwen", "older"])
async def test_usage_is_counted_once_on_both_paths(w: World, model: str, stream: bool) -> None:
    backend, fake, path = (
        ("native", w.native, "/v1/messages")
        if model == "qwen"
        else ("old", w.old, "/v1/chat/completions")
    )
    body = {"model": model, "max_tokens": 3, "messages": HELLO, "stream": stream}
    answer = await w.post("/v1/messages", body)
    assert answer.status_code == 200
    assert (await received(fake))["path"] == path
    usage = sse_data(answer.text)[-2]["usage"] if stream else answer.json()["usage"]
    assert usage["output_tokens"] == 3
    assert w.tokens(backend, "prompt") == usage["input_tokens"] == 2
    assert w.tokens(backend, "completion") == 3


async def test_what_only_the_translation_refuses_reaches_vllm_as_sent(w: World) -> None:
    reference = {"type": "tool_reference", "tool_name": "Read"}  # vLLM takes it (tool search)
    messages = [
        {"role": "user", "content": "find Read"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [reference]}]},
    ]  # fmt: skip
    native = await w.post("/v1/messages", {"model": "qwen", "max_tokens": 2, "messages": messages})
    assert native.status_code == 200
    assert (await received(w.native))["body"]["messages"] == messages
    older = await w.post("/v1/messages", {"model": "older", "max_tokens": 2, "messages": messages})
    assert older.status_code == 400
    assert "'tool_reference' are not supported" in older.json()["error"]["message"]


def _without_id(body: bytes) -> bytes:
    return re.sub(rb'"id":"[^"]*"', b'"id":"-"', body)
