"""Anthropic's Messages API inbound: `POST /v1/messages` and `/v1/messages/count_tokens`,
for Claude Code and the Anthropic SDKs pointed at local models.

Routed by `model` like chat, with the same lifecycle, limits, metrics and timeouts. The
client's key is the gateway's (`x-api-key`, or a bearer token); `anthropic-version` and
`anthropic-beta` are accepted and passed on. Every error the gateway itself writes is in
Anthropic's envelope (`{"type": "error", "error": {"type", "message"}}`), and while a
streaming request waits for a backend to wake the client gets `ping` events.

Where the request goes (`Call.for_target`):
- a backend or provider that serves `messages` gets it as sent (the model name put in):
  a vLLM that lists `messages` in its `endpoints:`, an Anthropic provider in a chain;
- any other gets it as OpenAI chat (`app.upstreams.anthropic.inbound`), and its answer,
  stream or not, is translated back (`inbound_relay.as_messages`). `count_tokens` goes
  to vLLM's `/tokenize` in its chat form and answers `{"input_tokens": N}`.
A request the translation cannot carry (a server tool, an unknown block) is a 400 only
when no target would take it as sent.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from app.api.openai import read_body
from app.api.protocol import ParsedRequest, dump_json, json_object, model_of, upstream_body
from app.api.relay import RelayResponse
from app.errors import GatewayError, InvalidRequest
from app.routing.exchange import Call, Translated
from app.services import Services
from app.settings.endpoints import Api
from app.upstreams.anthropic.inbound import (
    anthropic_error,
    anthropic_error_from_openai,
    to_openai_chat,
    tokenize_request,
)
from app.upstreams.anthropic.inbound_relay import as_messages, as_token_count
from app.upstreams.anthropic.inbound_stream import error_event, ping_event
from app.upstreams.http import forwardable_request_headers

MESSAGES_PATH: Final = "/v1/messages"
COUNT_TOKENS_PATH: Final = "/v1/messages/count_tokens"
_JSON: Final = {"content-type": "application/json"}


class AnthropicDialect:
    """What the gateway says, in Anthropic's words (see `app.api.relay.Dialect`)."""

    def error_response(self, err: GatewayError) -> Response:
        return JSONResponse(
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


async def _parse(request: Request, services: Services) -> tuple[ParsedRequest, Any]:
    services.auth.check_client(_credentials(request))
    body = await read_body(request, services.settings.max_body_bytes)
    payload = json_object(body)
    model = model_of(payload)
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest.wrong_type("stream", "a boolean", stream)
    route = services.dispatcher.route(model)
    return ParsedRequest(model=model, stream=stream, payload=payload, raw=body), route


async def messages(request: Request) -> Response:
    services: Services = request.app.state.services
    try:
        parsed, route = await _parse(request, services)
        headers = forwardable_request_headers(request.scope["headers"])
        translated: Translated | None = None
        try:
            chat = to_openai_chat(parsed.payload, model=route.upstream_model, stream=parsed.stream)
        except InvalidRequest:
            if not services.dispatcher.can_serve(route, Api.MESSAGES):
                raise
        else:
            answer = partial(_as_messages, model=parsed.model, stream=parsed.stream)
            translated = Translated(
                Call(route, "/v1/chat/completions", chat, parsed.stream, _dump(chat),
                     headers | _JSON, api=Api.CHAT),
                answer,
            )  # fmt: skip
        call = Call(
            route,
            MESSAGES_PATH,
            parsed.payload,
            parsed.stream,
            upstream_body(parsed, route),
            headers,
            api=Api.MESSAGES,
            translated=translated,
        )
    except GatewayError as err:
        return ANTHROPIC.error_response(err)
    return RelayResponse(services.dispatcher, call, dialect=ANTHROPIC)


async def count_tokens(request: Request) -> Response:
    services: Services = request.app.state.services
    try:
        parsed, route = await _parse(request, services)
        headers = forwardable_request_headers(request.scope["headers"])
        translated: Translated | None = None
        try:
            tokenize = tokenize_request(parsed.payload, model=route.upstream_model)
        except InvalidRequest:
            if not services.dispatcher.can_serve(route, Api.MESSAGES):
                raise
        else:
            translated = Translated(
                Call(route, "/tokenize", tokenize, False, _dump(tokenize), headers | _JSON,
                     api=Api.TOKENIZE),
                as_token_count,
            )  # fmt: skip
        call = Call(
            route,
            COUNT_TOKENS_PATH,
            parsed.payload,
            False,
            upstream_body(parsed, route),
            headers,
            api=Api.MESSAGES,
            translated=translated,
        )
    except GatewayError as err:
        return ANTHROPIC.error_response(err)
    return RelayResponse(services.dispatcher, call, dialect=ANTHROPIC)


async def _as_messages(response: Any, within_s: float, *, model: str, stream: bool) -> Any:
    return await as_messages(response, model=model, stream=stream, within_s=within_s)


def _dump(payload: dict[str, Any]) -> bytes:
    return dump_json(payload)


routes: list[BaseRoute] = [
    Route(MESSAGES_PATH, messages, methods=["POST"], name="messages"),
    Route(COUNT_TOKENS_PATH, count_tokens, methods=["POST"], name="messages_count_tokens"),
]
