"""An opened OpenAI chat-completions answer served as a Messages one (the reverse of
`AnthropicProvider`'s answer handling, provider.py):

- a non-2xx answer: read whole (64 KiB, within `within_s`), released, and returned as
  Anthropic's error envelope with the same status, keeping the upstream's message and
  its `retry-after` headers;
- a 200 that is not an event stream: read whole (32 MiB, within `within_s`), released,
  translated by `to_anthropic_message`; a body that is not a JSON object is
  `UpstreamUnavailable(kind="bad_response")`;
- a 200 event stream: a `MessagesStream`, translating chunk by chunk as the relay reads
  it (`SseParser`, then `MessagesStreamTranslator`). Its `first_chunk` is the translation
  of the upstream's first chunk (possibly empty: an event may straddle chunks).

A read that outlasts `within_s` is `UpstreamTimeout(kind="first_byte_timeout")`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from app.anthropic.inbound import (
    anthropic_error_from_openai,
    count_tokens_answer,
    message_id,
    to_anthropic_message,
)
from app.anthropic.inbound_stream import MessagesStreamTranslator
from app.upstreams.anthropic.bodies import whole_answer
from app.upstreams.anthropic.relayed import ChunksTranslated
from app.upstreams.http import BufferedResponse, Relayable

Json = dict[str, Any]


async def as_messages(
    response: Relayable, *, model: str, stream: bool, within_s: float
) -> Relayable:
    """`response` (an opened chat-completions answer) as a Messages answer for `model`.

    `stream` is what the client asked for; the upstream's content type decides how its
    body is read. The upstream is released here, except for a stream (its `release`)."""
    if response.status != 200 or not response.is_event_stream:
        translate = partial(to_anthropic_message, model=model)
        return await _whole(response, translate, "a chat completion", within_s)
    return MessagesStream(response, model)


async def as_token_count(response: Relayable, within_s: float) -> Relayable:
    """`response` (vLLM's `/tokenize` answer) as `count_tokens`' `{"input_tokens": N}`."""
    return await _whole(response, count_tokens_answer, "a tokenize answer", within_s)


async def _whole(
    response: Relayable, translate: Callable[[Json], Json], what: str, within_s: float
) -> BufferedResponse:
    """Read whole and translated (an error into Anthropic's envelope); released here,
    whatever happens."""
    return await whole_answer(
        response,
        within_s,
        envelope=anthropic_error_from_openai,
        translate=translate,
        who="the upstream",
        what=what,
    )


class MessagesStream(ChunksTranslated):
    """An OpenAI chunk stream relayed as Anthropic's Messages events."""

    _translator: MessagesStreamTranslator

    def __init__(self, response: Relayable, model: str) -> None:
        super().__init__(response, MessagesStreamTranslator(model, message_id(uuid.uuid4().hex)))
        self.first_chunk = self._translate(response.first_chunk)
