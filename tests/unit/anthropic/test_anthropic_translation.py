from __future__ import annotations

import json
from typing import Any

import pytest

from app.anthropic import (
    ANTHROPIC_VERSION,
    SseParser,
    StreamTranslator,
    anthropic_headers,
    openai_error_from_anthropic,
    to_anthropic_request,
    to_openai_completion,
)
from app.errors import InvalidRequest

Json = dict[str, Any]

UPSTREAM_MODEL = "claude-sonnet-4-5"
MODEL = "cloud-claude"  # the name the client asked for
CREATED = 1_700_000_000


def translate(**body: Any) -> Json:
    return to_anthropic_request(body, model=UPSTREAM_MODEL, default_max_tokens=4096, stream=False)


def user(content: Any) -> Json:
    return {"role": "user", "content": content}


def assistant(content: Any = None, **fields: Any) -> Json:
    return {"role": "assistant", "content": content, **fields}


def text(value: str) -> Json:
    return {"type": "text", "text": value}


def call(call_id: str, name: str, arguments: str) -> Json:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


HI = [user("hi")]


# --- request ---------------------------------------------------------------------------


def test_a_minimal_request() -> None:
    assert translate(messages=HI) == {
        "model": UPSTREAM_MODEL,
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
    }


def test_stream_is_set_from_the_argument() -> None:
    body = {"messages": HI, "stream": False}
    request = to_anthropic_request(body, model="m", default_max_tokens=1, stream=True)
    assert request["stream"] is True


def test_system_and_developer_messages_become_the_top_level_system_in_order() -> None:
    request = translate(
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": [text("Answer in French."), text("No emoji.")]},
            user("hi"),
            assistant("salut"),
            {"role": "system", "content": "Late rule.", "name": "ops"},
            user("encore"),
        ]
    )
    assert request["system"] == "You are terse.\n\nAnswer in French.\n\nNo emoji.\n\nLate rule."
    assert request["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "salut"},
        {"role": "user", "content": "encore"},
    ]


def test_an_empty_system_is_not_sent() -> None:
    assert "system" not in translate(messages=[{"role": "system", "content": ""}, *HI])


def test_consecutive_messages_of_one_role_are_merged() -> None:
    request = translate(
        messages=[
            user("one"),
            user([text("two"), text("three")]),
            assistant("four"),
            assistant([text("five")]),
            user("six"),
        ]
    )
    assert request["messages"] == [
        {"role": "user", "content": [text("one"), text("two"), text("three")]},
        {"role": "assistant", "content": [text("four"), text("five")]},
        {"role": "user", "content": "six"},
    ]


def test_empty_text_is_dropped_and_an_empty_message_left_out() -> None:
    request = translate(messages=[user("hi"), assistant(""), user([text(""), text("there")])])
    assert request["messages"] == [{"role": "user", "content": [text("hi"), text("there")]}]


def test_a_tool_round_trip() -> None:
    request = translate(
        messages=[
            user("Weather in Paris and Rome?"),
            assistant(
                "Checking.",
                tool_calls=[
                    call("call_1", "get_weather", '{"city": "Paris"}'),
                    call("call_2", "get_weather", '{"city": "Rome", "unit": "c"}'),
                ],
            ),
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": [text("21C")]},
            user("Thanks!"),
            assistant("You're welcome."),
        ]
    )
    assert request["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                text("Checking."),
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "call_2",
                    "name": "get_weather",
                    "input": {"city": "Rome", "unit": "c"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": [text("21C")]},
                text("Thanks!"),
            ],
        },
        {"role": "assistant", "content": "You're welcome."},
    ]


def test_tool_calls_without_text_and_empty_arguments() -> None:
    request = translate(
        messages=[*HI, assistant(None, tool_calls=[call("c", "now", "")])],
    )
    assert request["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c", "name": "now", "input": {}}],
    }


