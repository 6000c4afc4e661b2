"""Anthropic's Messages API served by an OpenAI chat-completions backend. Pure: no I/O.

The reverse of `request` / `response`: a Messages request (POST /v1/messages, from Claude
Code or the Anthropic SDK) becomes a chat-completions body for a vLLM backend, and its
answer becomes a Messages response. Decisions, against Anthropic's Messages API reference
(docs.anthropic.com/en/api/messages) and OpenAI's chat completions reference:

- `model` (a non-empty string), `messages` (a non-empty array) and `max_tokens` (an
  integer >= 1) are required, as Anthropic requires them; the body is sent for the
  caller's `model`. count_tokens does not need `max_tokens`.
- `system` (a string, or an array of text blocks joined by a blank line, a billing-header
  block left out as below) becomes one leading system message. `cache_control` is
  ignored everywhere (vLLM caches prefixes on its own); `citations` on text blocks too.
- A user turn: text blocks -> text parts; images -> `image_url` parts (a base64 source
  as a `data:<media_type>;base64,<data>` URL, a url source as that URL; a `file` source
  is refused). `tool_result` blocks -> `role: tool` messages (`tool_call_id` is the
  `tool_use_id`, the content a string or its text blocks joined by newlines) sent before
  the rest of that turn, as OpenAI requires tool messages right after the assistant's
  calls. `is_error: true` has no OpenAI field: the text is kept as it is (Claude Code
  already words it as an error). Images inside a tool result cannot go in a tool message:
  they join the user message that follows. A turn of text parts only is sent as one
  string, the texts joined by newlines (what vLLM does with text parts anyway).
- An assistant turn: text blocks joined -> `content` (None when the turn is only tool
  calls); `tool_use` -> `tool_calls` (`arguments` is the input as compact JSON);
  `thinking` and `redacted_thinking` are dropped (the chat template has no place for
  another model's signed reasoning). A last assistant turn is Anthropic's prefill: it is
  continued (`continue_final_message`, no generation prompt), as vLLM offers.
- Any other block type (documents, server tool blocks, ...) is refused with a 400 naming
  it: silently dropping part of the conversation would change the answer.
- A message of role `system` (Claude Code 2.1.197 sends its agent and skill list so;
  vLLM 0.33 takes them: `vllm/entrypoints/anthropic/protocol.py`, `AnthropicMessage`)
  becomes a system message at its place, as vLLM's `_convert_messages` does with a chat
  template that accepts one there (`vllm/entrypoints/anthropic/serving.py`): its text
  blocks joined with nothing between them, a block (or string) starting with
  `x-anthropic-billing-header` left out (Claude Code's per-request hash, which would defeat
  the prefix cache; vLLM `_extract_system_text`), and no message when no text is left. Its
  `tool_addition` / `tool_removal` blocks change the tools (`inbound_tools`); they are
  refused in any other role, as vLLM refuses them. Any other block in it is refused.
- `tools` -> function tools, with those changes applied (`inbound_tools`). `tool_choice`:
  auto -> "auto", any -> "required", tool -> the named function, none -> "none";
  `disable_parallel_tool_use` -> `parallel_tool_calls: false`. Without tools,
  `tool_choice` is not sent (OpenAI refuses it then).
- `stop_sequences` -> `stop`; `temperature`, `top_p`, `top_k` are passed on (vLLM takes
  `top_k`). A stream asks for `stream_options.include_usage`, so the usage is known for
  `message_delta`. `metadata`, `thinking`, `service_tier`, `container`, `mcp_servers` and
  unknown fields are dropped: a local backend has no use for them.
- The answer: `msg_<completion id>`, the client's model name, a text block (when there is
  text), then `tool_use` blocks (arguments that are not a JSON object become `{}`, logged).
  Reasoning (`reasoning_content`) is dropped: a thinking block needs a signature.
  `finish_reason` -> `stop_reason` by `STOP_REASONS` (response.py, next to the other
  direction); `stop` with the matched stop string in the choice's `stop_reason` (where
  vLLM puts it) -> `stop_sequence`. Usage: prompt and completion tokens.
- Errors use Anthropic's envelope, the type from the status (the errors reference),
  keeping the OpenAI / vLLM error message.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any, Final

from app.anthropic.checks import invalid, is_int, number, required_str, unsupported
from app.anthropic.inbound_tools import (
    TOOL_CHANGES,
    ToolChange,
    openai_tools,
    tool_change,
    with_tool_changes,
)
from app.anthropic.response import ERROR_TYPE_BY_STATUS, STOP_REASONS, dump_json
from app.errors import InvalidRequest

Json = dict[str, Any]

logger = logging.getLogger(__name__)

# The gateway's own 503 (no backend can take the request now) is Anthropic's "overloaded":
# the SDK retries it, as it should.
_ERROR_TYPES: Final = {**ERROR_TYPE_BY_STATUS, 500: "api_error", 503: "overloaded_error"}
# Claude Code's attribution block: a per-request hash vLLM leaves out of the prompt.
_BILLING_HEADER: Final = "x-anthropic-billing-header"


# --- requests --------------------------------------------------------------------------


def to_openai_chat(body: Json, *, model: str, stream: bool) -> Json:
    """The chat-completions body for a Messages request; raises `InvalidRequest` (400)."""
    messages, tools, choice = _conversation(body)
    request: Json = {"model": model, "messages": messages, "max_tokens": _max_tokens(body)}
    stop = _stop_sequences(body.get("stop_sequences"))
    if stop:
        request["stop"] = stop
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            request[name] = number(body[name], name)
    top_k = body.get("top_k")
    if top_k is not None:
        if not is_int(top_k):
            raise InvalidRequest.wrong_type("top_k", "an integer", top_k)
        request["top_k"] = top_k
    if tools:
        request["tools"] = tools
        request.update(choice)
    _continue_prefill(request)
    request["stream"] = stream
    if stream:
        request["stream_options"] = {"include_usage": True}
    return request


def tokenize_request(body: Json, *, model: str) -> Json:
    """vLLM's POST /tokenize (chat form) for a count_tokens request; `max_tokens` optional."""
    messages, tools, _ = _conversation(body)
    request: Json = {"model": model, "messages": messages, "add_generation_prompt": True}
    if tools:
        request["tools"] = tools
    _continue_prefill(request)
    return request


