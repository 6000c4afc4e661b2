"""Ollama's requests as OpenAI's (pure: no I/O); the answers back are
`app.ollama.answers`'. Only `app.routing.translation` uses these: the API hands the
request over, and the upstream call is shaped there.

`POST /api/chat` and `POST /api/generate` become a chat completion
(`/v1/chat/completions`): a generate's `system` and `prompt` are its messages. `POST
/api/embed` becomes `/v1/embeddings`. Field names are Ollama's (api/types.go at
ollama/ollama fb3076099: `Message` :197, `ToolCall` :221, `Options` :567,
`EmbedRequest` :600).

`options` map to vLLM's sampling parameters (`_OPTIONS`; `num_predict` -> `max_tokens`,
`repeat_penalty` -> vLLM's `repetition_penalty`); `num_ctx` is checked against the
model's context (vLLM's `max_model_len`: a server cannot change it per request); every
other option is ignored, as Ollama ignores options it does not know.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Final

from app.errors import InvalidRequest
from app.ollama.wire import Json

# Ollama option -> vLLM's OpenAI-compatible request field (vllm/entrypoints/openai/
# chat_completion/protocol.py `ChatCompletionRequest`: `repetition_penalty`, `top_k` and
# `min_p` are vLLM's sampling extras).
_OPTIONS: Final = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repetition_penalty",
}
_IMAGE_TYPES: Final = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
)


def sampling(options: object, max_model_len: int | None) -> Json:
    """The request fields of Ollama's `options` (api.md:42-58, types.go:567)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InvalidRequest.wrong_type("options", "an object", options)
    out: Json = {name: options[key] for key, name in _OPTIONS.items() if key in options}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    predict = options.get("num_predict")
    if isinstance(predict, int) and not isinstance(predict, bool) and predict > 0:
        out["max_tokens"] = predict  # -1 (no limit) and -2 (fill the context): none
    num_ctx = options.get("num_ctx")
    if isinstance(num_ctx, int) and max_model_len is not None and num_ctx > max_model_len:
        raise InvalidRequest(
            f"options.num_ctx {num_ctx} is larger than this model's context of "
            f"{max_model_len} tokens (its server's max_model_len, fixed when it starts); "
            f"ask for {max_model_len} or fewer.",
            param="options.num_ctx",
        )
    return out


def response_format(value: object) -> Json:
    """Ollama's `format` (`"json"` or a JSON schema, api.md:61-70) as OpenAI's."""
    if value is None or value == "":
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        schema = {"name": "format", "schema": value}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise InvalidRequest('format must be "json" or a JSON schema object.', param="format")


@dataclass(frozen=True, slots=True)
class ChatRequest:
    body: Json  # the OpenAI chat completion request
    images: int  # how many images it carries (an error then says so)


def chat_request(
    payload: Json, *, model: str, stream: bool, max_model_len: int | None
) -> ChatRequest:
    """`POST /api/chat`'s body as a chat completion for `model` (the served id)."""
    messages = payload.get("messages", [])
    if not isinstance(messages, list):
        raise InvalidRequest.wrong_type("messages", "an array", messages)
    converted: list[Json] = []
    images = 0
    calls = _CallIds()
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest.wrong_type(f"messages[{index}]", "an object", message)
        openai, count = _message(message, index, calls)
        converted.append(openai)
        images += count
    body = _common(payload, model, stream, max_model_len)
    body["messages"] = converted
    tools = payload.get("tools")
    if tools:
        body["tools"] = tools  # Ollama's tools are OpenAI's function tools
    return ChatRequest(body, images)


def generate_request(
    payload: Json, *, model: str, stream: bool, max_model_len: int | None
) -> ChatRequest:
    """`POST /api/generate`'s body as a chat completion: `system`, then `prompt` (with
    its `images`) as the user's message."""
    prompt = payload.get("prompt", "")
    if not isinstance(prompt, str):
        raise InvalidRequest.wrong_type("prompt", "a string", prompt)
    messages: list[Json] = []
    system = payload.get("system")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    user, images = _message(
        {"role": "user", "content": prompt, "images": payload.get("images")}, 0, _CallIds()
    )
    messages.append(user)
    body = _common(payload, model, stream, max_model_len)
    body["messages"] = messages
    return ChatRequest(body, images)