def test_tool_results_go_before_text_in_a_merged_user_turn() -> None:
    request = translate(
        messages=[
            *HI,
            assistant(tool_calls=[call("c", "f", "{}")]),
            user("also this"),
            {"role": "tool", "tool_call_id": "c", "content": None},
        ]
    )
    assert request["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "c", "content": ""}, text("also this")],
    }


def test_tool_call_ids_from_other_providers_are_made_safe_on_both_sides() -> None:
    request = translate(
        messages=[
            *HI,
            assistant(tool_calls=[call("functions.get_weather:0", "get_weather", "{}")]),
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "ok"},
        ]
    )
    assert request["messages"][1]["content"][0]["id"] == "functions_get_weather_0"
    assert request["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "functions_get_weather_0", "content": "ok"}
    ]


def test_an_assistant_refusal_part_is_sent_as_text() -> None:
    request = translate(messages=[*HI, assistant([{"type": "refusal", "refusal": "No."}])])
    assert request["messages"][1] == {"role": "assistant", "content": "No."}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}


def test_tools_are_converted() -> None:
    bare = {"type": "function", "function": {"name": "now"}}
    assert translate(messages=HI, tools=[WEATHER_TOOL, bare])["tools"] == [
        {
            "name": "get_weather",
            "description": "Current weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"name": "now", "input_schema": {"type": "object", "properties": {}}},
    ]


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("tool_choice", "parallel", "expected"),
    [
        (None, None, None),
        ("auto", None, {"type": "auto"}),
        ("required", None, {"type": "any"}),
        ("none", None, {"type": "none"}),
        (NAMED, None, {"type": "tool", "name": "get_weather"}),
        (None, True, None),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (NAMED, False, {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}),
        ("none", False, {"type": "none"}),
    ],
)
def test_tool_choice(tool_choice: Any, parallel: bool | None, expected: Json | None) -> None:
    request = translate(
        messages=HI, tools=[WEATHER_TOOL], tool_choice=tool_choice, parallel_tool_calls=parallel
    )
    assert request.get("tool_choice") == expected
    assert len(request["tools"]) == 1  # "none" keeps the tools declared, as OpenAI does


@pytest.mark.parametrize("tool_choice", ["auto", "required", "none", NAMED])
def test_tool_choice_without_tools_is_not_sent(tool_choice: Any) -> None:
    request = translate(messages=HI, tool_choice=tool_choice, tools=[])
    assert "tool_choice" not in request
    assert "tools" not in request


@pytest.mark.parametrize(
    ("url", "source"),
    [
        (
            "data:image/png;base64,iVBORw0KGgo=",
            {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        ),
        (
            "data:image/jpeg;charset=binary;base64,/9j/4AAQ",
            {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"},
        ),
        (
            "https://example.com/cat.png?size=large",
            {"type": "url", "url": "https://example.com/cat.png?size=large"},
        ),
        ("HTTP://example.com/a.gif", {"type": "url", "url": "HTTP://example.com/a.gif"}),
    ],
)
def test_images(url: str, source: Json) -> None:
    parts = [
        text("What is this?"),
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
    ]
    assert translate(messages=[user(parts)])["messages"] == [
        {"role": "user", "content": [text("What is this?"), {"type": "image", "source": source}]}
    ]


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (None, None),
        ("###", ["###"]),
        (["\n\nHuman:", "END"], ["\n\nHuman:", "END"]),
        ([], None),
    ],
)
def test_stop_becomes_stop_sequences(stop: Any, expected: list[str] | None) -> None:
    assert translate(messages=HI, stop=stop).get("stop_sequences") == expected


@pytest.mark.parametrize(
    ("temperature", "expected"),
    [(None, None), (0, 0.0), (0.7, 0.7), (1, 1.0), (1.3, 1.0), (2, 1.0)],
)
def test_temperature_is_clamped_into_0_1(temperature: Any, expected: float | None) -> None:
    assert translate(messages=HI, temperature=temperature).get("temperature") == expected


