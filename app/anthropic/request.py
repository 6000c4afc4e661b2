"""An OpenAI chat-completions request body as an Anthropic Messages request body. Pure: no I/O.

Where the two APIs differ (docs.anthropic.com/en/api/messages), this module decides:

- `system` and `developer` messages, wherever they stand, become the top-level `system`
  string: their texts in order, joined by a blank line. Message `name`s are dropped.
- Anthropic wants user/assistant turns to alternate. A `tool` message becomes a user turn
  holding one `tool_result` block; consecutive turns of one role are then merged, and in a
  merged user turn the `tool_result` blocks go first (Anthropic rejects text before them).
  A turn that is a single text block is sent as a plain string. Empty text is dropped,
  and a message left with nothing to send is left out.
- Tool call ids are sent with every character outside `[A-Za-z0-9_-]` replaced by `_`
  (Anthropic's id pattern), the same way in `tool_use` and `tool_result`, so a history
  begun on another provider (ids like `functions.get_weather:0`) still pairs up.
- `max_tokens` is required by Anthropic: `max_completion_tokens`, else `max_tokens`, else
  the provider's configured default (a cut answer then ends with `finish_reason: length`).
- `temperature` must be in OpenAI's range [0, 2] and is clamped to Anthropic's [0, 1], as
  Anthropic's own OpenAI-compatible endpoint does. `top_p` is passed on if in (0, 1].
- `tool_choice`: `auto` -> `auto`, `required` -> `any`, a named function -> `tool`, `none`
  -> `none` (the tools stay declared, as in OpenAI). `parallel_tool_calls: false` ->
  `disable_parallel_tool_use: true`. Without `tools`, `tool_choice` is not sent.
- A parameter whose loss would change the shape of the answer is refused with a 400
  naming it: `n` > 1, `logprobs`, `top_logprobs`, a `response_format` other than text,
  the legacy `functions` / `function_call`. Sampling hints Anthropic lacks (`seed`,
  `presence_penalty`, `frequency_penalty`, `logit_bias`), `user`, `stream_options`
  (the stream translator's concern), `model` (the caller names it) and unknown fields
  are dropped, as Anthropic's OpenAI-compatible endpoint does.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from app.anthropic.checks import invalid as _invalid
from app.anthropic.checks import is_int as _is_int
from app.anthropic.checks import number as _number
from app.anthropic.checks import required_str as _required_str
from app.anthropic.checks import unsupported as _unsupported
from app.errors import InvalidRequest, json_type_name

Json = dict[str, Any]

_UNSAFE_ID_CHARS: Final = re.compile(r"[^A-Za-z0-9_-]")
_EMPTY_SCHEMA: Final[Json] = {"type": "object", "properties": {}}


def to_anthropic_request(
    openai_body: Json, *, model: str, default_max_tokens: int, stream: bool
) -> Json:
    """The Messages API body for `openai_body`; raises `InvalidRequest` (400) naming the param."""
    _refuse_unsupported(openai_body)
    system, messages = _messages(openai_body.get("messages"))
    request: Json = {"model": model, "max_tokens": _max_tokens(openai_body, default_max_tokens)}
    if system:
        request["system"] = system
    request["messages"] = messages
    stop = _stop_sequences(openai_body.get("stop"))
    if stop:
        request["stop_sequences"] = stop
    temperature = _temperature(openai_body.get("temperature"))
    if temperature is not None:
        request["temperature"] = temperature
    top_p = _top_p(openai_body.get("top_p"))
    if top_p is not None:
        request["top_p"] = top_p
    tools = _tools(openai_body.get("tools"))
    choice = _tool_choice(openai_body.get("tool_choice"), openai_body.get("parallel_tool_calls"))
    if tools:
        request["tools"] = tools
        if choice is not None:
            request["tool_choice"] = choice
    request["stream"] = stream
    return request


# --- parameters ------------------------------------------------------------------------


def _refuse_unsupported(body: Json) -> None:
    n = body.get("n")
    if n is not None and not _is_int(n):
        raise InvalidRequest.wrong_type("n", "an integer", n)
    if n is not None and n != 1:
        raise _unsupported("n", f"'n' = {n} is not supported: Anthropic returns one choice.")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise InvalidRequest.wrong_type("logprobs", "a boolean", logprobs)
    if logprobs:
        raise _unsupported("logprobs", "'logprobs' is not supported: Anthropic returns none.")
    if body.get("top_logprobs") not in (None, 0):
        raise _unsupported(
            "top_logprobs", "'top_logprobs' is not supported: Anthropic returns none."
        )
    response_format = body.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict):
            raise InvalidRequest.wrong_type("response_format", "an object", response_format)
        kind = response_format.get("type")
        if kind != "text":
            raise _unsupported(
                "response_format",
                f"'response_format' of type {kind!r} is not supported by Anthropic; "
                "only 'text' is.",
            )
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise _unsupported(legacy, f"'{legacy}' is deprecated; use 'tools' and 'tool_choice'.")


def _max_tokens(body: Json, default: int) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value):
            raise InvalidRequest.wrong_type(name, "an integer", value)
        if value < 1:
            raise _invalid(name, f"Invalid '{name}': expected a value >= 1, but got {value}.")
        return int(value)
    return default


def _stop_sequences(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest.wrong_type("stop", "a string or an array of strings", value)
    return list(value)


def _temperature(value: object) -> float | None:
    """OpenAI's [0, 2] clamped into Anthropic's [0, 1]."""
    if value is None:
        return None
    number = _number(value, "temperature")
    if not 0 <= number <= 2:
        raise _invalid("temperature", f"Invalid 'temperature': expected 0 to 2, got {value}.")
    return min(number, 1.0)


def _top_p(value: object) -> float | None:
    if value is None:
        return None
    number = _number(value, "top_p")
    if not 0 < number <= 1:
        raise _invalid(
            "top_p",
            f"Invalid 'top_p': Anthropic needs 0 < top_p <= 1, got {value} "
            "(for greedy sampling use temperature 0).",
        )
    return number


def _tools(value: object) -> list[Json]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest.wrong_type("tools", "an array", value)
    tools: list[Json] = []
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise InvalidRequest.wrong_type(param, "an object", tool)
        if tool.get("type") != "function":
            raise _unsupported(
                f"{param}.type", "Only tools of type 'function' can be sent to Anthropic."
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidRequest.wrong_type(f"{param}.function", "an object", function)
        name = _required_str(function, "name", f"{param}.function")
        converted: Json = {"name": name}
        description = function.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise InvalidRequest.wrong_type(
                    f"{param}.function.description", "a string", description
                )
            converted["description"] = description
        schema = function.get("parameters")
        if schema is not None and not isinstance(schema, dict):
            raise InvalidRequest.wrong_type(f"{param}.function.parameters", "an object", schema)
        converted["input_schema"] = schema if schema is not None else dict(_EMPTY_SCHEMA)
        tools.append(converted)
    return tools


def _tool_choice(value: object, parallel: object) -> Json | None:
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest.wrong_type("parallel_tool_calls", "a boolean", parallel)
    choice: Json
    if value is None or value == "auto":
        choice = {"type": "auto"}
    elif value == "required":
        choice = {"type": "any"}
    elif value == "none":
        return {"type": "none"}
    elif (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("function"), dict)
        and isinstance(value["function"].get("name"), str)
        and value["function"]["name"]
    ):
        choice = {"type": "tool", "name": value["function"]["name"]}
    else:
        raise _invalid(
            "tool_choice",
            "Invalid 'tool_choice': expected 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}.',
        )
    if parallel is False:
        choice["disable_parallel_tool_use"] = True
    elif value is None:
        return None  # Anthropic's default is auto as well
    return choice


# --- messages --------------------------------------------------------------------------


def _messages(value: object) -> tuple[str, list[Json]]:
    """The `system` string and the alternating `messages` list."""
    if not isinstance(value, list):
        raise InvalidRequest.wrong_type("messages", "an array", value)
    system: list[str] = []
    turns: list[tuple[str, list[Json]]] = []
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest.wrong_type(param, "an object", message)
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend(_system_texts(message.get("content"), f"{param}.content"))
            continue
        if role == "user":
            turn_role, blocks = "user", _user_blocks(message.get("content"), f"{param}.content")
        elif role == "assistant":
            turn_role, blocks = "assistant", _assistant_blocks(message, param)
        elif role == "tool":
            turn_role, blocks = "user", [_tool_result(message, param)]
        else:
            raise _invalid(
                f"{param}.role",
                f"Invalid '{param}.role': expected 'system', 'developer', 'user', 'assistant' "
                f"or 'tool', got {role!r}.",
            )
        if not blocks:
            continue
        if turns and turns[-1][0] == turn_role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((turn_role, blocks))
    return "\n\n".join(system), [_turn(role, blocks) for role, blocks in turns]


def _turn(role: str, blocks: list[Json]) -> Json:
    if role == "user":  # tool results first, the rest in order
        blocks = [b for b in blocks if b["type"] == "tool_result"] + [
            b for b in blocks if b["type"] != "tool_result"
        ]
    if len(blocks) == 1 and blocks[0]["type"] == "text":
        return {"role": role, "content": blocks[0]["text"]}
    return {"role": role, "content": blocks}


def _system_texts(content: object, param: str) -> list[str]:
    return [block["text"] for block in _text_blocks(content, param)]


def _text_blocks(content: object, param: str, *, refusal: bool = False) -> list[Json]:
    """Text blocks of a string or an array of `text` (and, for assistants, `refusal`) parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [_text(content)] if content else []
    if not isinstance(content, list):
        raise InvalidRequest.wrong_type(param, "a string or an array", content)
    blocks: list[Json] = []
    for j, part in enumerate(content):
        blocks.extend(_text_part(part, f"{param}[{j}]", refusal=refusal))
    return blocks


