"""Translation between OpenAI chat completions and Anthropic's Messages API. Pure: no I/O.

This module is the facade; the work is done in three modules, each with its decisions in
its docstring, written against Anthropic's Messages API reference
(https://docs.anthropic.com/en/api/messages, streaming: /en/docs/build-with-claude/streaming)
and OpenAI's chat completions reference:

    request    to_anthropic_request: an OpenAI request body -> a Messages body
    response   to_openai_completion: a Messages response -> a chat.completion;
               openai_error_from_anthropic: a non-2xx answer -> OpenAI's envelope
    stream     SseParser: body bytes -> (event, data);
               StreamTranslator: Anthropic events -> OpenAI chunk SSE lines

The caller owns the HTTP exchange: it posts `to_anthropic_request(...)` as JSON to
`/v1/messages` with `anthropic_headers(key)`, and never logs those headers.
"""

from __future__ import annotations

from typing import Final

from app.upstreams.anthropic.request import to_anthropic_request
from app.upstreams.anthropic.response import (
    FINISH_REASONS,
    finish_reason,
    openai_error_from_anthropic,
    to_openai_completion,
)
from app.upstreams.anthropic.stream import DONE, SseParser, StreamTranslator

__all__ = [
    "ANTHROPIC_VERSION",
    "DONE",
    "FINISH_REASONS",
    "SseParser",
    "StreamTranslator",
    "anthropic_headers",
    "finish_reason",
    "openai_error_from_anthropic",
    "to_anthropic_request",
    "to_openai_completion",
]

# The documented version; newer SDKs send newer ones, so a provider may configure its own.
ANTHROPIC_VERSION: Final = "2023-06-01"


def anthropic_headers(api_key: str, *, version: str = ANTHROPIC_VERSION) -> dict[str, str]:
    """The headers a Messages request needs. They hold the key: never log them."""
    return {
        "x-api-key": api_key,
        "anthropic-version": version,
        "content-type": "application/json",
    }
