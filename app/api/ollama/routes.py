"""Ollama's API on the gateway, so Ollama's clients (Open WebUI, `ollama` for Python...)
work unmodified: `GET /api/version`, `GET /api/tags`, `GET /api/ps`, `POST /api/show`,
`POST /api/chat`, `POST /api/generate`, `POST /api/embed`.

The model calls go through the same data plane as `/v1/chat/completions`
(`RelayResponse` and the dispatcher: keys, limits, queueing, wake, fallback, metrics,
activity, usage): the request is a `Call` in `Api.OLLAMA`, which no backend serves, with
its chat or embeddings translation (`app.api.ollama.translate`) and the way back for the
answer (a whole answer translated, a stream as NDJSON: `app.api.ollama.stream`). Every
error the gateway writes here is Ollama's `{"error": "..."}` with the status.

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
from app.api.ollama import keep_alive, listing, translate
from app.api.ollama.stream import NdjsonStream, NdjsonTranslator, error_line, line, request_clock
from app.api.ollama.wire import VERSION, Json, error_body, keep_alive_s, timestamp, untagged
from app.api.openai import client_key, read_body
from app.api.protocol import json_object
from app.api.relay import RelayResponse
from app.errors import GatewayError, InvalidRequest, ModelNotFound
from app.jsonwire import json_bytes
from app.routing.exchange import Call, Translated
from app.routing.patience import MAX_WAIT_HEADER, parse_max_wait
from app.routing.plane import RoutingPlane
from app.routing.registry import ModelEntry, Registry
from app.routing.registry import Route as ModelRoute
from app.routing.shaping import upstream_headers
from app.services import Services
from app.settings.endpoints import Api
from app.upstreams.anthropic.bodies import whole_answer
from app.upstreams.http import BufferedResponse, Relayable

logger = logging.getLogger(__name__)

_JSON: Final = {"content-type": "application/json"}
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
        return error_line(translate.error_message(status, body))

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
    return Response(json_bytes(payload), media_type="application/json")


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
    translated = _translated(path, payload, route, name, stream, max_len, clock, headers)
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


Clock = Callable[[], tuple[float, float]]


def _translated(
    path: str,
    payload: Json,
    route: ModelRoute,
    name: str,
    stream: bool,
    max_len: int | None,
    clock: Clock,
    headers: dict[str, str],
) -> Translated:
    upstream = route.upstream_model
    if path == EMBED_PATH:
        body = translate.embed_request(payload, model=upstream)
        call = Call(route, "/v1/embeddings", body, False, json_bytes(body), headers | _JSON,
                    api=Api.EMBEDDINGS)  # fmt: skip
        return Translated(call, partial(_embed_answer, model=name, clock=clock))
    build = translate.generate_request if path == GENERATE_PATH else translate.chat_request
    request = build(payload, model=upstream, stream=stream, max_model_len=max_len)
    call = Call(route, "/v1/chat/completions", request.body, stream, json_bytes(request.body),
                headers | _JSON, api=Api.CHAT)  # fmt: skip
    answer = partial(_chat_answer, model=name, generate=path == GENERATE_PATH, clock=clock,
                     images=request.images)  # fmt: skip
    return Translated(call, answer)


async def _chat_answer(
    response: Relayable, within_s: float, *, model: str, generate: bool, clock: Clock, images: int
) -> Relayable:
    if response.status == 200 and response.is_event_stream:
        return NdjsonStream(response, NdjsonTranslator(model, generate=generate, clock=clock))

    def answer(body: Json) -> Json:
        total, load = clock()
        timing = translate.Timing(total=total, load=load, prompt=0.0)
        return translate.chat_answer(body, model=model, generate=generate, timing=timing)

    return await _whole(response, within_s, answer, _envelope(model, images), "a chat completion")


async def _embed_answer(
    response: Relayable, within_s: float, *, model: str, clock: Clock
) -> Relayable:
    def answer(body: Json) -> Json:
        total, load = clock()
        timing = translate.Timing(total=total, load=load, prompt=0.0)
        return translate.embed_answer(body, model=model, timing=timing)

    return await _whole(response, within_s, answer, _envelope(model, 0), "an embeddings answer")


def _envelope(model: str, images: int) -> Callable[[int, bytes], Json]:
    def envelope(status: int, body: bytes) -> Json:
        message = translate.error_message(status, body)
        if (images and 400 <= status < 500) or (images and status >= 500 and "image" in message):
            message = (
                f"model '{model}' did not take the {images} image(s) of this request (a model "
                f"without vision cannot): {message}"
            )
        return error_body(message)

    return envelope


async def _whole(
    response: Relayable,
    within_s: float,
    answer: Callable[[Json], Json],
    envelope: Callable[[int, bytes], Json],
    what: str,
) -> BufferedResponse:
    return await whole_answer(response, within_s, envelope=envelope, translate=answer,
                              who="the upstream", what=what)  # fmt: skip


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