@pytest.mark.parametrize(("top_p", "expected"), [(None, None), (0.9, 0.9), (1, 1.0)])
def test_top_p_is_passed_on(top_p: Any, expected: float | None) -> None:
    assert translate(messages=HI, top_p=top_p).get("top_p") == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, 4096),
        ({"max_tokens": 100}, 100),
        ({"max_completion_tokens": 200}, 200),
        ({"max_tokens": 100, "max_completion_tokens": 200}, 200),
        ({"max_tokens": 100, "max_completion_tokens": None}, 100),
        ({"max_tokens": None}, 4096),
    ],
)
def test_max_tokens_precedence_and_default(fields: Json, expected: int) -> None:
    assert translate(messages=HI, **fields)["max_tokens"] == expected


def test_ignorable_parameters_are_dropped() -> None:
    request = translate(
        model="client-name",
        messages=HI,
        user="u-42",
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={"50256": -100},
        stream_options={"include_usage": True},
        response_format={"type": "text"},
        n=1,
        logprobs=False,
        top_logprobs=0,
        metadata={"k": "v"},
        store=False,
    )
    assert request == translate(messages=HI)


BAD_REQUESTS = [
    (
        {"messages": [*HI, assistant(tool_calls=[call("c", "f", '{"city": "Par')])]},
        "messages[1].tool_calls[0].function.arguments",
        "invalid_value",
        "not valid JSON",
    ),
    (
        {"messages": [*HI, assistant(tool_calls=[call("c", "f", "[1, 2]")])]},
        "messages[1].tool_calls[0].function.arguments",
        "invalid_value",
        "expected a JSON object, got array",
    ),
    (
        {
            "messages": [
                *HI,
                assistant(tool_calls=[{"type": "function", "function": {"name": "f"}}]),
            ]
        },
        "messages[1].tool_calls[0].id",
        None,
        "Missing required parameter",
    ),
    ({"messages": HI, "n": 2}, "n", "unsupported_value", "Anthropic returns one choice"),
    ({"messages": HI, "n": "2"}, "n", "invalid_type", "expected an integer"),
    ({"messages": HI, "logprobs": True}, "logprobs", "unsupported_value", "'logprobs'"),
    ({"messages": HI, "top_logprobs": 3}, "top_logprobs", "unsupported_value", "top_logprobs"),
    (
        {"messages": HI, "response_format": {"type": "json_object"}},
        "response_format",
        "unsupported_value",
        "'json_object'",
    ),
    ({"messages": HI, "functions": [{"name": "f"}]}, "functions", "unsupported_value", "tools"),
    ({"messages": HI, "temperature": 2.5}, "temperature", "invalid_value", "expected 0 to 2"),
    ({"messages": HI, "temperature": -0.1}, "temperature", "invalid_value", "expected 0 to 2"),
    ({"messages": HI, "temperature": "hot"}, "temperature", "invalid_type", "a number"),
    ({"messages": HI, "temperature": True}, "temperature", "invalid_type", "got boolean"),
    ({"messages": HI, "top_p": 0}, "top_p", "invalid_value", "0 < top_p <= 1"),
    ({"messages": HI, "top_p": 1.5}, "top_p", "invalid_value", "0 < top_p <= 1"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens", "invalid_value", ">= 1"),
    ({"messages": HI, "max_completion_tokens": 1.5}, "max_completion_tokens", "invalid_type", ""),
    ({"messages": HI, "stop": 5}, "stop", "invalid_type", "array of strings"),
    ({"messages": "hi"}, "messages", "invalid_type", "expected an array"),
    ({"messages": ["hi"]}, "messages[0]", "invalid_type", "expected an object"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role", "invalid_value", ""),
    (
        {"messages": [*HI, {"role": "tool", "content": "18C"}]},
        "messages[1].tool_call_id",
        None,
        "Missing required parameter",
    ),
    (
        {"messages": [user([{"type": "image_url", "image_url": {"url": "ftp://x/a.png"}}])]},
        "messages[0].content[0].image_url.url",
        "invalid_value",
        "base64 data URL",
    ),
    (
        {"messages": [user([{"type": "image_url", "image_url": {"url": "data:image/png,AAAA"}}])]},
        "messages[0].content[0].image_url.url",
        "invalid_value",
        "base64 data URL",
    ),
    (
        {
            "messages": [
                user([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}])
            ]
        },
        "messages[0].content[0].type",
        "unsupported_value",
        "'input_audio'",
    ),
    (
        {"messages": [{"role": "system", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0].type",
        "unsupported_value",
        "'image_url'",
    ),
    (
        {"messages": HI, "tools": [{"type": "web_search"}]},
        "tools[0].type",
        "unsupported_value",
        "'function'",
    ),
    (
        {"messages": HI, "tools": [{"type": "function", "function": {}}]},
        "tools[0].function.name",
        None,
        "Missing required parameter",
    ),
    ({"messages": HI, "tool_choice": "any"}, "tool_choice", "invalid_value", "'required'"),
    (
        {"messages": HI, "parallel_tool_calls": "no"},
        "parallel_tool_calls",
        "invalid_type",
        "a boolean",
    ),
]


@pytest.mark.parametrize(("body", "param", "code", "message"), BAD_REQUESTS)
def test_bad_requests_are_400_naming_the_param(
    body: Json, param: str, code: str | None, message: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        to_anthropic_request(body, model="m", default_max_tokens=16, stream=False)
    error = info.value
    assert (error.status, error.param, error.code) == (400, param, code)
    assert message in error.message


def test_headers() -> None:
    assert ANTHROPIC_VERSION == "2023-06-01"
    assert anthropic_headers("sk-ant-test") == {
        "x-api-key": "sk-ant-test",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    assert anthropic_headers("k", version="2026-10-21")["anthropic-version"] == "2026-10-21"


# --- non-streaming response ------------------------------------------------------------


def message(content: list[Json], stop_reason: str | None = "end_turn", **fields: Any) -> Json:
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": UPSTREAM_MODEL,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 6},
        **fields,
    }


def complete(response: Json) -> Json:
    return to_openai_completion(response, model=MODEL, created=CREATED)


def test_a_text_response() -> None:
    response = message([text("Hello"), text(", world")])
    assert complete(response) == {
        "id": "chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL",
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello, world", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
    }


def test_a_tool_use_response() -> None:
    response = message(
        [
            {"type": "thinking", "thinking": "The user wants weather.", "signature": "sig"},
            text("Let me check."),
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
            {"type": "tool_use", "id": "toolu_02", "name": "now", "input": {}},
        ],
        stop_reason="tool_use",
    )
    choice = complete(response)["choices"][0]
    assert choice == {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": "Let me check.",
            "refusal": None,
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "toolu_02",
                    "type": "function",
                    "function": {"name": "now", "arguments": "{}"},
                },
            ],
        },
        "logprobs": None,
        "finish_reason": "tool_calls",
    }


def test_only_tool_calls_means_null_content() -> None:
    response = message(
        [{"type": "tool_use", "id": "toolu_01", "name": "f", "input": {"é": "ü"}}],
        stop_reason="tool_use",
    )
    result = complete(response)["choices"][0]["message"]
    assert result["content"] is None
    assert result["tool_calls"][0]["function"]["arguments"] == '{"é":"ü"}'


def test_no_content_at_all_means_empty_content() -> None:
    assert complete(message([], stop_reason="max_tokens"))["choices"][0]["message"]["content"] == ""


def test_usage_counts_cache_reads_and_writes_as_prompt_tokens() -> None:
    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 3000,
        "output_tokens": 50,
    }
    assert complete(message([text("x")], usage=usage))["usage"] == {
        "prompt_tokens": 3210,
        "completion_tokens": 50,
        "total_tokens": 3260,
        "prompt_tokens_details": {"cached_tokens": 3000},
    }


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("brand_new_reason", "brand_new_reason"),
        (None, "stop"),
    ],
)
def test_stop_reasons(stop_reason: str | None, finish_reason: str) -> None:
    choice = complete(message([text("x")], stop_reason=stop_reason))["choices"][0]
    assert choice["finish_reason"] == finish_reason
    assert "stop_reason" not in choice


