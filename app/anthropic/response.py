"""Anthropic Messages responses and errors as OpenAI chat-completions ones. Pure: no I/O.

Decisions (Anthropic's Messages API reference, docs.anthropic.com/en/api/messages):

- Text blocks are joined into `message.content`; `tool_use` blocks become `tool_calls`
  (`arguments` is the input as compact JSON). `content` is None when the answer is only
  tool calls, "" when there is nothing at all. `thinking`, `redacted_thinking` and
  server-tool blocks are dropped: OpenAI's chat format has no place for them.
- `stop_reason` -> `finish_reason`: end_turn, stop_sequence, pause_turn -> stop (a pause
  only follows server tools, which this gateway never sends); max_tokens and
  model_context_window_exceeded -> length; tool_use -> tool_calls; refusal ->
  content_filter. An unknown reason is passed on unchanged and logged. The stop sequence
  that matched is kept in the choice's `stop_reason`, the field vLLM uses for it.
- `prompt_tokens` counts cache reads and writes too (Anthropic's `input_tokens` does not);
  `prompt_tokens_details.cached_tokens` is the cache reads, when Anthropic reports them.
- Errors keep Anthropic's message; the type and code say whose problem it is. A rejected
  provider key, a missing model or a provider outage is the gateway's (`server_error`,
  `upstream_*` code), not the client's: the client's own key was fine.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any, Final

Json = dict[str, Any]

logger = logging.getLogger(__name__)

FINISH_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# The reverse direction (an OpenAI answer served as a Messages one): each OpenAI reason's
# first Anthropic reason above. `stop` is `stop_sequence` instead when a stop string matched.
STOP_REASONS: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}

# Anthropic error type -> OpenAI (type, code).
ERROR_TYPES: Final[dict[str, tuple[str, str | None]]] = {
    "invalid_request_error": ("invalid_request_error", None),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "authentication_error": ("server_error", "upstream_authentication_failed"),
    "permission_error": ("server_error", "upstream_permission_denied"),
    "billing_error": ("server_error", "upstream_billing_error"),
    "not_found_error": ("server_error", "upstream_not_found"),
    "rate_limit_error": ("rate_limit_error", "rate_limit_exceeded"),
    "timeout_error": ("server_error", "upstream_timeout"),
    "api_error": ("server_error", "upstream_error"),
    "overloaded_error": ("server_error", "upstream_overloaded"),
}
# Anthropic's error type for an HTTP status (docs.anthropic.com/en/api/errors); used for
# bodies that are not Anthropic's error JSON, or carry a type not listed above.
ERROR_TYPE_BY_STATUS: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_USAGE_FIELDS: Final = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)


def to_openai_completion(anthropic_response: Json, *, model: str, created: int) -> Json:
    """A `chat.completion` object for a non-streaming Messages response."""
    texts: list[str] = []
    tool_calls: list[Json] = []
    for block in anthropic_response.get("content") or []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "tool_use":
            tool_calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": dump_json(block.get("input") or {}),
                    },
                }
            )
    content = "".join(texts) if texts else (None if tool_calls else "")
    message: Json = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    choice: Json = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason(anthropic_response.get("stop_reason")),
    }
    stop_sequence = anthropic_response.get("stop_sequence")
    if stop_sequence is not None:
        choice["stop_reason"] = stop_sequence
    return {
        "id": completion_id(anthropic_response.get("id")),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": openai_usage(anthropic_response.get("usage") or {}),
    }


def openai_error_from_anthropic(status: int, body: bytes) -> Json:
    """OpenAI's error envelope for a non-2xx Anthropic answer.

    Only Anthropic's own error JSON is read; any other body (an HTML page from a proxy)
    is not echoed, the status speaks for it.
    """
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return {"error": openai_error(error if isinstance(error, dict) else None, status)}


def openai_error(anthropic_error: Json | None, status: int | None) -> Json:
    """The inner OpenAI error object for Anthropic's `error` object (`status` None in a stream).

    A 429 (or 400) whose `details.error_code` names a reason, such as
    `enforced_spend_limit_reached`, keeps that reason as the code: it must not be retried.
    """
    error = anthropic_error or {}
    kind = error.get("type")
    if kind not in ERROR_TYPES:
        fallback = "api_error" if status is None or status >= 500 else "invalid_request_error"
        kind = ERROR_TYPE_BY_STATUS.get(status or 0, fallback)
    openai_type, code = ERROR_TYPES[kind]
    details = error.get("details")
    if isinstance(details, dict) and isinstance(details.get("error_code"), str):
        code = details["error_code"]
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = (
            f"The Anthropic API answered HTTP {status}."
            if status is not None
            else "The Anthropic API reported an error."
        )
    return {"message": message, "type": openai_type, "param": None, "code": code}


def finish_reason(stop_reason: object) -> str:
    """OpenAI's `finish_reason` for Anthropic's `stop_reason` (None: the message just ended)."""
    if stop_reason is None:
        return "stop"
    reason = str(stop_reason)
    mapped = FINISH_REASONS.get(reason)
    if mapped is None:
        logger.warning("anthropic_unknown_stop_reason stop_reason=%s", reason)
        return reason
    return mapped


def openai_usage(usage: Json) -> Json:
    """OpenAI usage from Anthropic's, whose `input_tokens` excludes cache reads and writes."""
    counts = {field: _count(usage.get(field)) for field in _USAGE_FIELDS}
    prompt = (
        counts["input_tokens"]
        + counts["cache_creation_input_tokens"]
        + counts["cache_read_input_tokens"]
    )
    out: Json = {
        "prompt_tokens": prompt,
        "completion_tokens": counts["output_tokens"],
        "total_tokens": prompt + counts["output_tokens"],
    }
    if usage.get("cache_read_input_tokens") is not None:
        out["prompt_tokens_details"] = {"cached_tokens": counts["cache_read_input_tokens"]}
    return out


def merge_usage(into: Json, usage: object) -> None:
    """Overwrite the counts `usage` carries: Anthropic's stream counts are cumulative."""
    if not isinstance(usage, dict):
        return
    for field in _USAGE_FIELDS:
        if usage.get(field) is not None:
            into[field] = usage[field]


def completion_id(anthropic_id: object) -> str:
    """`chatcmpl-<Anthropic message id>`, or a random one if Anthropic gave none."""
    if isinstance(anthropic_id, str) and anthropic_id:
        return f"chatcmpl-{anthropic_id}"
    return f"chatcmpl-{uuid.uuid4().hex}"


def dump_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
