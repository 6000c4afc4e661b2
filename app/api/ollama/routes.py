"""Ollama's API on the gateway, so Ollama's clients (Open WebUI, `ollama` for Python...)
work unmodified: `GET /api/version`, `GET /api/tags`, `GET /api/ps`, `POST /api/show`,
`POST /api/chat`, `POST /api/generate`, `POST /api/embed`.

The model calls go through the same data plane as `/v1/chat/completions`
(`RelayResponse` and the dispatcher: keys, limits, queueing, wake, fallback, metrics,
activity, usage): the request is a `Call` in `Api.OLLAMA`, which no backend serves, with
its chat or embeddings translation and the way back for the answer (a whole answer
translated, a stream as NDJSON). This module only reads the request and picks which
translation; the translated call is shaped in `app.routing.translation` (Ollama's words
in and out are `app.ollama`'s): nothing here writes upstream bytes. Every error the
gateway writes here is Ollama's `{"error": "..."}` with the status.

The client's key is the gateway's, as `Authorization: Bearer` (Ollama's clients send
headers as given). `keep_alive` is `app.api.ollama.keep_alive`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.api.deps import plane_of
from app.api.handlers import JSONBody
from app.api.middleware import context_of
from app.api.model_cards import max_model_len_of
from app.api.ollama import keep_alive, listing
from app.api.openai import client_key, read_body
from app.api.protocol import ParsedRequest, json_object
from app.api.relay import RelayResponse
from app.errors import GatewayError, InvalidRequest, ModelNotFound
from app.ollama.answers import error_message
from app.ollama.stream import error_line, line, request_clock
from app.ollama.wire import VERSION, Json, error_body, keep_alive_s, timestamp, untagged
from app.routing.exchange import Call
from app.routing.patience import MAX_WAIT_HEADER, parse_max_wait
from app.routing.plane import RoutingPlane
from app.routing.registry import ModelEntry, Registry
from app.routing.shaping import upstream_headers
from app.routing.translation import ollama_chat_as_chat, ollama_embed_as_embeddings
from app.services import Services
from app.settings.endpoints import Api

logger = logging.getLogger(__name__)

CHAT_PATH: Final = "/api/chat"
GENERATE_PATH: Final = "/api/generate"
EMBED_PATH: Final = "/api/embed"


class OllamaDialect:
    """What the gateway says, in Ollama's words (see `app.api.relay.Dialect`): errors as
    `{"error": "..."}`, in a stream as one such line; while a backend wakes, a held
    stream gets lines with no content (`done: false`), which Ollama's clients skip over."""

    stream_type = b"application/x-ndjson"

    def __init__(self, model: str, *, generate: bool) -> None:
        self._model = model
        self._generate = generate

    def error_response(self, err: GatewayError) -> Response:
        return ollama_error(err)

    def stream_error(self, err: GatewayError, last_chunk: bytes) -> bytes:
        ended = not last_chunk or last_chunk.endswith(b"\n")
        return (b"" if ended else b"\n") + error_line(err.message)

    def upstream_stream_error(self, status: int, body: bytes) -> bytes:
        return error_line(error_message(status, body))

    def keepalive(self, backend: str, waited_s: float, detail: str | None) -> bytes:
        piece: Json = {"model": self._model, "created_at": timestamp()}
        if self._generate:
            piece["response"] = ""
        else:
            piece["message"] = {"role": "assistant", "content": ""}
        piece["done"] = False
        return line(piece)


def ollama_error(err: GatewayError) -> Response:
    return JSONBody(error_body(err.message), status_code=err.status, headers=err.headers or None)


def _json(payload: Json) -> Response:
    return JSONBody(payload)