def test_the_matched_stop_sequence_is_kept() -> None:
    response = message([text("x")], stop_reason="stop_sequence", stop_sequence="###")
    choice = complete(response)["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "###")


def test_a_response_without_an_id_still_gets_one() -> None:
    response = message([text("x")])
    del response["id"]
    assert complete(response)["id"].startswith("chatcmpl-")


# --- errors ----------------------------------------------------------------------------


def anthropic_error(kind: str, text_: str, **extra: Any) -> bytes:
    error = {"type": kind, "message": text_, **extra}
    return json.dumps({"type": "error", "error": error, "request_id": "req_011"}).encode()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            anthropic_error("invalid_request_error", "messages: roles must alternate"),
            ("messages: roles must alternate", "invalid_request_error", None),
        ),
        (
            401,
            anthropic_error("authentication_error", "invalid x-api-key"),
            ("invalid x-api-key", "server_error", "upstream_authentication_failed"),
        ),
        (
            403,
            anthropic_error("permission_error", "no access"),
            ("no access", "server_error", "upstream_permission_denied"),
        ),
        (
            404,
            anthropic_error("not_found_error", "model: claude-x"),
            ("model: claude-x", "server_error", "upstream_not_found"),
        ),
        (
            413,
            anthropic_error("request_too_large", "too big"),
            ("too big", "invalid_request_error", "request_too_large"),
        ),
        (
            429,
            anthropic_error("rate_limit_error", "slow down"),
            ("slow down", "rate_limit_error", "rate_limit_exceeded"),
        ),
        (
            429,
            anthropic_error(
                "rate_limit_error",
                "spend limit",
                details={"error_code": "enforced_spend_limit_reached"},
            ),
            ("spend limit", "rate_limit_error", "enforced_spend_limit_reached"),
        ),
        (
            500,
            anthropic_error("api_error", "oops"),
            ("oops", "server_error", "upstream_error"),
        ),
        (
            529,
            anthropic_error("overloaded_error", "Overloaded"),
            ("Overloaded", "server_error", "upstream_overloaded"),
        ),
        (
            402,
            anthropic_error("billing_error", "pay up"),
            ("pay up", "server_error", "upstream_billing_error"),
        ),
        (
            503,
            anthropic_error("some_future_error", "new"),
            ("new", "server_error", "upstream_error"),
        ),
        (
            418,
            anthropic_error("some_future_error", "teapot"),
            ("teapot", "invalid_request_error", None),
        ),
        (
            413,
            b"<html><body>413 Request Entity Too Large</body></html>",
            ("The Anthropic API answered HTTP 413.", "invalid_request_error", "request_too_large"),
        ),
        (
            529,
            b"",
            ("The Anthropic API answered HTTP 529.", "server_error", "upstream_overloaded"),
        ),
        (
            502,
            b'["not", "an", "object"]',
            ("The Anthropic API answered HTTP 502.", "server_error", "upstream_error"),
        ),
        (
            401,
            b'{"type": "error", "error": {"type": "authentication_error"}}',
            (
                "The Anthropic API answered HTTP 401.",
                "server_error",
                "upstream_authentication_failed",
            ),
        ),
    ],
)
def test_anthropic_errors_become_openai_envelopes(
    status: int, body: bytes, expected: tuple[str, str, str | None]
) -> None:
    message_, type_, code = expected
    assert openai_error_from_anthropic(status, body) == {
        "error": {"message": message_, "type": type_, "param": None, "code": code}
    }


