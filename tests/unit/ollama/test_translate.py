"""Ollama's requests as OpenAI chat and embeddings, and the answers back (pure)."""

from __future__ import annotations

import base64
import json

import pytest

from app.errors import InvalidRequest
from app.ollama.answers import Timing, chat_answer, embed_answer
from app.ollama.requests import chat_request, embed_request, generate_request, sampling

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


def test_options_map_to_vllms_fields_and_unknown_ones_are_ignored() -> None:
    options = {"num_predict": 5, "temperature": 0.1, "top_p": 0.9, "top_k": 20, "seed": 7,
               "stop": "###", "repeat_penalty": 1.1, "num_gpu": 99, "mirostat": 2}  # fmt: skip
    assert sampling(options, None) == {
        "max_tokens": 5,
        "temperature": 0.1,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 7,
        "stop": ["###"],
        "repetition_penalty": 1.1,
    }
    assert sampling({"num_predict": -1}, None) == {}  # no limit: none sent


def test_num_ctx_is_checked_against_the_context() -> None:
    assert sampling({"num_ctx": 4096}, 8192) == {}
    with pytest.raises(InvalidRequest) as refused:
        sampling({"num_ctx": 16384}, 8192)
    assert "16384" in refused.value.message
    assert "8192" in refused.value.message
    assert sampling({"num_ctx": 16384}, None) == {}  # not known yet: not refused


def test_chat_with_images_tools_and_a_format() -> None:
    payload = {
        "messages": [
            {"role": "USER", "content": "What is this?", "images": [PNG]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "look", "arguments": {"at": "it"}}}]},
            {"role": "tool", "content": "a cat", "tool_name": "look"},
        ],
        "tools": [{"type": "function", "function": {"name": "look"}}],
        "format": {"type": "object"},
        "think": False,
    }  # fmt: skip
    request = chat_request(payload, model="served", stream=True, max_model_len=None)
    body = request.body
    assert request.images == 1
    user, assistant, tool = body["messages"]
    assert user["role"] == "user"  # lowercased, as Ollama does
    assert user["content"][1] == {"type": "image_url",
                                  "image_url": {"url": f"data:image/png;base64,{PNG}"}}  # fmt: skip
    call = assistant["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"at": "it"}
    assert tool["tool_call_id"] == call["id"]  # answers the call it follows
    assert body["tools"] == payload["tools"]
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["stream_options"] == {"include_usage": True}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_generate_is_system_then_prompt() -> None:
    body = generate_request({"prompt": "Hi", "system": "Be brief.", "format": "json"},
                            model="served", stream=False, max_model_len=None).body  # fmt: skip
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}]  # fmt: skip
    assert body["response_format"] == {"type": "json_object"}
    assert "stream_options" not in body


def test_a_whole_answer_in_ollamas_fields() -> None:
    completion = {
        "choices": [{"message": {"content": "Hello", "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2},
    }  # fmt: skip
    timing = Timing(total=1.5, load=1.0, prompt=0.0)
    answer = chat_answer(completion, model="m:latest", generate=False, timing=timing)
    assert answer["message"]["content"] == "Hello"
    assert answer["message"]["tool_calls"] == [
        {"id": "c1", "function": {"index": 0, "name": "f", "arguments": {"x": 1}}}
    ]
    assert answer["done_reason"] == "stop"  # Ollama says stop after tool calls
    assert answer["prompt_eval_count"] == 9
    assert answer["eval_count"] == 2
    assert answer["total_duration"] == 1_500_000_000
    assert answer["load_duration"] == 1_000_000_000
    assert answer["eval_duration"] == 500_000_000
    # A generate's whole answer carries them too (`GenerateResponse.ToolCalls`,
    # api/types.go), as its stream's lines do.
    generated = chat_answer(completion, model="m:latest", generate=True, timing=timing)
    assert generated["response"] == "Hello"
    assert generated["tool_calls"] == answer["message"]["tool_calls"]


def test_embeddings_both_ways() -> None:
    assert embed_request({"input": "a", "truncate": False, "dimensions": 4}, model="e") == {
        "model": "e", "input": "a", "encoding_format": "float", "dimensions": 4}  # fmt: skip
    assert embed_request({"input": ["a"]}, model="e")["truncate_prompt_tokens"] == -1
    answer = {"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}],
              "usage": {"prompt_tokens": 3}}  # fmt: skip
    out = embed_answer(answer, model="e", timing=Timing(total=0.1, load=0.0, prompt=0.0))
    assert out["embeddings"] == [[1.0], [2.0]]
    assert out["prompt_eval_count"] == 3