def count_tokens_answer(tokenize_answer: Json) -> Json:
    """count_tokens' answer from vLLM's /tokenize one; ValueError when it has no count."""
    count = tokenize_answer.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError("the tokenize answer carries no token count")
    return {"input_tokens": count}


def _conversation(body: Json) -> tuple[list[Json], list[Json], Json]:
    """The OpenAI messages, tools and tool-choice fields, validated."""
    model = body.get("model")
    if model is None:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest.wrong_type("model", "a non-empty string", model)
    messages = _system(body.get("system"))
    value = body.get("messages")
    if value is None:
        raise InvalidRequest("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(value, list):
        raise InvalidRequest.wrong_type("messages", "an array", value)
    if not value:
        raise invalid("messages", "Invalid 'messages': expected at least one message.")
    changes: list[ToolChange] = []
    for i, message in enumerate(value):
        messages.extend(_message(message, f"messages[{i}]", changes))
    tools = with_tool_changes(openai_tools(body.get("tools")), changes)
    return messages, tools, _tool_choice(body.get("tool_choice"))


def _max_tokens(body: Json) -> int:
    value = body.get("max_tokens")
    if value is None:
        raise InvalidRequest("Missing required parameter: 'max_tokens'.", param="max_tokens")
    if not is_int(value):
        raise InvalidRequest.wrong_type("max_tokens", "an integer", value)
    if value < 1:
        raise invalid("max_tokens", f"Invalid 'max_tokens': expected a value >= 1, got {value}.")
    return int(value)


def _stop_sequences(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest.wrong_type("stop_sequences", "an array of strings", value)
    return list(value)


def _continue_prefill(request: Json) -> None:
    """A last assistant message is a prefix to continue, not a turn to answer."""
    messages = request["messages"]
    if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        request["add_generation_prompt"] = False
        request["continue_final_message"] = True


def _system(value: object) -> list[Json]:
    if value is None:
        return []
    if isinstance(value, str):
        text = value
    elif isinstance(value, list):
        texts = [_text_of(block, f"system[{j}]") for j, block in enumerate(value)]
        text = "\n\n".join(t for t in texts if t and not t.startswith(_BILLING_HEADER))
    else:
        raise InvalidRequest.wrong_type("system", "a string or an array", value)
    return [{"role": "system", "content": text}] if text else []


def _message(message: object, param: str, changes: list[ToolChange]) -> list[Json]:
    if not isinstance(message, dict):
        raise InvalidRequest.wrong_type(param, "an object", message)
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise invalid(
            f"{param}.role",
            f"Invalid '{param}.role': expected 'user', 'assistant' or 'system', got {role!r}.",
        )
    content = message.get("content")
    if content is None:
        raise InvalidRequest(
            f"Missing required parameter: '{param}.content'.", param=f"{param}.content"
        )
    if role == "system":
        return _system_message(content, f"{param}.content", changes)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest.wrong_type(f"{param}.content", "a string or an array", content)
    if role == "user":
        return _user(content, f"{param}.content")
    return [_assistant(content, f"{param}.content")]


def _system_message(content: object, param: str, changes: list[ToolChange]) -> list[Json]:
    """A system message inside `messages`, at its place (module docstring)."""
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        texts = []
        for kind, block, block_param in _blocks(content, param):
            if kind in TOOL_CHANGES:
                changes.append(tool_change(block, block_param))
            else:
                texts.append(_text_of(block, block_param))
    else:
        raise InvalidRequest.wrong_type(param, "a string or an array", content)
    text = "".join(t for t in texts if not t.startswith(_BILLING_HEADER))
    return [{"role": "system", "content": text}] if text else []


def _user(blocks: list[object], param: str) -> list[Json]:
    tool_messages: list[Json] = []
    parts: list[Json] = []
    for kind, block, block_param in _blocks(blocks, param):
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, block_param)})
        elif kind == "image":
            parts.append(_image(block, block_param))
        elif kind == "tool_result":
            tool_message, images = _tool_result(block, block_param)
            tool_messages.append(tool_message)
            parts.extend(images)
        else:
            raise _unsupported_block(kind, block_param)
    if not parts:
        return tool_messages
    if all(part["type"] == "text" for part in parts):
        user: Json = {"role": "user", "content": "\n".join(p["text"] for p in parts)}
    else:
        user = {"role": "user", "content": parts}
    return [*tool_messages, user]


