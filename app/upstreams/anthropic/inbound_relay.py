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

import asyncio
import json
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
from app.errors import UpstreamTimeout, UpstreamUnavailable
from app.jsonwire import json_bytes
from app.upstreams.anthropic.bodies import (
    MAX_ANSWER_BODY,
    MAX_ERROR_BODY,
    read_body,
    retry_headers,
)
from app.upstreams.anthropic.relayed import TranslatedStream
from app.upstreams.http import BufferedResponse, Relayable
from app.upstreams.usage import tokens_of

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
    ok = response.status == 200
    try:
        async with asyncio.timeout(max(within_s, 0.0)):
            raw = await read_body(response, MAX_ANSWER_BODY if ok else MAX_ERROR_BODY)
    except TimeoutError:
        raise UpstreamTimeout(
            "the upstream did not finish its answer in time", kind="first_byte_timeout"
        ) from None
    finally:
        response.release()
    if not ok:
        envelope = anthropic_error_from_openai(response.status, raw)
        answer = BufferedResponse(response.status, json_bytes(envelope), policy_body=raw)
        answer.headers.extend(retry_headers(response))
        return answer
    try:
        answer_body = json.loads(raw)
        translated = translate(answer_body) if isinstance(answer_body, dict) else None
    except ValueError:
        translated = None
    if translated is None:
        raise UpstreamUnavailable(
            f"the upstream answered 200 with a body that is not {what}", kind="bad_response"
        )
    return BufferedResponse(200, json_bytes(translated))


class MessagesStream(TranslatedStream):
    """An OpenAI chunk stream relayed as Anthropic's Messages events."""

    _translator: MessagesStreamTranslator

    def __init__(self, response: Relayable, model: str) -> None:
        super().__init__(response, MessagesStreamTranslator(model, message_id(uuid.uuid4().hex)))
        self.first_chunk = self._translate(response.first_chunk)

    def usage(self) -> tuple[int, int]:
        """(input tokens, output tokens) so far."""
        return tokens_of(self._translator.usage) or (0, 0)

    def _translate(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for _event, data in self._parser.feed(chunk):
            out.extend(self._translator.feed(data))
            if self._translator.done:
                break
        return b"".join(out)
