"""A local vLLM started without tool calling: its 400 relayed with a hint naming the flags.

vLLM 0.33 parses tool calls only when its server runs with `--enable-auto-tool-choice
--tool-call-parser NAME` (vllm/parser/parser_manager.py:34-35 builds no tool parser
otherwise). Without them it refuses a chat request with `tools` whose `tool_choice` is
"auto" (the default when tools are given, chat_completion/protocol.py:988-991), "required"
or a named function, 400 before anything is generated, stream or not
(vllm/renderers/online_renderer.py:262-290):

    "auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set
    tool_choice="required" requires --tool-call-parser to be set

Its native `/v1/messages` and `count_tokens` render the same chat request (tools without a
`tool_choice` are "auto": anthropic/serving.py:818-819) and answer it in Anthropic's
envelope; `/v1/responses` does not check. Claude Code sends tools with every request, so
against such a server it fails on every one. The message names vLLM's flags but not that
the server is the gateway's to restart, nor which parser: the relayed error keeps vLLM's
status, envelope and words and gets `hint` appended, and the first one of each backend is
logged at WARNING.

Only a small complete JSON answer is read (`MAX_BODY`); any other answer is relayed
untouched, and nothing here runs for a status other than 400.
"""

from __future__ import annotations

import json
from typing import Final

from app.jsonwire import json_bytes

# Both of vLLM's refusals end so (online_renderer.py:279 and :289).
REFUSAL_ENDS: Final = "--tool-call-parser to be set"
MAX_BODY: Final = 16 * 1024
_MARK: Final = "(microscheduler: "


def hint(backend: str) -> str:
    """What the message gets appended: the flags, a parser per family, the docs."""
    return (
        f" {_MARK}start the vLLM of backend '{backend}' with --enable-auto-tool-choice "
        "--tool-call-parser PARSER, e.g. hermes for Qwen, llama3_json for Llama 3; see "
        "docs/vllm.md#claude-code)"
    )


def is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        name == b"content-type" and value.lower().startswith(b"application/json")
        for name, value in headers
    )


def hinted(body: bytes, backend: str) -> bytes | None:
    """`body` (a 400's, in OpenAI's envelope or Anthropic's: both keep the words in
    `error.message`) with the hint appended to vLLM's tool-parser refusal; None when it is
    not that refusal (or too large, not JSON, hinted already)."""
    if len(body) > MAX_BODY:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    if not isinstance(message, str) or not message.endswith(REFUSAL_ENDS):
        return None
    return json_bytes({**parsed, "error": {**error, "message": message + hint(backend)}})