# --- streaming -------------------------------------------------------------------------


def sse(event: str, data: Json) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def message_start(input_tokens: int = 25, **usage: int) -> Json:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": UPSTREAM_MODEL,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1, **usage},
        },
    }


def block_start(index: int, block: Json) -> Json:
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index: int, delta: Json) -> Json:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def text_delta(index: int, value: str) -> Json:
    return block_delta(index, {"type": "text_delta", "text": value})


def json_delta(index: int, partial: str) -> Json:
    return block_delta(index, {"type": "input_json_delta", "partial_json": partial})


def block_stop(index: int) -> Json:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str | None, output_tokens: int | None, **delta: Any) -> Json:
    data: Json = {"type": "message_delta", "delta": {"stop_reason": stop_reason, **delta}}
    if output_tokens is not None:
        data["usage"] = {"output_tokens": output_tokens}
    return data


PING = {"type": "ping"}
MESSAGE_STOP = {"type": "message_stop"}

TEXT_EVENTS: list[Json] = [
    message_start(),
    block_start(0, {"type": "text", "text": ""}),
    PING,
    text_delta(0, "Hello"),
    text_delta(0, " wörld 🙂"),
    block_stop(0),
    message_delta("end_turn", 15),
    MESSAGE_STOP,
]

TOOL_EVENTS: list[Json] = [
    message_start(input_tokens=472),
    block_start(0, {"type": "text", "text": ""}),
    text_delta(0, "Let me check."),
    block_stop(0),
    block_start(1, {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}}),
    json_delta(1, ""),
    json_delta(1, '{"city":'),
    json_delta(1, ' "Paris"}'),
    block_stop(1),
    block_start(2, {"type": "tool_use", "id": "toolu_02", "name": "now", "input": {}}),
    json_delta(2, "{}"),
    block_stop(2),
    message_delta("tool_use", 89),
    MESSAGE_STOP,
]


