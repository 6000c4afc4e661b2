"""Translation between OpenAI chat completions and Anthropic's Messages API. Pure: no I/O.

Not an upstream: both the Anthropic provider (`app.upstreams.anthropic.provider`, OpenAI
requests to Anthropic) and the inbound Messages API (`app.api.messages`, Anthropic requests
to an OpenAI backend) use it. What moves bytes (relaying an opened answer translated,
the provider's HTTP exchange) is in `app.upstreams.anthropic`.

This module is the facade; the work is done in three modules, each with its decisions in
its docstring, written against Anthropic's Messages API reference
(https://docs.anthropic.com/en/api/messages, streaming: /en/docs/build-with-claude/streaming)
and OpenAI's chat completions reference:

    request    to_anthropic_request: an OpenAI request body -> a Messages body
    response   to_openai_completion: a Messages response -> a chat.completion;
               openai_error_from_anthropic: a non-2xx answer -> OpenAI's envelope
    stream     SseParser: body bytes -> (event, data);
               StreamTranslator: Anthropic events -> OpenAI chunk SSE lines

and the reverse direction, Anthropic's Messages API served by an OpenAI backend (vLLM):

    inbound         to_openai_chat: a Messages body -> a chat-completions body;
                    to_anthropic_message: a chat.completion -> a Messages response;
                    anthropic_error(_from_openai): Anthropic's error envelope;
                    tokenize_request / count_tokens_answer: count_tokens via vLLM's /tokenize
    inbound_stream  MessagesStreamTranslator: OpenAI chunks -> Messages SSE events
    (app.upstreams.anthropic.inbound_relay: as_messages, an opened chat-completions
    answer relayed as a Messages one)

The caller owns the HTTP exchange: it posts `to_anthropic_request(...)` as JSON to
`/v1/messages` with `anthropic_headers(key)`, and never logs those headers.
"""

from __future__ import annotations

from typing import Final

from app.anthropic.inbound import (
    anthropic_error,
    anthropic_error_from_openai,
    count_tokens_answer,
    to_anthropic_message,
    to_openai_chat,
    tokenize_request,
)
from app.anthropic.inbound_stream import (
    MessagesStreamTranslator,
    error_event,
    ping_event,
)
from app.anthropic.request import to_anthropic_request
from app.anthropic.response import (
    FINISH_REASONS,
    finish_reason,
    openai_error_from_anthropic,
    to_openai_completion,
)
from app.anthropic.stream import DONE, SseParser, StreamTranslator

__all__ = [
    "ANTHROPIC_VERSION",
    "DONE",
    "FINISH_REASONS",
    "MessagesStreamTranslator",
    "SseParser",
    "StreamTranslator",
    "anthropic_error",
    "anthropic_error_from_openai",
    "anthropic_headers",
    "count_tokens_answer",
    "error_event",
    "finish_reason",
    "openai_error_from_anthropic",
    "ping_event",
    "to_anthropic_message",
    "to_anthropic_request",
    "to_openai_chat",
    "to_openai_completion",
    "tokenize_request",
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