def _text_part(part: object, param: str, *, refusal: bool = False) -> list[Json]:
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(part, dict) or not (kind == "text" or (refusal and kind == "refusal")):
        raise _unsupported_part(part, param)
    text = _required_str(part, str(kind), param, allow_empty=True)
    return [_text(text)] if text else []


def _user_blocks(content: object, param: str) -> list[Json]:
    if not isinstance(content, list):
        return _text_blocks(content, param)
    blocks: list[Json] = []
    for j, part in enumerate(content):
        part_param = f"{param}[{j}]"
        if isinstance(part, dict) and part.get("type") == "image_url":
            blocks.append(_image(part.get("image_url"), f"{part_param}.image_url"))
        else:
            blocks.extend(_text_part(part, part_param))
    return blocks


def _image(image: object, param: str) -> Json:
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise InvalidRequest.wrong_type(f"{param}.url", "a string", url)
    lowered = url[:8].lower()
    if lowered.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    if lowered.startswith("data:"):
        header, comma, data = url[5:].partition(",")
        media_type, *options = header.split(";")
        if comma and media_type and "base64" in options and data:
            source = {"type": "base64", "media_type": media_type, "data": data}
            return {"type": "image", "source": source}
    raise _invalid(
        f"{param}.url",
        f"Invalid '{param}.url': expected an http(s) URL or a base64 data URL "
        "(data:<media type>;base64,<data>).",
    )


