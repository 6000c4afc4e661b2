"""Anthropic's Messages API inbound: `POST /v1/messages` and `/v1/messages/count_tokens`,
for Claude Code and the Anthropic SDKs pointed at local models.

Routed by `model` like chat, with the same lifecycle, limits, metrics and timeouts. The
client's key is the gateway's (`x-api-key`, or a bearer token); `anthropic-version` and
`anthropic-beta` are accepted and passed on. Every error the gateway itself writes is in
Anthropic's envelope (`{"type": "error", "error": {"type", "message"}}`), and while a
streaming request waits for a backend to wake the client gets `ping` events.

Where the request goes (`Call.for_target`):
- a backend or provider that serves `messages` gets it as sent (the model name put in),
  and its answer, stream and errors are relayed as they come: a vLLM generate backend
  (vLLM 0.33 serves `/v1/messages` and `/count_tokens`; `app.settings.endpoints`
  `native_messages`), one that lists `messages` in its `endpoints:`, an Anthropic
  provider in a chain. Usage is read from the end of the answer (`Exchange.body_done`:
  Anthropic's `input_tokens`/`output_tokens`, a stream's last `message_delta`);
- any other gets it as OpenAI chat, and its answer, stream or not, is translated
  back; `count_tokens` goes to vLLM's `/tokenize` in its chat form and answers
  `{"input_tokens": N}`. This module only picks which translation; the translated call
  (its body, headers and path, and the way back) is shaped in `app.routing.translation`,
  like the rest of what goes on the wire (`app.routing.shaping`): nothing here writes
  upstream bytes.
The translation is built only when a target may need it (`Dispatcher.serves_everywhere`).
A request it cannot carry (a server tool, an unknown block) is a 400 only when no target
would take it as sent.
"""

from __future__ import annotations

import json
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.anthropic.inbound import anthropic_error, anthropic_error_from_openai
from app.anthropic.inbound_stream import error_event, ping_event
from app.api.deps import plane_of
from app.api.handlers import JSONBody
from app.api.openai import client_key, read_body
from app.api.protocol import (
    ParsedRequest,
    json_object,
    model_of,
    stream_of,
)
from app.api.relay import SSE_TYPE, RelayResponse
from app.errors import GatewayError, InvalidRequest
from app.routing.exchange import Call, Translated
from app.routing.patience import MAX_WAIT_HEADER, parse_max_wait
from app.routing.shaping import upstream_body, upstream_headers
from app.routing.translation import Translation, count_tokens_as_tokenize, messages_as_chat
from app.services import Services
from app.settings.endpoints import Api

MESSAGES_PATH: Final = "/v1/messages"
COUNT_TOKENS_PATH: Final = "/v1/messages/count_tokens"


class AnthropicDialect:
    """What the gateway says, in Anthropic's words (see `app.api.relay.Dialect`)."""

    stream_type = SSE_TYPE

    def error_response(self, err: GatewayError) -> Response:
        return JSONBody(
            anthropic_error(err.status, err.message),
            status_code=err.status,
            headers=err.headers or None,
        )

    def stream_error(self, err: GatewayError, last_chunk: bytes) -> bytes:
        ended = not last_chunk or last_chunk.endswith((b"\n\n", b"\r\n\r\n"))
        return (b"" if ended else b"\n\n") + error_event(err.status, err.message)

    def upstream_stream_error(self, status: int, body: bytes) -> bytes:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("type") == "error":
            error = parsed.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            if isinstance(message, str):
                return error_event(status, message)
        error = anthropic_error_from_openai(status, body)["error"]
        return error_event(status, str(error["message"]))

    def keepalive(self, backend: str, waited_s: float, detail: str | None) -> bytes:
        return ping_event()


ANTHROPIC: Final = AnthropicDialect()


def _credentials(request: Request) -> str | None:
    """The client's key as the authenticator takes it: `x-api-key` (Anthropic's SDKs)
    wins over `authorization` (a bearer token, e.g. Claude Code's auth token)."""
    key = request.headers.get("x-api-key")
    return f"Bearer {key}" if key is not None else request.headers.get("authorization")


async def messages(request: Request) -> Response:
    return await _relay(request, MESSAGES_PATH, messages_as_chat)


async def count_tokens(request: Request) -> Response:
    return await _relay(request, COUNT_TOKENS_PATH, count_tokens_as_tokenize)


async def _relay(request: Request, path: str, translation: Translation) -> Response:
    """The Messages call to `path`: as sent to a target that speaks Messages, else as
    `translation` says. A request the translation refuses is refused only when no target
    would take it as sent."""
    services: Services = request.app.state.services
    plane = plane_of(request)  # one plane for the whole request, across the body's read
    try:
        key = client_key(request, _credentials(request))
        body = await read_body(request, services.settings.max_body_bytes)
        payload = json_object(body)
        model = model_of(payload)
        stream = stream_of(payload) if path == MESSAGES_PATH else False
        route = plane.dispatcher.route(model)
        key.check_model(route.name)
        parsed = ParsedRequest(model=model, stream=stream, payload=payload, raw=body)
        headers = upstream_headers(request.scope["headers"])
        translated: Translated | None = None
        if not plane.dispatcher.serves_everywhere(route, Api.MESSAGES):
            try:
                translated = translation(parsed, route, headers)
            except InvalidRequest:
                if not plane.dispatcher.can_serve(route, Api.MESSAGES):
                    raise
        # Read before the key counts the request: a bad value is a 400 for any model.
        wait_s = parse_max_wait(request.headers.get(MAX_WAIT_HEADER))
        call = Call(
            route,
            path,
            payload,
            stream,
            upstream_body(parsed, route),
            headers,
            api=Api.MESSAGES,
            translated=translated,
            priority=key.priority,
            max_wait_s=wait_s,
            key=key.admit(),
        )
    except GatewayError as err:
        return ANTHROPIC.error_response(err)
    return RelayResponse(plane.dispatcher, call, dialect=ANTHROPIC, relays=services.relays)


routes: list[BaseRoute] = [
    Route(MESSAGES_PATH, messages, methods=["POST"], name="messages"),
    Route(COUNT_TOKENS_PATH, count_tokens, methods=["POST"], name="messages_count_tokens"),
]
