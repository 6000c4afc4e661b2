"""Tool calls from the fake vLLM, so clients' tool loops can be tested end to end.

As vLLM 0.33, tool calling needs the server's `--enable-auto-tool-choice` and
`--tool-call-parser NAME` (`tool_choice_error`): without them a request whose
`tool_choice` is "auto" (the default when it declares `tools`) is a 400, and one whose
`tool_choice` is "required" or names a function too; "none" is served (the tools reach the
template, no call is parsed). `TOOL_PARSERS` are the parser names vLLM 0.33 registers.

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
from typing import Any, Final

from app.sim.text import ApiError, dumps

# vllm/tool_parsers/__init__.py `_TOOL_PARSERS_TO_REGISTER` (vLLM 0.33): the names
# `--tool-call-parser` takes (vllm/entrypoints/common/cli_args.py:619 refuses others).
TOOL_PARSERS: Final = frozenset(
    {"dots", "deepseek_v3", "deepseek_v31", "deepseek_v32", "deepseek_v4", "deepseek_v41",
     "cohere_command3", "cohere_command4", "ernie45", "glm45", "glm47", "ling3",
     "granite-20b-fc", "granite", "granite4", "hermes", "hf", "beam", "poolside_v1",
     "hunyuan_a13b", "hy_v3", "hy_v4", "internlm", "jamba", "lfm2", "kimi_k2", "kimi_k3",
     "k2_horizon", "llama3_json", "llama4_json", "llama4_pythonic", "longcat", "mimo",
     "minimax_m2", "minimax_m3", "minicpm5", "mistral", "olmo3", "plamo3", "muse",
     "muse_glimmer", "musespark1x", "openai", "phi4_mini_json", "pythonic", "qwen3_coder",
     "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5", "step5", "inkling", "xlam",
     "gigachat3", "functiongemma", "gemma4", "apertus"}
)  # fmt: skip
# vllm/renderers/online_renderer.py:277-280, word for word.
AUTO_TOOL_CHOICE_REFUSED: Final = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


def chat_tool_choice(body: dict[str, Any]) -> Any:
    """The request's `tool_choice` as vLLM reads it: "auto" when it declares `tools` and
    sets none (vllm/entrypoints/openai/chat_completion/protocol.py:988-991)."""
    if "tool_choice" not in body and body.get("tools"):
        return "auto"
    return body.get("tool_choice")


def tool_choice_error(choice: Any, *, tool_calling: bool) -> ApiError | None:
    """vLLM 0.33's refusal of a `tool_choice` its server cannot parse calls for
    (vllm/renderers/online_renderer.py:262-290), None when it serves it. `tool_calling`:
    the server runs with `--enable-auto-tool-choice --tool-call-parser NAME` (vLLM builds
    a tool parser only with both: vllm/parser/parser_manager.py:34-35). vLLM spares
    Mistral-tokenizer and gpt-oss (Harmony) models this check; the fake has neither."""
    if tool_calling or choice in (None, "none"):
        return None
    if choice == "auto":
        return ApiError(400, AUTO_TOOL_CHOICE_REFUSED)
    function = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(function, dict):
        described = f'function "{function.get("name")}"'
    else:
        described = f'"{choice}"'
    return ApiError(400, f"tool_choice={described} requires --tool-call-parser to be set")


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