def stream_bytes(events: list[Json]) -> bytes:
    return b"".join(sse(event["type"], event) for event in events)


def run(events: list[Json], *, include_usage: bool = False, finish: bool = True) -> list[Any]:
    """Feed events, then end the body; the output decoded ("[DONE]" kept as a string)."""
    translator = StreamTranslator(MODEL, CREATED, include_usage)
    lines: list[bytes] = []
    for event in events:
        lines.extend(translator.feed(event["type"], event))
    if finish:
        lines.extend(translator.finish())
    return decode(lines)


def decode(lines: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for line in lines:
        assert line.startswith(b"data: ")
        assert line.endswith(b"\n\n")
        payload = line[len(b"data: ") : -2]
        out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


def chunk(delta: Json, finish_reason: str | None = None, **extra: Any) -> Json:
    return {
        "id": "chatcmpl-msg_01",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, **extra}
        ],
    }


def usage_chunk(prompt: int, completion: int, **details: Any) -> Json:
    usage: Json = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        **details,
    }
    return {
        "id": "chatcmpl-msg_01",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [],
        "usage": usage,
    }


ROLE = chunk({"role": "assistant", "content": ""})


def test_a_text_stream() -> None:
    assert run(TEXT_EVENTS) == [
        ROLE,
        chunk({"content": "Hello"}),
        chunk({"content": " wörld 🙂"}),
        chunk({}, "stop"),
        "[DONE]",
    ]


def test_a_text_stream_with_usage() -> None:
    assert run(TEXT_EVENTS, include_usage=True)[-3:] == [
        chunk({}, "stop"),
        usage_chunk(25, 15),
        "[DONE]",
    ]


def test_a_text_then_tool_use_stream() -> None:
    assert run(TOOL_EVENTS, include_usage=True) == [
        ROLE,
        chunk({"content": "Let me check."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "toolu_01",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "toolu_02",
                        "type": "function",
                        "function": {"name": "now", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
        usage_chunk(472, 89),
        "[DONE]",
    ]


def test_chunks_are_compact_json_in_utf8() -> None:
    translator = StreamTranslator(MODEL, CREATED, include_usage=False)
    assert translator.feed("message_start", message_start()) == [
        b'data: {"id":"chatcmpl-msg_01","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"cloud-claude","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        b'"logprobs":null,"finish_reason":null}]}\n\n'
    ]
    [line] = translator.feed("content_block_delta", text_delta(0, "é"))
    assert b'"delta":{"content":"\xc3\xa9"}' in line