def embed_request(payload: Json, *, model: str) -> Json:
    """`POST /api/embed` (types.go:600) as `/v1/embeddings`; `truncate` (default true)
    as vLLM's `truncate_prompt_tokens: -1` (to the model's length)."""
    text = payload.get("input")
    if not isinstance(text, str | list):
        raise InvalidRequest.wrong_type("input", "a string or an array of strings", text)
    body: Json = {"model": model, "input": text, "encoding_format": "float"}
    dimensions = payload.get("dimensions")
    if isinstance(dimensions, int) and dimensions > 0:
        body["dimensions"] = dimensions
    if payload.get("truncate", True) is not False:
        body["truncate_prompt_tokens"] = -1
    return body


def _common(payload: Json, model: str, stream: bool, max_model_len: int | None) -> Json:
    body: Json = {"model": model, "stream": stream}
    if stream:  # the last line's counts: vLLM sends usage only when asked
        body["stream_options"] = {"include_usage": True}
    body.update(sampling(payload.get("options"), max_model_len))
    body.update(response_format(payload.get("format")))
    think = payload.get("think")
    if isinstance(think, bool):  # Qwen3's and most reasoning templates' switch
        body["chat_template_kwargs"] = {"enable_thinking": think}
    return body


class _CallIds:
    """Ids for the tool calls of a conversation (Ollama's may have none; OpenAI's
    `tool` messages answer one by id): a call's own id, else `call_N`; a `tool` message
    answers the oldest call not yet answered."""

    def __init__(self) -> None:
        self._count = 0
        self._open: list[str] = []

    def new(self, given: object) -> str:
        self._count += 1
        ident = given if isinstance(given, str) and given else f"call_{self._count}"
        self._open.append(ident)
        return ident

    def answer(self, given: object) -> str:
        if isinstance(given, str) and given:
            if given in self._open:
                self._open.remove(given)
            return given
        return self._open.pop(0) if self._open else f"call_{self._count}"


def _message(message: Json, index: int, calls: _CallIds) -> tuple[Json, int]:
    role = str(message.get("role", "user")).lower()  # types.go:217 lowercases it
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise InvalidRequest.wrong_type(f"messages[{index}].content", "a string", content)
    out: Json = {"role": role, "content": content}
    images = message.get("images") or []
    if not isinstance(images, list):
        raise InvalidRequest.wrong_type(f"messages[{index}].images", "an array", images)
    if images:
        parts: list[Json] = [{"type": "text", "text": content}] if content else []
        parts.extend({"type": "image_url", "image_url": {"url": _data_url(image, index)}}
                     for image in images)  # fmt: skip
        out["content"] = parts
    tool_calls = message.get("tool_calls")
    if role == "assistant" and isinstance(tool_calls, list) and tool_calls:
        out["tool_calls"] = [_openai_call(call, calls) for call in tool_calls]
    if role == "tool":
        out["tool_call_id"] = calls.answer(message.get("tool_call_id"))
        if isinstance(message.get("tool_name"), str):
            out["name"] = message["tool_name"]
    return out, len(images)


def _openai_call(call: object, calls: _CallIds) -> Json:
    fields = call if isinstance(call, dict) else {}
    function = fields.get("function") if isinstance(fields.get("function"), dict) else {}
    assert isinstance(function, dict)
    arguments = function.get("arguments", {})
    return {
        "id": calls.new(fields.get("id")),
        "type": "function",
        "function": {
            "name": function.get("name", ""),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


def _data_url(image: object, index: int) -> str:
    """An Ollama image (base64 of the file, api.md:46) as a data URL vLLM decodes."""
    if not isinstance(image, str):
        raise InvalidRequest.wrong_type(f"messages[{index}].images", "base64 strings", image)
    if image.startswith("data:"):
        return image
    try:
        head = base64.b64decode(image[:16] + "=" * (-len(image[:16]) % 4))
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"messages[{index}].images: not base64-encoded.") from None
    kind = next((mime for magic, mime in _IMAGE_TYPES if head.startswith(magic)), "image/png")
    return f"data:{kind};base64,{image}"
