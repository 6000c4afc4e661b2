"""System messages inside `messages` (Claude Code 2.1 sends them) and the tool changes they
may carry (vLLM 0.33's `AnthropicMessage` and `_resolve_tools`), translated to chat; and which
backends answer `/v1/messages` themselves."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.anthropic import to_openai_chat, tokenize_request
from app.errors import InvalidRequest
from app.settings import BackendConfig
from app.settings.endpoints import Api, with_messages

Json = dict[str, Any]
SCHEMA: Json = {"type": "object", "properties": {"path": {"type": "string"}}}
READ: Json = {"name": "Read", "description": "read a file", "input_schema": SCHEMA}
GREP: Json = {"name": "Grep", "input_schema": {"type": "object"}}
NOT_A_REFERENCE: Json = {"type": "tool_removal", "tool": {"type": "tool_definition",
                                                          "definition": GREP}}  # fmt: skip


def chat(messages: list[Json], **fields: Any) -> Json:
    body = {"model": "m", "max_tokens": 8, "messages": messages, **fields}
    return to_openai_chat(body, model="served", stream=False)


def fn(tool: Json) -> Json:
    function: Json = {"name": tool["name"]}
    if "description" in tool:
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    return {"type": "function", "function": function}


def added(tool: Json) -> Json:
    return {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": tool}}


def by_name(kind: str, name: str) -> Json:
    return {"type": kind, "tool": {"type": "tool_reference", "name": name}}


def system(*blocks: Json | str) -> Json:
    if len(blocks) == 1 and isinstance(blocks[0], str):
        return {"role": "system", "content": blocks[0]}
    return {"role": "system", "content": list(blocks)}


def test_a_system_message_keeps_its_place() -> None:
    out = chat(
        [
            {"role": "user", "content": "first"},
            system("Available agent types: ..."),
            {"role": "assistant", "content": "ok"},
            system({"type": "text", "text": "one "}, {"type": "text", "text": "two"}),
            {"role": "user", "content": "second"},
        ],
        system="top",
    )
    assert out["messages"] == [
        {"role": "system", "content": "top"},
        {"role": "user", "content": "first"},
        {"role": "system", "content": "Available agent types: ..."},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "one two"},  # joined as vLLM joins them
        {"role": "user", "content": "second"},
    ]


def test_billing_headers_and_empty_system_messages_are_left_out() -> None:
    billing = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cch=1;"}
    out = chat(
        [{"role": "user", "content": "hi"}, system(billing), system("")],
        system=[billing, {"type": "text", "text": "You are a Claude agent."}],
    )
    assert out["messages"] == [
        {"role": "system", "content": "You are a Claude agent."},
        {"role": "user", "content": "hi"},
    ]


def test_tool_additions_and_removals_leave_the_tools_in_effect_at_the_end() -> None:
    out = chat(
        [
            {"role": "user", "content": "hi"},
            system(added(GREP), by_name("tool_removal", "Read")),
            {"role": "user", "content": "go on"},
        ],
        tools=[READ],
    )
    assert out["tools"] == [fn(GREP)]
    assert out["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "go on"},  # a system message of tool changes only: none
    ]


def test_a_removed_tool_comes_back_by_reference_and_a_definition_replaces_in_place() -> None:
    newer_read = {**READ, "description": "read, newer"}
    out = chat(
        [
            system(by_name("tool_removal", "Read")),
            {"role": "user", "content": "hi"},
            system(by_name("tool_addition", "Read"), added(newer_read)),
        ],
        tools=[READ, GREP],
    )
    assert out["tools"] == [fn(newer_read), fn(GREP)]


def test_count_tokens_sees_the_same_tools() -> None:
    body = {"model": "m", "tools": [READ], "messages": [
        {"role": "user", "content": "hi"}, system(by_name("tool_removal", "Read"))]}  # fmt: skip
    assert "tools" not in tokenize_request(body, model="served")


@pytest.mark.parametrize(
    ("messages", "param", "message"),
    [
        (
            [{"role": "user", "content": "hi"}, system(by_name("tool_removal", "Bash"))],
            "messages[1].content[0].tool.name",
            "tool_removal references tool 'Bash', which is not declared in tools",
        ),
        (
            [{"role": "user", "content": [by_name("tool_addition", "Read")]}],
            "messages[0].content[0].type",
            'tool_addition blocks are only allowed in messages with role "system"',
        ),
        (
            [system(NOT_A_REFERENCE)],
            "messages[0].content[0].tool.type",
            "tool_removal only accepts a tool_reference",
        ),
        (
            [system({"type": "tool_addition"})],
            "messages[0].content[0].tool",
            "tool is required for tool_addition blocks",
        ),
        (
            [system({"type": "image", "source": {"type": "url", "url": "http://x"}})],
            "messages[0].content[0].type",
            "Content blocks of type 'image' are not supported here.",
        ),
        (
            [{"role": "tool", "content": "x"}],
            "messages[0].role",
            "expected 'user', 'assistant' or 'system', got 'tool'",
        ),
    ],
)
def test_what_vllm_refuses_is_refused(messages: list[Json], param: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        chat(messages, tools=[READ])
    assert caught.value.status == 400
    assert caught.value.param == param
    assert message in caught.value.message


def backend(**fields: Any) -> BackendConfig:
    return BackendConfig.model_validate({"url": "http://127.0.0.1:9", "models": ["m"], **fields})


def test_a_generate_backend_serves_messages_natively_unless_it_opts_out() -> None:
    assert Api.MESSAGES in backend().apis
    assert Api.MESSAGES not in backend(messages="translate").apis
    assert Api.CHAT in backend(messages="translate").apis
    assert Api.MESSAGES not in backend(runner="pooling").apis
    assert Api.MESSAGES in backend(runner="pooling", messages="native").apis
    assert Api.MESSAGES not in backend(endpoints=["chat"]).apis
    assert Api.MESSAGES not in backend(task="transcription").apis  # no generate task
    learned = frozenset({Api.CHAT, Api.MESSAGES})  # what a server's /openapi.json says
    assert with_messages(learned, "translate") == {Api.CHAT}
    assert with_messages(frozenset({Api.CHAT}), "native") == learned


def test_messages_with_endpoints_is_refused() -> None:
    with pytest.raises(ValidationError, match="the list says it all"):
        backend(endpoints=["chat"], messages="translate")