def test_thinking_is_dropped() -> None:
    events = [
        message_start(),
        block_start(0, {"type": "thinking", "thinking": ""}),
        block_delta(0, {"type": "thinking_delta", "thinking": "Let me think"}),
        block_delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}),
        block_stop(0),
        block_start(1, {"type": "text", "text": ""}),
        text_delta(1, "42"),
        block_stop(1),
        message_delta("end_turn", 30),
        MESSAGE_STOP,
    ]
    assert run(events) == [ROLE, chunk({"content": "42"}), chunk({}, "stop"), "[DONE]"]


def test_usage_is_cumulative_and_counts_the_cache() -> None:
    events = [
        message_start(input_tokens=5, cache_creation_input_tokens=100, cache_read_input_tokens=900),
        text_delta(0, "x"),
        message_delta(None, 10),
        message_delta("max_tokens", 20),
        message_delta(None, None),  # no usage: the count stays
        MESSAGE_STOP,
    ]
    assert run(events, include_usage=True)[-3:] == [
        chunk({}, "length"),
        usage_chunk(1005, 20, prompt_tokens_details={"cached_tokens": 900}),
        "[DONE]",
    ]


def test_a_stop_sequence_is_kept_in_the_final_chunk() -> None:
    events = [message_start(), message_delta("stop_sequence", 3, stop_sequence="###"), MESSAGE_STOP]
    assert run(events)[-2] == chunk({}, "stop", stop_reason="###")


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        (None, "stop"),
    ],
)
def test_stream_finish_reasons(stop_reason: str | None, finish_reason: str) -> None:
    events = [message_start(), message_delta(stop_reason, 1), MESSAGE_STOP]
    assert run(events)[-2] == chunk({}, finish_reason)


OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_an_error_mid_stream_ends_it() -> None:
    translator = StreamTranslator(MODEL, CREATED, include_usage=True)
    lines: list[bytes] = []
    for event in [message_start(), text_delta(0, "Hel"), OVERLOADED]:
        lines.extend(translator.feed(event["type"], event))
    assert decode(lines) == [
        ROLE,
        chunk({"content": "Hel"}),
        {
            "error": {
                "message": "Overloaded",
                "type": "server_error",
                "param": None,
                "code": "upstream_overloaded",
            }
        },
        "[DONE]",
    ]
    assert translator.done
    assert translator.feed("content_block_delta", text_delta(0, "lo")) == []
    assert translator.feed("message_stop", MESSAGE_STOP) == []
    assert translator.finish() == []


def test_an_error_without_details() -> None:
    assert run([{"type": "error"}]) == [
        {
            "error": {
                "message": "The Anthropic API reported an error.",
                "type": "server_error",
                "param": None,
                "code": "upstream_error",
            }
        },
        "[DONE]",
    ]


INCOMPLETE = {
    "error": {
        "message": "The Anthropic stream ended before the message was complete.",
        "type": "server_error",
        "param": None,
        "code": "upstream_incomplete",
    }
}


@pytest.mark.parametrize("cut", [0, 1, 4, len(TOOL_EVENTS) - 1])
def test_a_stream_cut_before_message_stop_ends_with_an_error(cut: int) -> None:
    out = run(TOOL_EVENTS[:cut], include_usage=True)
    assert out[-2:] == [INCOMPLETE, "[DONE]"]
    assert not any(isinstance(o, dict) and o.get("choices") == [] for o in out)  # no usage chunk


def test_finish_after_message_stop_adds_nothing() -> None:
    translator = StreamTranslator(MODEL, CREATED, include_usage=False)
    for event in TEXT_EVENTS:
        translator.feed(event["type"], event)
    assert translator.done
    assert translator.finish() == []


