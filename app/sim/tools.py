"""Tool calls from the fake vLLM, so clients' tool loops can be tested end to end.

The rule is simple and deterministic: a chat request that declares `tools` (and does not
set `tool_choice: "none"`) whose last message is the user's gets one call of the named
tool (`tool_choice: {"type": "function", ...}`) or else the first tool, with the
generated text as `{"text": ...}` arguments, and `finish_reason: "tool_calls"`. Once a
`tool` message answers it, the fake answers in text. Shapes as vLLM sends them with
`--enable-auto-tool-choice` (`ChatCompletionMessageToolCall`, ids `chatcmpl-tool-<hex>`,
streamed as a first delta with id and name, then argument pieces).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from app.sim.text import dumps


def tool_to_call(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    messages = body.get("messages")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    if isinstance(choice, dict):
        named = choice.get("function")
        if isinstance(named, dict) and isinstance(named.get("name"), str):
            return str(named["name"])
    first = tools[0].get("function") if isinstance(tools[0], dict) else None
    name = first.get("name") if isinstance(first, dict) else None
    return name if isinstance(name, str) else None


def with_tool_call(completion: bytes, name: str, text: str) -> bytes:
    """A chat completion (as the fake built it) answering with one call of `name`."""
    body = json.loads(completion)
    choice = body["choices"][0]
    choice["message"]["content"] = None
    choice["message"]["tool_calls"] = [_call(name, text)]
    choice["finish_reason"] = "tool_calls"
    return dumps(body)


def tool_call_chunks(head: dict[str, Any], name: str, text: str) -> list[bytes]:
    """The streamed call: id and name first, the arguments in two pieces, the finish."""
    call = _call(name, text)
    arguments = call["function"]["arguments"]
    half = len(arguments) // 2
    deltas: list[tuple[dict[str, Any], str | None]] = [
        ({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                          "function": {"name": name, "arguments": ""}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:half]}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]}, None),
        ({}, "tool_calls"),
    ]  # fmt: skip
    return [
        b"data: "
        + dumps(
            {
                **head,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )
        + b"\n\n"
        for delta, finish in deltas
    ]


def _call(name: str, text: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"text": text})},
    }
