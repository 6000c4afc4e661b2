"""A request in another API, for a target that does not serve the client's: the
upstream call and the way back for its answer (`Translated`). Pure: no I/O.

The API reads a request and picks the translation; what goes on the wire is shaped here,
like the rest of a request (`app.routing.shaping`). Anthropic's Messages API
(`app.api.messages`):
- `messages_as_chat`: `POST /v1/messages` as OpenAI's `/v1/chat/completions`
  (`app.anthropic.inbound.to_openai_chat`), its answer, stream or not, translated back
  (`app.upstreams.anthropic.inbound_relay.as_messages`);
- `count_tokens_as_tokenize`: `/v1/messages/count_tokens` as vLLM's `/tokenize` in its chat
  form (`tokenize_request`), answered as `{"input_tokens": N}` (`as_token_count`).
Ollama's API (`app.api.ollama`), which no backend serves:
- `ollama_chat_as_chat`: `POST /api/chat` or `/api/generate` as `/v1/chat/completions`
  (`app.ollama.requests`), its answer, a stream as NDJSON or whole, translated back
  (`app.ollama.relayed.chat_answer`);
- `ollama_embed_as_embeddings`: `POST /api/embed` as `/v1/embeddings`
  (`app.ollama.relayed.embed_answer`).
The body is written once here, for the route's upstream model, and sent as JSON; the
client's forwardable headers (`shaping.upstream_headers`) go with it. The answer is named
as the client asked (`ClientRequest.model`). A request the translation cannot carry is
`InvalidRequest`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Final, Protocol

from app.anthropic.inbound import to_openai_chat, tokenize_request
from app.jsonwire import json_bytes
from app.ollama.relayed import Clock, chat_answer, embed_answer
from app.ollama.requests import chat_request, embed_request, generate_request
from app.routing.exchange import Call, Translated
from app.routing.registry import Route
from app.settings.endpoints import Api
from app.upstreams.anthropic.inbound_relay import as_messages, as_token_count
from app.upstreams.http import Relayable

CHAT_PATH: Final = "/v1/chat/completions"
EMBEDDINGS_PATH: Final = "/v1/embeddings"
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
    call = _json_call(route, CHAT_PATH, chat, request.stream, headers, Api.CHAT)
    return Translated(call, partial(_as_messages, model=request.model, stream=request.stream))


def count_tokens_as_tokenize(
    request: ClientRequest, route: Route, headers: dict[str, str]
) -> Translated:
    """A `count_tokens` request as vLLM's `/tokenize` in its chat form (never a stream;
    `TokenizeChatRequest`, vllm/entrypoints/serve/tokenize/protocol.py)."""
    tokenize = tokenize_request(request.payload, model=route.upstream_model)
    call = _json_call(route, TOKENIZE_PATH, tokenize, False, headers, Api.TOKENIZE)
    return Translated(call, as_token_count)


def ollama_chat_as_chat(
    request: ClientRequest,
    route: Route,
    headers: dict[str, str],
    *,
    generate: bool,
    max_model_len: int | None,
    clock: Clock,
) -> Translated:
    """Ollama's `/api/chat` (`/api/generate` when `generate`) as a chat completion for
    `route`'s upstream model; `options.num_ctx` is checked against `max_model_len` (the
    model's context, when known), and the durations of the answer read from `clock`."""
    build = generate_request if generate else chat_request
    chat = build(request.payload, model=route.upstream_model, stream=request.stream,
                 max_model_len=max_model_len)  # fmt: skip
    call = _json_call(route, CHAT_PATH, chat.body, request.stream, headers, Api.CHAT)
    answer = partial(chat_answer, model=request.model, generate=generate, clock=clock,
                     images=chat.images)  # fmt: skip
    return Translated(call, answer)


def ollama_embed_as_embeddings(
    request: ClientRequest, route: Route, headers: dict[str, str], *, clock: Clock
) -> Translated:
    """Ollama's `/api/embed` as `/v1/embeddings` for `route`'s upstream model (never a
    stream)."""
    embed = embed_request(request.payload, model=route.upstream_model)
    call = _json_call(route, EMBEDDINGS_PATH, embed, False, headers, Api.EMBEDDINGS)
    return Translated(call, partial(embed_answer, model=request.model, clock=clock))


def _json_call(
    route: Route,
    path: str,
    payload: dict[str, Any],
    stream: bool,
    headers: dict[str, str],
    api: Api,
) -> Call:
    """The translated call: `payload` written once as its JSON body, labelled JSON."""
    return Call(route, path, payload, stream, json_bytes(payload), headers | _JSON, api=api)


async def _as_messages(
    response: Relayable, within_s: float, *, model: str, stream: bool
) -> Relayable:
    return await as_messages(response, model=model, stream=stream, within_s=within_s)