@pytest.mark.parametrize("name", ["message", ""])
def test_the_event_name_falls_back_to_the_data_type(name: str) -> None:
    translator = StreamTranslator(MODEL, CREATED, include_usage=False)
    assert decode(translator.feed(name, message_start())) == [ROLE]


def test_unknown_events_and_deltas_are_ignored() -> None:
    events = [
        message_start(),
        {"type": "brand_new_event", "x": 1},
        block_delta(0, {"type": "citations_delta", "citation": {}}),
        json_delta(7, '{"orphan": 1}'),  # not a tool_use block we know
        message_delta("end_turn", 1),
        MESSAGE_STOP,
    ]
    assert run(events) == [ROLE, chunk({}, "stop"), "[DONE]"]


def test_chunks_before_message_start_share_one_generated_id() -> None:
    out = run([text_delta(0, "a"), text_delta(0, "b"), MESSAGE_STOP])
    ids = {o["id"] for o in out[:3]}
    assert len(ids) == 1
    assert ids.pop().startswith("chatcmpl-")


# --- SSE parser ------------------------------------------------------------------------

PARSER_INPUT = (
    b": a comment\n"
    b"event: message_start\n"
    b'data: {"a":1}\n'
    b"\n"
    b"event: ping\n"
    b'data: {"type": "ping"}\n'
    b"\n"
    b"id: 7\n"
    b"retry: 1000\n"
    b"data: first line\n"
    b"data:second line\n"
    b"data:  two spaces\n"
    b"\n"
    b"event: empty\n"
    b"\n"
    b"event: content_block_delta\n"
    b'data: {"text":"w\xc3\xb6rld \xf0\x9f\x99\x82"}\n'
    b"\n"
    b"data: unterminated"
)
PARSER_EVENTS = [
    ("message_start", '{"a":1}'),
    ("ping", '{"type": "ping"}'),
    ("message", "first line\nsecond line\n two spaces"),
    ("content_block_delta", '{"text":"wörld 🙂"}'),
]


def parse(*chunks: bytes) -> list[tuple[str, str]]:
    parser = SseParser()
    events: list[tuple[str, str]] = []
    for piece in chunks:
        events.extend(parser.feed(piece))
    return events


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_sse_parser_at_every_split_point(eol: bytes) -> None:
    raw = PARSER_INPUT.replace(b"\n", eol)
    assert parse(raw) == PARSER_EVENTS
    for split in range(len(raw) + 1):
        assert parse(raw[:split], raw[split:]) == PARSER_EVENTS, split


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_sse_parser_byte_by_byte(eol: bytes) -> None:
    raw = PARSER_INPUT.replace(b"\n", eol)
    assert parse(*(raw[i : i + 1] for i in range(len(raw)))) == PARSER_EVENTS


def test_sse_parser_skips_a_byte_order_mark_and_empty_chunks() -> None:
    raw = b"\xef\xbb\xbfevent: x\ndata: 1\n\n"
    assert parse(b"", raw[:1], raw[1:2], b"", raw[2:]) == [("x", "1")]


def test_sse_parser_a_field_without_colon() -> None:
    assert parse(b"data\n\nevent: e\ndata\ndata\n\n") == [("message", ""), ("e", "\n")]


def test_a_recorded_stream_through_parser_and_translator_at_every_split_point() -> None:
    raw = stream_bytes(TOOL_EVENTS).replace(b"\n", b"\r\n")
    expected = run(TOOL_EVENTS, include_usage=True)
    for split in range(0, len(raw) + 1, 7):
        parser = SseParser()
        translator = StreamTranslator(MODEL, CREATED, include_usage=True)
        lines: list[bytes] = []
        for piece in (raw[:split], raw[split:]):
            for event, data in parser.feed(piece):
                lines.extend(translator.feed(event, json.loads(data)))
        lines.extend(translator.finish())
        assert decode(lines) == expected, split