def _guarded(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except GatewayError as err:
            return ollama_error(err)

    return guarded


# -- listings ----------------------------------------------------------------------------


async def version(request: Request) -> Response:
    return _json({"version": VERSION})


async def tags(request: Request) -> Response:
    services: Services = request.app.state.services
    key = client_key(request, request.headers.get("authorization"))
    entries = plane_of(request).registry.entries
    return _json(listing.tags(entries, services.backends, allowed=key.allows,
                              modified_at=services.started_at))  # fmt: skip


async def ps(request: Request) -> Response:
    services: Services = request.app.state.services
    key = client_key(request, request.headers.get("authorization"))
    return _json(
        listing.ps(
            plane_of(request).registry.entries,
            services.backends,
            allowed=key.allows,
            max_len=lambda entry: max_model_len_of(entry, services.backends),
        )
    )


async def show(request: Request) -> Response:
    services: Services = request.app.state.services
    key = client_key(request, request.headers.get("authorization"))
    payload = json_object(await read_body(request, services.settings.max_body_bytes))
    name = payload.get("model") or payload.get("name")  # `name`: deprecated, still sent
    if not isinstance(name, str) or not name:
        raise InvalidRequest("model is required", param="model")
    registry = plane_of(request).registry
    entry = _entry(registry, untagged(name, partial(_listed, registry)))
    key.check_model(entry.id)
    backend = services.backends.get(entry.backend)
    max_len = max_model_len_of(entry, services.backends)
    return _json(listing.show(entry, backend, max_len=max_len, modified_at=services.started_at))


def _listed(registry: Registry, name: str) -> bool:
    return any(e.id == name for e in registry.entries)


def _entry(registry: Registry, name: str) -> ModelEntry:
    entry = next((e for e in registry.entries if e.id == name), None)
    if entry is None:
        raise ModelNotFound(name)
    return entry


# -- model calls -------------------------------------------------------------------------


async def chat(request: Request) -> Response:
    return await _model_call(request, CHAT_PATH)


async def generate(request: Request) -> Response:
    return await _model_call(request, GENERATE_PATH)


async def embed(request: Request) -> Response:
    return await _model_call(request, EMBED_PATH)


async def _model_call(request: Request, path: str) -> Response:
    services: Services = request.app.state.services
    plane = plane_of(request)  # one plane for the whole request, across the body's read
    key = client_key(request, request.headers.get("authorization"))
    raw = await read_body(request, services.settings.max_body_bytes)
    payload = json_object(raw)
    name = payload.get("model")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("model is required", param="model")
    model = untagged(name, partial(_routable, plane))
    route = plane.dispatcher.route(model)
    key.check_model(route.name)
    stay = keep_alive_s(payload.get("keep_alive"))
    stream = path != EMBED_PATH and _stream_of(payload)
    if path == GENERATE_PATH and not payload.get("prompt") and not payload.get("images"):
        # An empty prompt loads the model, with `keep_alive: 0` unloads it (api.md:432-482).
        return await keep_alive.load_or_unload(request, services, model, name, stay)
    if path == CHAT_PATH and not payload.get("messages"):  # likewise a chat without messages
        return await keep_alive.load_or_unload(request, services, model, name, stay, chat=True)
    entry = next((e for e in plane.registry.entries if e.id == route.name), None)
    max_len = None if entry is None else max_model_len_of(entry, services.backends)
    ctx = context_of(request.scope)
    clock = request_clock(ctx.started, lambda: ctx.waits.total_s)
    headers = upstream_headers(request.scope["headers"])
    read = ParsedRequest(model=name, stream=stream, payload=payload, raw=raw)  # answered as `name`
    if path == EMBED_PATH:
        translated = ollama_embed_as_embeddings(read, route, headers, clock=clock)
    else:
        translated = ollama_chat_as_chat(read, route, headers, generate=path == GENERATE_PATH,
                                         max_model_len=max_len, clock=clock)  # fmt: skip
    # Read before the key counts the request: a bad value is a 400 for any model.
    wait_s = parse_max_wait(request.headers.get(MAX_WAIT_HEADER))
    call = Call(
        route,
        path,
        payload,
        stream,
        raw,
        headers,
        api=Api.OLLAMA,
        translated=translated,
        priority=key.priority,
        max_wait_s=wait_s,
        key=key.admit(),
    )
    dialect = OllamaDialect(name, generate=path == GENERATE_PATH)
    relay = RelayResponse(plane.dispatcher, call, dialect=dialect, relays=services.relays)
    return keep_alive.after_answer(request, services, model, stay, relay)


def _routable(plane: RoutingPlane, name: str) -> bool:
    try:
        plane.dispatcher.route(name)
    except ModelNotFound:
        return False
    return True


def _stream_of(payload: Json) -> bool:
    """Ollama streams unless told not to (`stream` absent is true, api.md:30-32)."""
    value = payload.get("stream", True)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise InvalidRequest.wrong_type("stream", "a boolean", value)
    return value


def _route(
    path: str, handler: Callable[[Request], Awaitable[Response]], method: str, name: str
) -> Route:
    return Route(path, _guarded(handler), methods=[method], name=name)


routes: list[BaseRoute] = [
    _route("/api/version", version, "GET", "ollama_version"),
    _route("/api/tags", tags, "GET", "ollama_tags"),
    _route("/api/ps", ps, "GET", "ollama_ps"),
    _route("/api/show", show, "POST", "ollama_show"),
    _route(CHAT_PATH, chat, "POST", "ollama_chat"),
    _route(GENERATE_PATH, generate, "POST", "ollama_generate"),
    _route(EMBED_PATH, embed, "POST", "ollama_embed"),
]
