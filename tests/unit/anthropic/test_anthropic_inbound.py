"""Anthropic's Messages API served by an OpenAI backend: requests, answers, errors, tokens."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming

from app.anthropic import (
    FINISH_REASONS,
    anthropic_error,
    anthropic_error_from_openai,
    count_tokens_answer,
    to_anthropic_message,
    to_openai_chat,
    tokenize_request,
)
from app.anthropic.response import STOP_REASONS
from app.errors import InvalidRequest

VLLM_EXTRAS = ("top_k", "add_generation_prompt", "continue_final_message")

Json = dict[str, Any]


def body(**fields: Any) -> Json:
    base: Json = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    return {**base, **fields}


def chat(**fields: Any) -> Json:
    return to_openai_chat(body(**fields), model="qwen", stream=False)


def completion(message: Json, finish: str | None = "stop", **choice: Any) -> Json:
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1,
        "model": "qwen",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


# --- requests --------------------------------------------------------------------------


def test_minimal_request() -> None:
    assert chat() == {
        "model": "qwen",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 256,
        "stream": False,
    }


def test_stream_asks_for_usage() -> None:
    out = to_openai_chat(body(), model="qwen", stream=True)
    assert out["stream"] is True
    assert out["stream_options"] == {"include_usage": True}


def test_sampling_and_stop() -> None:
    out = chat(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["END", "\n\n"])
    assert out["temperature"] == 0.2
    assert out["top_p"] == 0.9
    assert out["top_k"] == 40
    assert out["stop"] == ["END", "\n\n"]


def test_dropped_fields() -> None:
    out = chat(
        metadata={"user_id": "u"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        service_tier="auto",
        container="c",
        mcp_servers=[],
        something_new=1,
    )
    assert set(out) == {"model", "messages", "max_tokens", "stream"}


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        ("Be brief.", "Be brief."),
        (
            [
                {"type": "text", "text": "One.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Two."},
            ],
            "One.\n\nTwo.",
        ),
    ],
)
def test_system(system: object, expected: str) -> None:
    out = chat(system=system)
    assert out["messages"][0] == {"role": "system", "content": expected}
    assert out["messages"][1] == {"role": "user", "content": "Hi"}


def test_empty_system_is_left_out() -> None:
    assert chat(system="")["messages"] == [{"role": "user", "content": "Hi"}]


def test_user_text_blocks_become_one_string() -> None:
    content = [
        {"type": "text", "text": "<reminder>", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Question"},
    ]
    out = chat(messages=[{"role": "user", "content": content}])
    assert out["messages"] == [{"role": "user", "content": "<reminder>\nQuestion"}]


def test_images() -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
    ]
    out = chat(messages=[{"role": "user", "content": content}])
    assert out["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
            ],
        }
    ]


def test_tools_round_trip() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "text", "text": "Let me "},
                {"type": "text", "text": "check."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "weather",
                    "input": {"city": "Paris"},
                },
                {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 °C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "data"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    out = chat(messages=messages)
    assert out["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 °C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "no\ndata"},
        {"role": "user", "content": "Thanks"},
    ]


def test_assistant_with_only_tool_calls_has_no_content() -> None:
    messages = [
        {"role": "user", "content": "Go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
    ]
    out = chat(messages=messages)["messages"]
    assert out[1]["content"] is None
    assert out[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert out[2] == {"role": "tool", "tool_call_id": "t", "content": ""}
    assert len(out) == 3  # no empty user message after the tool result


def test_images_in_a_tool_result_follow_as_a_user_message() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": [{"type": "text", "text": "screenshot"}, image],
    }
    messages = [
        {"role": "user", "content": "Go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
        },
        {"role": "user", "content": [result]},
    ]
    out = chat(messages=messages)["messages"]
    assert out[2] == {"role": "tool", "tool_call_id": "t", "content": "screenshot"}
    assert out[3] == {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}],
    }


def test_prefill_is_continued() -> None:
    messages = [
        {"role": "user", "content": "JSON please"},
        {"role": "assistant", "content": "{"},
    ]
    out = chat(messages=messages)
    assert out["messages"][-1] == {"role": "assistant", "content": "{"}
    assert out["continue_final_message"] is True
    assert out["add_generation_prompt"] is False
    assert "continue_final_message" not in chat()


def test_tools_and_choice() -> None:
    tools = [
        {
            "name": "weather",
            "description": "Weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "custom", "name": "noop", "input_schema": {"type": "object"}},
    ]
    out = chat(tools=tools, tool_choice={"type": "auto"})
    assert out["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
    ]
    assert out["tool_choice"] == "auto"
    assert "parallel_tool_calls" not in out


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice(choice: Json, expected: object) -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    out = chat(tools=tools, tool_choice={**choice, "disable_parallel_tool_use": True})
    assert out["tool_choice"] == expected
    assert out["parallel_tool_calls"] is False


def test_tool_choice_without_tools_is_not_sent() -> None:
    assert "tool_choice" not in chat(tool_choice={"type": "any"})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": None}, "model"),
        ({"model": 3}, "model"),
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "Hi"}, "messages"),
        ({"messages": ["Hi"]}, "messages[0]"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "messages[0].content[0].source.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": []}],
                    }
                ]
            },
            "messages[0].content[0].input",
        ),
        ({"system": 3}, "system"),
        ({"system": [{"type": "image"}]}, "system[0].type"),
        ({"tools": {"name": "f"}}, "tools"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tools": [{"input_schema": {}}]}, "tools[0].name"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": 1.5}, "top_k"),
    ],
)
def test_invalid_requests_name_the_param(fields: Json, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        chat(**fields)
    assert caught.value.param == param
    assert caught.value.status == 400


def test_the_openai_sdk_accepts_the_request() -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    out = to_openai_chat(
        body(tools=tools, tool_choice={"type": "any"}, top_p=0.5, stop_sequences=["x"]),
        model="qwen",
        stream=True,
    )
    # A TypedDict: the keys are OpenAI's, plus vLLM's sampling and chat-template extras.
    known = set(CompletionCreateParamsStreaming.__annotations__) | set(VLLM_EXTRAS)
    assert set(out) <= known


# --- count_tokens ----------------------------------------------------------------------


def test_tokenize_request() -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    request = {"model": "claude", "system": "S", "messages": [{"role": "user", "content": "Hi"}]}
    assert tokenize_request({**request, "tools": tools}, model="qwen") == {
        "model": "qwen",
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
        "add_generation_prompt": True,
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
    }
    with pytest.raises(InvalidRequest) as caught:
        tokenize_request({"model": "claude", "messages": []}, model="qwen")
    assert caught.value.param == "messages"


def test_count_tokens_answer() -> None:
    answer = count_tokens_answer({"count": 42, "max_model_len": 8192, "tokens": [1] * 42})
    assert answer == {"input_tokens": 42}
    anthropic.types.MessageTokensCount.model_validate(answer)
    with pytest.raises(ValueError, match="count"):
        count_tokens_answer({"tokens": []})


# --- answers ---------------------------------------------------------------------------


def validate(message: Json) -> anthropic.types.Message:
    return anthropic.types.Message.model_validate(message)


def test_text_answer() -> None:
    out = to_anthropic_message(
        completion({"role": "assistant", "content": "Hello", "reasoning_content": "hm"}),
        model="claude-sonnet-4-5",
    )
    assert out == {
        "id": "msg_chatcmpl-abc",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }
    validate(out)


def test_tool_answer() -> None:
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "[1]"}},
        {"id": "call_3", "type": "function", "function": {"name": "h", "arguments": "{bad"}},
    ]
    out = to_anthropic_message(
        completion({"role": "assistant", "content": "Sure.", "tool_calls": calls}, "tool_calls"),
        model="m",
    )
    assert out["content"] == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "call_2", "name": "g", "input": {}},
        {"type": "tool_use", "id": "call_3", "name": "h", "input": {}},
    ]
    assert out["stop_reason"] == "tool_use"
    validate(out)


def test_empty_answer_has_no_blocks() -> None:
    out = to_anthropic_message(completion({"role": "assistant", "content": ""}), model="m")
    assert out["content"] == []
    validate(out)


@pytest.mark.parametrize(
    ("finish", "extra", "reason", "sequence"),
    [
        ("stop", {}, "end_turn", None),
        ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),
        ("stop", {"stop_reason": 151645}, "end_turn", None),  # a stop token id
        ("length", {}, "max_tokens", None),
        ("tool_calls", {}, "tool_use", None),
        ("content_filter", {}, "refusal", None),
        (None, {}, "end_turn", None),
        ("abort", {}, "end_turn", None),
    ],
)
def test_stop_reasons(finish: str | None, extra: Json, reason: str, sequence: str | None) -> None:
    out = to_anthropic_message(
        completion({"role": "assistant", "content": "x"}, finish, **extra), model="m"
    )
    assert (out["stop_reason"], out["stop_sequence"]) == (reason, sequence)
    validate(out)


def test_stop_reasons_reverse_finish_reasons() -> None:
    for openai_reason, anthropic_reason in STOP_REASONS.items():
        assert FINISH_REASONS[anthropic_reason] == openai_reason
    assert set(STOP_REASONS) == set(FINISH_REASONS.values())


def test_answer_without_id_or_usage() -> None:
    out = to_anthropic_message({"choices": [{"message": {"content": "x"}}]}, model="m")
    assert out["id"].startswith("msg_")
    assert len(out["id"]) > len("msg_")
    assert out["usage"] == {"input_tokens": 0, "output_tokens": 0}
    validate(out)


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_types(status: int, kind: str) -> None:
    error = anthropic_error(status, "Nope.")
    assert error == {"type": "error", "error": {"type": kind, "message": "Nope."}}
    if status != 413:  # request_too_large is in Anthropic's errors page, not in the SDK's types
        anthropic.types.ErrorResponse.model_validate(error)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"error": {"message": "Model not found", "type": "invalid_request_error"}},
            "Model not found",
        ),
        (
            {"object": "error", "message": "max_tokens too large", "code": 400},
            "max_tokens too large",
        ),
        ({"detail": "nope"}, "The upstream answered HTTP 400."),
        ("<html>", "The upstream answered HTTP 400."),
    ],
)
def test_errors_from_openai(raw: object, message: str) -> None:
    body = raw.encode() if isinstance(raw, str) else json.dumps(raw).encode()
    error = anthropic_error_from_openai(400, body)
    assert error == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }
    assert anthropic_error_from_openai(503, b"\xff")["error"]["type"] == "overloaded_error"
