"""The OpenAI-compatible surface: /v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/models.

The proxied routes are plain Starlette routes: they take the raw body, parse only what
routing needs and hand the rest to `RelayResponse`; no pydantic model of the whole body,
no per-request dependency solving.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.api.protocol import CHAT, COMPLETIONS, EMBEDDINGS, Endpoint, parse_request, upstream_body
from app.api.relay import RelayResponse
from app.api.views import model_list, model_view
from app.errors import ModelNotFound, PayloadTooLarge
from app.routing.exchange import Call
from app.services import Services
from app.upstreams.http import forwardable_request_headers


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than `limit` bytes (checked before reading when declared)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than this gateway accepts ({limit} bytes; "
        "see MICROSCHEDULER_MAX_BODY_BYTES)."
    )


def _proxy(endpoint: Endpoint) -> Route:
    async def handle(request: Request) -> Response:
        services: Services = request.app.state.services
        services.auth.check_client(request.headers.get("authorization"))
        parsed = parse_request(await read_body(request, services.settings.max_body_bytes), endpoint)
        route = services.dispatcher.route(parsed.model)
        call = Call(
            route,
            endpoint.path,
            parsed.payload,
            parsed.stream,
            upstream_body(parsed, route),
            forwardable_request_headers(request.scope["headers"]),
        )
        return RelayResponse(services.dispatcher, call)

    return Route(endpoint.path, handle, methods=["POST"], name=endpoint.name)


async def list_models(request: Request) -> Response:
    services: Services = request.app.state.services
    services.auth.check_client(request.headers.get("authorization"))
    body = json.dumps(model_list(services.registry, services.started_at)).encode()
    return Response(body, media_type="application/json")


async def retrieve_model(request: Request) -> Response:
    """`GET /v1/models/{id}`: an id or alias, as `client.models.retrieve(id)` expects; 404
    `model_not_found` for any other name. Ids may hold slashes (`Qwen/Qwen3-8B`)."""
    services: Services = request.app.state.services
    services.auth.check_client(request.headers.get("authorization"))
    name = request.path_params["model"]
    entry = next((e for e in services.registry.entries if e.id == name), None)
    if entry is None:
        raise ModelNotFound(name)
    body = json.dumps(model_view(entry, services.started_at)).encode()
    return Response(body, media_type="application/json")


routes: list[BaseRoute] = [
    _proxy(CHAT),
    _proxy(COMPLETIONS),
    _proxy(EMBEDDINGS),
    Route("/v1/models", list_models, methods=["GET"], name="models"),
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"], name="model"),
]
