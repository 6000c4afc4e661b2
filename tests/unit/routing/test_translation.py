"""A Messages request in another API (`app.routing.translation`): the upstream call
shaped from a route and the request as read. Pure, but for the way back (an answer)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.errors import InvalidRequest
from app.jsonwire import json_bytes
from app.routing.registry import Route
from app.routing.translation import count_tokens_as_tokenize, messages_as_chat
from app.settings.endpoints import Api
from app.upstreams.http import BufferedResponse

# The client asked for an alias; its backend serves another name.
ROUTE = Route(name="claude-local", backend="b", upstream_model="qwen-7b")
HEADERS = {"anthropic-version": "2023-06-01", "x-trace": "t1"}


@dataclass(frozen=True)
class Read:
    """A request as the API read it (`app.api.protocol.ParsedRequest`'s shape)."""

    stream: bool = False
    model: str = "claude-local"
    payload: dict[str, Any] = field(
        default_factory=lambda: {
            "model": "claude-local",
            "max_tokens": 64,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}],
        }
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_messages_request_becomes_a_chat_completion_for_the_upstream_model(stream: bool) -> None:
    translated = messages_as_chat(Read(stream=stream), ROUTE, HEADERS)
    call = translated.call
    assert (call.path, call.api, call.stream, call.route) == (
        "/v1/chat/completions",
        Api.CHAT,
        stream,
        ROUTE,
    )
    sent = json.loads(call.body)
    assert sent == call.payload  # the bytes are the payload, written once
    assert call.body == json_bytes(call.payload)
    assert sent["model"] == "qwen-7b"
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert sent["max_tokens"] == 64
    assert sent.get("stream", False) is stream
    assert call.headers == HEADERS | {"content-type": "application/json"}
    assert HEADERS == {"anthropic-version": "2023-06-01", "x-trace": "t1"}  # not changed


def test_a_count_tokens_request_becomes_vllms_tokenize_in_its_chat_form() -> None:
    translated = count_tokens_as_tokenize(Read(stream=True), ROUTE, HEADERS)
    call = translated.call
    assert (call.path, call.api, call.stream) == ("/tokenize", Api.TOKENIZE, False)
    assert json.loads(call.body) == call.payload
    assert call.payload == {
        "model": "qwen-7b",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ],
        "add_generation_prompt": True,
    }
    assert call.headers["content-type"] == "application/json"
    assert call.headers["x-trace"] == "t1"


@pytest.mark.parametrize("translation", [messages_as_chat, count_tokens_as_tokenize])
def test_a_request_the_translation_cannot_carry_is_invalid(translation: Any) -> None:
    unknown = Read(payload={"model": "claude-local", "messages": [{"role": "robot"}]})
    with pytest.raises(InvalidRequest):
        translation(unknown, ROUTE, HEADERS)


async def test_the_answer_comes_back_as_a_message_named_as_the_client_asked() -> None:
    translated = messages_as_chat(Read(), ROUTE, HEADERS)
    chat = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "qwen-7b",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    answer = await translated.answer(BufferedResponse(200, json_bytes(chat)), 5.0)
    message = json.loads(answer.first_chunk)
    assert message["type"] == "message"
    assert message["model"] == "claude-local"
    assert message["content"] == [{"type": "text", "text": "hello"}]
    assert message["usage"]["input_tokens"] == 5


async def test_the_token_count_comes_back_as_input_tokens() -> None:
    translated = count_tokens_as_tokenize(Read(), ROUTE, HEADERS)
    answer = await translated.answer(BufferedResponse(200, b'{"count": 12, "tokens": []}'), 5.0)
    assert json.loads(answer.first_chunk) == {"input_tokens": 12}
