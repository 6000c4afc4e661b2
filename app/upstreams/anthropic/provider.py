"""Anthropic's Messages API as a chain entry: the HTTP exchange around the translation.

`open()` translates the chat-completions body (`to_anthropic_request`), posts it to
`/v1/messages` with `x-api-key` and `anthropic-version`, and returns only once it knows
what the client will get:

- a non-2xx answer: read whole (bounded), kept raw for the fallback policy (Retry-After,
  `overloaded_error`, "prompt is too long") and translated to OpenAI's envelope for the
  client (`BufferedResponse.policy_body` holds the raw one);
- a non-streaming 200: read whole and translated to a `chat.completion`;
- a stream: events are read and translated until the first one that carries content (a
  text delta, a tool call, the end of the message). `message_start` and `ping` carry
  none, so an `error` event before any content (Anthropic reports `overloaded_error`
  this way inside a 200) leaves `early_error` set and the chain can still fall back.
  `first_byte_s` bounds that whole wait: a stream that stalls after `message_start`
  stalls before its first byte.

A Messages request (`/v1/messages`, `/v1/messages/count_tokens`, from a client speaking
Anthropic's API to the gateway) is passed through: the body with the provider's model,
the answer as Anthropic sent it (only `content-type`, `retry-after`, `request-id` and
`anthropic-ratelimit-*` headers kept). Other APIs are not offered; the chain skips this
provider for them.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Final

from app.anthropic import (
    StreamTranslator,
    anthropic_headers,
    openai_error_from_anthropic,
    to_anthropic_request,
    to_openai_completion,
)
from app.errors import UpstreamTimeout
from app.jsonwire import json_bytes
from app.settings import TimeoutsConfig
from app.settings.cloud import ProviderConfig
from app.settings.endpoints import Api
from app.upstreams.anthropic.bodies import KEPT_ON_ERROR, whole_answer
from app.upstreams.anthropic.relayed import TranslatedStream
from app.upstreams.http import BufferedResponse, Relayable, UpstreamResponse
from app.upstreams.provider import HttpProvider, ProviderRequest
from app.upstreams.usage import tokens_of

_KEPT_PASSED_THROUGH: Final = KEPT_ON_ERROR | {b"content-type", b"request-id"}
_MALFORMED: Final = {
    "type": "error",
    "error": {"type": "api_error", "message": "The Anthropic stream carried a malformed event."},
}


class AnthropicProvider(HttpProvider):
    kind = "anthropic"
    role = "upstream"  # its errors say "upstream 'name'", as they always have

    def __init__(
        self, name: str, config: ProviderConfig, key: str | None, timeouts: TimeoutsConfig
    ) -> None:
        assert config.max_tokens is not None  # the schema requires it for kind anthropic
        self._max_tokens = config.max_tokens
        super().__init__(name, config, key, timeouts)

    def _key_headers(self, key: str | None) -> dict[str, str]:
        version = self.config.anthropic_version
        return anthropic_headers(key, version=version) if key else {"anthropic-version": version}

    async def open(self, request: ProviderRequest, first_byte_s: float) -> Relayable:
        if request.api is Api.MESSAGES:
            return await self._passed_through(request, first_byte_s)
        body = to_anthropic_request(
            request.payload,
            model=self.config.model,
            default_max_tokens=self._max_tokens,
            stream=request.stream,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + first_byte_s
        response = await self.upstream.open(
            "/v1/messages",
            json_bytes(body),
            {"content-type": "application/json"},
            first_byte_s=first_byte_s,
        )
        try:
            if response.status != 200 or not request.stream:
                return await self._whole(response, request, deadline - loop.time())
            stream = AnthropicStream(
                response,
                StreamTranslator(self.config.model, int(time.time()), request.include_usage),
                self.name,
            )
            await stream.prime(deadline - loop.time(), first_byte_s)
            return stream
        except BaseException:
            response.release()
            raise

    async def _passed_through(self, request: ProviderRequest, first_byte_s: float) -> Relayable:
        response = await self.upstream.open(
            request.path,
            request.body_for(self.config.model),
            {"content-type": "application/json"},
            first_byte_s=first_byte_s,
        )
        response.headers = [
            (name, value)
            for name, value in response.headers
            if name in _KEPT_PASSED_THROUGH or name.startswith(b"anthropic-ratelimit-")
        ]
        return response

    async def _whole(
        self, response: UpstreamResponse, request: ProviderRequest, within_s: float
    ) -> BufferedResponse:
        return await whole_answer(
            response,
            within_s,
            envelope=openai_error_from_anthropic,
            translate=self._completion,
            who=f"upstream {self.name!r}",
            what="a message",
        )

    def _completion(self, message: dict[str, Any]) -> dict[str, Any]:
        return to_openai_completion(message, model=self.config.model, created=int(time.time()))


class AnthropicStream(TranslatedStream):
    """A Messages stream as OpenAI chunks; `prime()` reads up to the first content."""

    _translator: StreamTranslator

    def __init__(self, response: UpstreamResponse, translator: StreamTranslator, name: str) -> None:
        super().__init__(response, translator)
        self._name = name
        self._committed = False
        self.early_error = False  # an error event (or the end) came before any content

    def usage(self) -> tuple[int, int]:
        return tokens_of(self._translator.usage) or (0, 0)

    async def prime(self, within_s: float, first_byte_s: float) -> None:
        parts = [self._translate(self._response.first_chunk)]
        try:
            async with asyncio.timeout(max(within_s, 0.0)):
                while not (self._committed or self._translator.done):
                    chunk = await anext(self._chunks, None)
                    if chunk is None:
                        parts.append(b"".join(self._translator.finish()))
                        break
                    parts.append(self._translate(chunk))
        except TimeoutError:
            raise UpstreamTimeout(
                f"upstream {self._name!r} sent no content within {first_byte_s:g}s",
                kind="first_byte_timeout",
            ) from None
        if self._translator.done and not self._committed:
            self.early_error = self._translator.failed
        self.first_chunk = b"".join(parts)

    def _translate(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        for event, data in self._parser.feed(chunk):
            try:
                payload: Any = json.loads(data)
            except ValueError:
                payload = None
            if not isinstance(payload, dict):
                event, payload = "error", _MALFORMED
            kind = event if event and event != "message" else str(payload.get("type", ""))
            lines = self._translator.feed(event, payload)
            if lines and kind not in ("message_start", "error"):
                self._committed = True
            out.extend(lines)
            if self._translator.done:
                break
        return b"".join(out)