def _assistant_blocks(message: Json, param: str) -> list[Json]:
    blocks = _text_blocks(message.get("content"), f"{param}.content", refusal=True)
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return blocks
    if not isinstance(tool_calls, list):
        raise InvalidRequest.wrong_type(f"{param}.tool_calls", "an array", tool_calls)
    for k, call in enumerate(tool_calls):
        blocks.append(_tool_use(call, f"{param}.tool_calls[{k}]"))
    return blocks


def _tool_use(call: object, param: str) -> Json:
    if not isinstance(call, dict):
        raise InvalidRequest.wrong_type(param, "an object", call)
    if call.get("type", "function") != "function":
        raise _unsupported(
            f"{param}.type", "Only tool calls of type 'function' can be sent to Anthropic."
        )
    call_id = _required_str(call, "id", param)
    function = call.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest.wrong_type(f"{param}.function", "an object", function)
    name = _required_str(function, "name", f"{param}.function")
    arguments = _arguments(function.get("arguments", ""), f"{param}.function.arguments")
    return {"type": "tool_use", "id": _tool_id(call_id), "name": name, "input": arguments}


def _arguments(value: object, param: str) -> Json:
    """OpenAI's JSON-encoded arguments as the object Anthropic wants; "" means no arguments."""
    if not isinstance(value, str):
        raise InvalidRequest.wrong_type(param, "a string", value)
    if not value.strip():
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise _invalid(
            param,
            f"Invalid '{param}': not valid JSON ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno}); Anthropic needs the arguments as a JSON object.",
        ) from None
    if not isinstance(parsed, dict):
        raise _invalid(
            param,
            f"Invalid '{param}': expected a JSON object, got {json_type_name(parsed)}; "
            "Anthropic needs the arguments as a JSON object.",
        )
    return parsed


def _tool_result(message: Json, param: str) -> Json:
    tool_use_id = _tool_id(_required_str(message, "tool_call_id", param))
    content = message.get("content")
    result: str | list[Json]
    if content is None or isinstance(content, str):
        result = content or ""
    else:
        result = _text_blocks(content, f"{param}.content") or ""
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": result}


def _tool_id(raw: str) -> str:
    return _UNSAFE_ID_CHARS.sub("_", raw)


def _text(text: str) -> Json:
    return {"type": "text", "text": text}


# --- validation helpers ----------------------------------------------------------------


def _unsupported_part(part: object, param: str) -> InvalidRequest:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind is None:
        return InvalidRequest.wrong_type(param, "a content part object with a 'type'", part)
    return _unsupported(
        f"{param}.type", f"Content parts of type {kind!r} are not supported by Anthropic here."
    )
