"""A Messages or Ollama request in another API (`app.routing.translation`): the upstream
call shaped from a route and the request as read. Pure, but for the way back (an answer)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.errors import InvalidRequest
from app.jsonwire import json_bytes
from app.routing.registry import Route
from app.routing.translation import (
    count_tokens_as_tokenize,
    messages_as_chat,
    ollama_chat_as_chat,
    ollama_embed_as_embeddings,
)
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


# -- Ollama ------------------------------------------------------------------------------

OLLAMA_ROUTE = Route(name="qwen", backend="b", upstream_model="Qwen/Qwen3-0.6B")
OLLAMA_HEADERS = {"x-trace": "t2"}
PNG = "iVBORw0KGgoAAAANSUhEUgAA"  # base64 of a PNG's first bytes


def clock() -> tuple[float, float]:
    """(seconds since the request began, seconds waited for the backend)."""
    return 2.0, 0.5


def ollama_chat(stream: bool, **extra: Any) -> Read:
    """`/api/chat` as the API read it: named as the client asked (with its tag)."""
    payload = {"model": "qwen:latest", "messages": [{"role": "user", "content": "hi"}], **extra}
    return Read(stream=stream, model="qwen:latest", payload=payload)


@pytest.mark.parametrize("stream", [False, True])
def test_an_ollama_chat_becomes_a_chat_completion_for_the_upstream_model(stream: bool) -> None:
    request = ollama_chat(stream, options={"num_predict": 8, "repeat_penalty": 1.1})
    translated = ollama_chat_as_chat(request, OLLAMA_ROUTE, OLLAMA_HEADERS, generate=False,
                                     max_model_len=4096, clock=clock)  # fmt: skip
    call = translated.call
    assert (call.path, call.api, call.stream, call.route) == (
        "/v1/chat/completions",
        Api.CHAT,
        stream,
        OLLAMA_ROUTE,
    )
    assert call.body == json_bytes(call.payload)  # the bytes are the payload, written once
    sent = json.loads(call.body)
    assert sent["model"] == "Qwen/Qwen3-0.6B"
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    assert (sent["max_tokens"], sent["repetition_penalty"]) == (8, 1.1)
    assert sent["stream"] is stream
    assert ("stream_options" in sent) is stream  # a stream's last line has the counts
    assert call.headers == {"x-trace": "t2", "content-type": "application/json"}
    assert OLLAMA_HEADERS == {"x-trace": "t2"}  # not changed


def test_an_ollama_generate_becomes_a_chat_of_its_system_and_prompt() -> None:
    payload = {"model": "qwen", "system": "Be brief.", "prompt": "hi", "images": [PNG]}
    request = Read(stream=False, model="qwen", payload=payload)
    call = ollama_chat_as_chat(request, OLLAMA_ROUTE, OLLAMA_HEADERS, generate=True,
                               max_model_len=None, clock=clock).call  # fmt: skip
    assert (call.path, call.api) == ("/v1/chat/completions", Api.CHAT)
    system, user = json.loads(call.body)["messages"]
    assert system == {"role": "system", "content": "Be brief."}
    assert user["content"][0] == {"type": "text", "text": "hi"}
    assert user["content"][1]["image_url"]["url"] == f"data:image/png;base64,{PNG}"


def test_an_ollama_embed_becomes_v1_embeddings_never_a_stream() -> None:
    payload = {"model": "qwen", "input": ["a", "b"], "truncate": False, "dimensions": 64}
    request = Read(stream=True, model="qwen", payload=payload)
    call = ollama_embed_as_embeddings(request, OLLAMA_ROUTE, OLLAMA_HEADERS, clock=clock).call
    assert (call.path, call.api, call.stream) == ("/v1/embeddings", Api.EMBEDDINGS, False)
    assert call.body == json_bytes(call.payload)
    assert call.payload == {
        "model": "Qwen/Qwen3-0.6B",
        "input": ["a", "b"],
        "encoding_format": "float",
        "dimensions": 64,
    }
    assert call.headers == {"x-trace": "t2", "content-type": "application/json"}


def test_an_ollama_request_the_translation_cannot_carry_is_invalid() -> None:
    too_long = ollama_chat(False, options={"num_ctx": 8192})
    with pytest.raises(InvalidRequest, match="num_ctx"):
        ollama_chat_as_chat(too_long, OLLAMA_ROUTE, OLLAMA_HEADERS, generate=False,
                            max_model_len=4096, clock=clock)  # fmt: skip
    no_input = Read(model="qwen", payload={"model": "qwen", "input": 3})
    with pytest.raises(InvalidRequest, match="input"):
        ollama_embed_as_embeddings(no_input, OLLAMA_ROUTE, OLLAMA_HEADERS, clock=clock)


async def test_an_ollama_chat_answer_comes_back_whole_named_as_the_client_asked() -> None:
    translated = ollama_chat_as_chat(ollama_chat(False), OLLAMA_ROUTE, OLLAMA_HEADERS,
                                     generate=False, max_model_len=None, clock=clock)  # fmt: skip
    chat = {
        "model": "Qwen/Qwen3-0.6B",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }  # fmt: skip
    answer = json.loads(
        (await translated.answer(BufferedResponse(200, json_bytes(chat)), 5.0)).first_chunk
    )
    assert answer["model"] == "qwen:latest"
    assert answer["message"] == {"role": "assistant", "content": "hello"}
    assert (answer["done"], answer["done_reason"]) == (True, "stop")
    assert (answer["prompt_eval_count"], answer["eval_count"]) == (5, 1)
    assert (answer["total_duration"], answer["load_duration"]) == (2_000_000_000, 500_000_000)


async def test_an_ollama_chat_stream_comes_back_as_ndjson_lines() -> None:
    translated = ollama_chat_as_chat(ollama_chat(True), OLLAMA_ROUTE, OLLAMA_HEADERS,
                                     generate=False, max_model_len=None, clock=clock)  # fmt: skip
    chunk = {"choices": [{"index": 0, "delta": {"content": "hel"}, "finish_reason": "stop"}]}
    events = b"data: " + json_bytes(chunk) + b"\n\ndata: [DONE]\n\n"
    answer = await translated.answer(BufferedResponse(200, events, "text/event-stream"), 5.0)
    assert answer.headers == [(b"content-type", b"application/x-ndjson")]
    piece, last = (json.loads(line) for line in answer.first_chunk.splitlines())
    assert (piece["model"], piece["message"]["content"]) == ("qwen:latest", "hel")
    assert piece["done"] is False
    assert (last["done"], last["done_reason"]) == (True, "stop")


async def test_an_upstream_error_says_the_model_did_not_take_the_images() -> None:
    request = Read(model="qwen", payload={"model": "qwen", "prompt": "hi", "images": [PNG]})
    translated = ollama_chat_as_chat(request, OLLAMA_ROUTE, OLLAMA_HEADERS, generate=True,
                                     max_model_len=None, clock=clock)  # fmt: skip
    refused = BufferedResponse(400, b'{"error": {"message": "not a multimodal model"}}')
    answer = await translated.answer(refused, 5.0)
    assert answer.status == 400
    assert json.loads(answer.first_chunk) == {
        "error": "model 'qwen' did not take the 1 image(s) of this request (a model without "
        "vision cannot): not a multimodal model"
    }


async def test_an_ollama_embed_answer_comes_back_as_embeddings() -> None:
    request = Read(model="qwen:latest", payload={"model": "qwen:latest", "input": "a"})
    translated = ollama_embed_as_embeddings(request, OLLAMA_ROUTE, OLLAMA_HEADERS, clock=clock)
    body = {"data": [{"index": 1, "embedding": [0.5]}, {"index": 0, "embedding": [0.25]}],
            "usage": {"prompt_tokens": 3}}  # fmt: skip
    answer = json.loads(
        (await translated.answer(BufferedResponse(200, json_bytes(body)), 5.0)).first_chunk
    )
    assert answer == {
        "model": "qwen:latest",
        "embeddings": [[0.25], [0.5]],
        "total_duration": 2_000_000_000,
        "load_duration": 500_000_000,
        "prompt_eval_count": 3,
    }