def _tool_result(block: Json, param: str) -> tuple[Json, list[Json]]:
    tool_call_id = required_str(block, "tool_use_id", param)
    content = block.get("content")
    texts: list[str] = []
    images: list[Json] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for kind, inner, inner_param in _blocks(content, f"{param}.content"):
            if kind == "text":
                texts.append(_text_of(inner, inner_param))
            elif kind == "image":
                images.append(_image(inner, inner_param))
            else:
                raise _unsupported_block(kind, inner_param)
    elif content is not None:
        raise InvalidRequest.wrong_type(f"{param}.content", "a string or an array", content)
    message = {"role": "tool", "tool_call_id": tool_call_id, "content": "\n".join(texts)}
    return message, images


def _assistant(blocks: list[object], param: str) -> Json:
    texts: list[str] = []
    calls: list[Json] = []
    for kind, block, block_param in _blocks(blocks, param):
        if kind == "text":
            texts.append(_text_of(block, block_param))
        elif kind == "tool_use":
            calls.append(_tool_call(block, block_param))
        elif kind not in ("thinking", "redacted_thinking"):
            raise _unsupported_block(kind, block_param)
    text = "".join(texts)
    message: Json = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: Json, param: str) -> Json:
    call_id = required_str(block, "id", param)
    name = required_str(block, "name", param)
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise InvalidRequest.wrong_type(f"{param}.input", "an object", arguments)
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": dump_json(arguments)},
    }


