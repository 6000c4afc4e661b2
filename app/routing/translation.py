"""A request in another API, for a target that does not serve the client's: the
upstream call and the way back for its answer (`Translated`). Pure: no I/O.

Anthropic's Messages API (`app.api.messages`) reads a request and picks the translation;
what goes on the wire is shaped here, like the rest of a request (`app.routing.shaping`):
- `messages_as_chat`: `POST /v1/messages` as OpenAI's `/v1/chat/completions`
  (`app.anthropic.inbound.to_openai_chat`), its answer, stream or not, translated back
  (`app.upstreams.anthropic.inbound_relay.as_messages`);
- `count_tokens_as_tokenize`: `/v1/messages/count_tokens` as vLLM's `/tokenize` in its chat
  form (`tokenize_request`), answered as `{"input_tokens": N}` (`as_token_count`).
The body is written once here, for the route's upstream model, and sent as JSON; the
client's forwardable headers (`shaping.upstream_headers`) go with it. A request the
translation cannot carry is `InvalidRequest`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Final, Protocol

from app.anthropic.inbound import to_openai_chat, tokenize_request
from app.jsonwire import json_bytes
from app.routing.exchange import Call, Translated
from app.routing.registry import Route
from app.settings.endpoints import Api
from app.upstreams.anthropic.inbound_relay import as_messages, as_token_count
from app.upstreams.http import Relayable

CHAT_PATH: Final = "/v1/chat/completions"
TOKENIZE_PATH: Final = "/tokenize"
_JSON: Final = {"content-type": "application/json"}


class ClientRequest(Protocol):
    """A client's request as read (`app.api.protocol.ParsedRequest`)."""

    @property
    def model(self) -> str: ...

    @property
    def stream(self) -> bool: ...

    @property
    def payload(self) -> dict[str, Any]: ...


# The request as read, its route and the client's forwardable headers -> the translated call.
Translation = Callable[[ClientRequest, Route, dict[str, str]], Translated]


def messages_as_chat(request: ClientRequest, route: Route, headers: dict[str, str]) -> Translated:
    """A Messages request as a chat completion for `route`'s upstream model."""
    chat = to_openai_chat(request.payload, model=route.upstream_model, stream=request.stream)
    call = Call(route, CHAT_PATH, chat, request.stream, json_bytes(chat), headers | _JSON,
                api=Api.CHAT)  # fmt: skip
    return Translated(call, partial(_as_messages, model=request.model, stream=request.stream))


def count_tokens_as_tokenize(
    request: ClientRequest, route: Route, headers: dict[str, str]
) -> Translated:
    """A `count_tokens` request as vLLM's `/tokenize` (never a stream)."""
    tokenize = tokenize_request(request.payload, model=route.upstream_model)
    call = Call(route, TOKENIZE_PATH, tokenize, False, json_bytes(tokenize), headers | _JSON,
                api=Api.TOKENIZE)  # fmt: skip
    return Translated(call, as_token_count)


async def _as_messages(
    response: Relayable, within_s: float, *, model: str, stream: bool
) -> Relayable:
    return await as_messages(response, model=model, stream=stream, within_s=within_s)