def _image(block: Json, param: str) -> Json:
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidRequest.wrong_type(f"{param}.source", "an object", source)
    kind = source.get("type")
    if kind == "base64":
        media_type = required_str(source, "media_type", f"{param}.source")
        data = required_str(source, "data", f"{param}.source")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url":
        url = required_str(source, "url", f"{param}.source")
    else:
        raise unsupported(
            f"{param}.source.type",
            f"Image sources of type {kind!r} are not supported here; use 'base64' or 'url'.",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _blocks(blocks: list[object], param: str) -> Iterator[tuple[str, Json, str]]:
    """Each content block of an array with its type and its parameter name (`param[j]`);
    raises `InvalidRequest` at the first that is not an object with a string type."""
    for j, block in enumerate(blocks):
        block_param = f"{param}[{j}]"
        kind = _block_type(block, block_param)
        assert isinstance(block, dict)
        yield kind, block, block_param


def _block_type(block: object, param: str) -> str:
    if not isinstance(block, dict):
        raise InvalidRequest.wrong_type(param, "a content block object", block)
    kind = block.get("type")
    if not isinstance(kind, str):
        raise InvalidRequest.wrong_type(f"{param}.type", "a string", kind)
    return kind


def _text_of(block: object, param: str) -> str:
    kind = _block_type(block, param)
    if kind != "text":
        raise _unsupported_block(kind, param)
    assert isinstance(block, dict)
    return required_str(block, "text", param, allow_empty=True)


def _unsupported_block(kind: str, param: str) -> InvalidRequest:
    if kind in TOOL_CHANGES:  # vLLM's words (AnthropicMessage)
        return invalid(
            f"{param}.type", f'{kind} blocks are only allowed in messages with role "system"'
        )
    return unsupported(f"{param}.type", f"Content blocks of type {kind!r} are not supported here.")


def _tool_choice(value: object) -> Json:
    """The `tool_choice` / `parallel_tool_calls` fields (sent only with tools)."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(value, dict) or kind not in ("auto", "any", "tool", "none"):
        raise invalid(
            "tool_choice",
            "Invalid 'tool_choice': expected an object of type 'auto', 'any', 'tool' or 'none'.",
        )
    out: Json
    if kind == "tool":
        name = required_str(value, "name", "tool_choice")
        out = {"tool_choice": {"type": "function", "function": {"name": name}}}
    else:
        out = {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}[kind]}
    disable = value.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise InvalidRequest.wrong_type(
            "tool_choice.disable_parallel_tool_use", "a boolean", disable
        )
    if disable:
        out["parallel_tool_calls"] = False
    return out


# --- answers ---------------------------------------------------------------------------


def to_anthropic_message(completion: Json, *, model: str) -> Json:
    """A Messages response for a `chat.completion`, named after the client's `model`."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    choice = choice if isinstance(choice, dict) else {}
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    content: list[Json] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            content.append(tool_use_block(call))
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"))
    usage = completion.get("usage")
    return {
        "id": message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": anthropic_usage(usage if isinstance(usage, dict) else {}),
    }


def tool_use_block(call: Json) -> Json:
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    return {
        "type": "tool_use",
        "id": str(call.get("id") or tool_use_id()),
        "name": str(function.get("name") or ""),
        "input": tool_input(function.get("arguments")),
    }


def tool_input(arguments: object) -> Json:
    """A tool call's arguments as the input object; anything else is `{}` (logged)."""
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    logger.warning("openai_tool_arguments_not_an_object length=%d", len(str(arguments)))
    return {}


def stop_reason(finish_reason: object, matched: object) -> tuple[str, str | None]:
    """Anthropic's (`stop_reason`, `stop_sequence`) for OpenAI's `finish_reason`.

    `matched` is the choice's `stop_reason`: vLLM's matched stop string (or stop token id).
    An unknown or missing reason is `end_turn` (logged when unknown)."""
    if finish_reason == "stop" and isinstance(matched, str) and matched:
        return "stop_sequence", matched
    reason = STOP_REASONS.get(str(finish_reason))
    if reason is None:
        if finish_reason is not None:
            logger.warning("openai_unknown_finish_reason finish_reason=%s", finish_reason)
        reason = "end_turn"
    return reason, None


def anthropic_usage(usage: Json) -> Json:
    return {
        "input_tokens": _count(usage.get("prompt_tokens")),
        "output_tokens": _count(usage.get("completion_tokens")),
    }


def message_id(completion_id: object) -> str:
    """`msg_<completion id>`, or a random one when the completion has none."""
    if isinstance(completion_id, str) and completion_id:
        return f"msg_{completion_id}"
    return f"msg_{uuid.uuid4().hex}"


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex}"


# --- errors ----------------------------------------------------------------------------


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status: other 4xx are invalid_request_error."""
    fallback = "invalid_request_error" if 400 <= status < 500 else "api_error"
    return _ERROR_TYPES.get(status, fallback)


def anthropic_error(status: int, message: str) -> Json:
    """Anthropic's error envelope."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def anthropic_error_from_openai(status: int, body: bytes) -> Json:
    """Anthropic's envelope for a non-2xx OpenAI-compatible answer, keeping its message.

    Read: OpenAI's `{"error": {"message": ...}}` and vLLM's `{"object": "error", "message":
    ...}`; any other body is not echoed, the status speaks for it."""
    return anthropic_error(status, openai_error_message(body) or _status_text(status))


def openai_error_message(body: bytes | Json) -> str | None:
    """The message of an OpenAI or vLLM error body (bytes or parsed), if it has one."""
    parsed: object = body
    if isinstance(body, bytes):
        try:
            parsed = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
    if not isinstance(parsed, dict):
        return None
    inner = parsed.get("error")
    source = inner if isinstance(inner, dict) else parsed
    if source is parsed and parsed.get("object") != "error":
        return None
    message = source.get("message")
    return message if isinstance(message, str) and message else None


def _status_text(status: int) -> str:
    return f"The upstream answered HTTP {status}."


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
