"""The OpenAI-compatible surface: the routes of `app.api.protocol.PROXIED` (chat,
completions, embeddings, responses, vLLM's pooling and tokenizer routes, audio, images),
the follow-ups of a stored response (`/v1/responses/{id}`), and `/v1/models`.

The proxied routes are plain Starlette routes: they take the raw body, parse only what
routing needs and hand the rest to `RelayResponse`; no pydantic model of the whole body,
no per-request dependency solving.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.api.deps import plane_of
from app.api.middleware import context_of, too_large
from app.api.model_cards import card, listed
from app.api.protocol import PROXIED, Endpoint, ParsedRequest, parse_request
from app.api.relay import RelayResponse
from app.errors import EndpointNotServed, MethodNotAllowed, ModelNotFound, UnsupportedMediaType
from app.jsonwire import json_bytes
from app.keys.ring import ClientKey
from app.routing.exchange import Call
from app.routing.patience import MAX_WAIT_HEADER, parse_max_wait
from app.routing.plane import RoutingPlane
from app.routing.registry import Route as RoutedModel
from app.routing.shaping import upstream_body, upstream_headers, with_stream_usage
from app.services import Services
from app.settings.endpoints import Api


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body: refused before reading when its declared length is over `limit`, or
    when it is compressed (415: nothing in the stack inflates request bodies, and relaying
    one would hide its size from `limit`). While it is read, `BodyGuard` bounds its size
    and the time it may take."""
    headers = request.headers
    encoding = headers.get("content-encoding", "identity")
    return await _read_body(request, limit, encoding, headers.get("content-length"))


async def _read_body(request: Request, limit: int, encoding: str, declared: str | None) -> bytes:
    encoding = encoding.strip().lower()
    if encoding not in ("", "identity"):
        raise UnsupportedMediaType(
            f"Compressed request bodies are not accepted (content-encoding: {encoding[:40]}); "
            "send the body uncompressed."
        )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    return await _whole_body(request)


async def _whole_body(request: Request) -> bytes:
    """The body as Starlette's `Request.body()` reads it (`ClientDisconnect` when the
    client leaves first), from `receive()` directly: no async generator, and no join for
    a body that came in one message, the usual case. Read once: nothing reads it again."""
    chunks: list[bytes] = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            if not chunks:
                return body
            chunks.append(body)
            return b"".join(chunks)
        if body:
            chunks.append(body)


_MAX_WAIT: Final = MAX_WAIT_HEADER.encode()
# The headers a proxied request's handler reads (`_proxy`), found in one pass.
_READ: Final = frozenset(
    {b"authorization", b"content-encoding", b"content-length", b"content-type", _MAX_WAIT}
)


def _headers_read(raw: list[tuple[bytes, bytes]]) -> dict[bytes, str]:
    """The first value of each of `_READ` in an ASGI scope's headers (names lower-case
    there), as Starlette's `Headers.get` reads them: one pass instead of one a header."""
    found: dict[bytes, str] = {}
    for name, value in raw:
        if name in _READ and name not in found:
            found[name] = value.decode("latin-1")
    return found


def client_key(request: Request, authorization: str | None) -> ClientKey:
    """The caller's key (401 without a known one), named in the request's access line."""
    key = plane_of(request).auth.check_client(authorization)
    context_of(request.scope).key = key.name
    return key


def _proxy(endpoint: Endpoint) -> Route:
    async def handle(request: Request) -> Response:
        services: Services = request.app.state.services
        plane = plane_of(request)  # one plane for the whole request, across the body's read
        raw_headers = request.scope["headers"]
        headers = _headers_read(raw_headers)
        key = client_key(request, headers.get(b"authorization"))
        limit = services.settings.max_body_bytes
        encoding = headers.get(b"content-encoding", "identity")
        body = await _read_body(request, limit, encoding, headers.get(b"content-length"))
        parsed = parse_request(body, endpoint, headers.get(b"content-type", ""))
        route = plane.dispatcher.route(parsed.model)
        key.check_model(route.name)
        payload, usage_added = with_stream_usage(
            parsed.payload, stream=parsed.stream, api=endpoint.api, counts_tokens=key.counts_tokens
        )
        # Read before the key counts the request: a bad value is a 400 for any model.
        wait_s = parse_max_wait(headers.get(_MAX_WAIT))
        call = Call(
            route,
            endpoint.path,
            payload,
            parsed.stream,
            upstream_body(parsed, route),
            upstream_headers(raw_headers),
            api=endpoint.api,
            content_type=parsed.content_type,
            priority=key.priority,
            max_wait_s=wait_s,
            key=key.admit(),
            usage_added=usage_added,
        )
        stored = continued(plane, parsed, route, key) if endpoint.api is Api.RESPONSES else None
        return RelayResponse(plane.dispatcher, call, stored=stored, relays=services.relays)

    return Route(endpoint.path, handle, methods=["POST"], name=f"{endpoint.name}:{endpoint.path}")


def continued(
    plane: RoutingPlane, parsed: ParsedRequest, route: RoutedModel, key: ClientKey
) -> tuple[str, str] | None:
    """(previous response id, entry) for a create that continues a response made through
    the gateway (`previous_response_id`): it must reach the entry (replica, chain entry)
    holding it; None: routed as usual."""
    previous = parsed.payload.get("previous_response_id")
    if not isinstance(previous, str):
        return None
    entry = plane.dispatcher.pinned_entry(route, previous, key.name)
    return None if entry is None else (previous, entry)


async def stored_response(request: Request) -> Response:
    """`GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, `GET
    /v1/responses/{id}/input_items`: relayed to the entry that created the response
    (`app.routing.responses`); 404 `response_not_found` for an id it did not create. For a
    local backend (vLLM) DELETE and input_items are answered here (`not_offered`)."""
    services: Services = request.app.state.services
    plane = plane_of(request)
    key = client_key(request, request.headers.get("authorization"))
    context_of(request.scope).endpoint = "responses_stored"
    response_id = request.path_params["response_id"]
    stored = plane.dispatcher.stored_response(response_id, key.name)
    key.check_model(stored.route.name)
    if plane.dispatcher.is_local(stored.entry):
        not_offered(request.method, request.url.path, stored.entry)
    body = await read_body(request, services.settings.max_body_bytes)
    query = request.url.query
    path = request.url.path + (f"?{query}" if query else "")
    # Read before the key counts the request: a bad value is a 400 for any model.
    wait_s = parse_max_wait(request.headers.get(MAX_WAIT_HEADER))
    call = Call(
        stored.route,
        path,
        {},
        request.query_params.get("stream") == "true",
        body,
        upstream_headers(request.scope["headers"]),
        api=Api.RESPONSES,
        method=request.method,
        priority=key.priority,
        max_wait_s=wait_s,
        key=key.admit(),
    )
    return RelayResponse(
        plane.dispatcher, call, stored=(response_id, stored.entry), relays=services.relays
    )


def not_offered(method: str, path: str, backend: str) -> None:
    """vLLM 0.33 has no `DELETE /v1/responses/{id}` and no `.../input_items`
    (vllm/entrypoints/openai/responses/api_router.py): refused here, not relayed, for a
    response a local backend made (a cloud provider's are relayed: OpenAI has both)."""
    if method == "DELETE":
        raise MethodNotAllowed(
            f"The response was made by backend '{backend}', a vLLM server: vLLM does not "
            "offer deleting a stored response (it keeps it in memory until it restarts). "
            "It offers GET /v1/responses/{id} and POST /v1/responses/{id}/cancel.",
            headers={"allow": "GET"},
        )
    if path.endswith("/input_items"):
        raise EndpointNotServed(
            f"The response was made by backend '{backend}', a vLLM server: vLLM does not "
            "offer GET /v1/responses/{id}/input_items. GET /v1/responses/{id} returns the "
            "response."
        )


async def list_models(request: Request) -> Response:
    """`GET /v1/models`: the names the key may use, each with its `status`
    (`app.api.model_cards`)."""
    services: Services = request.app.state.services
    key = client_key(request, request.headers.get("authorization"))
    body = json_bytes(listed(services, plane_of(request).registry, key.allows))
    return Response(body, media_type="application/json")


async def retrieve_model(request: Request) -> Response:
    """`GET /v1/models/{id}`: an id or alias, as `client.models.retrieve(id)` expects; 404
    `model_not_found` for any other name. Ids may hold slashes (`Qwen/Qwen3-8B`)."""
    services: Services = request.app.state.services
    key = client_key(request, request.headers.get("authorization"))
    name = request.path_params["model"]
    entry = next((e for e in plane_of(request).registry.entries if e.id == name), None)
    if entry is None:
        raise ModelNotFound(name)
    key.check_model(name)
    body = json_bytes(card(services, entry))
    return Response(body, media_type="application/json")


_RESPONSE: Final = "/v1/responses/{response_id}"
routes: list[BaseRoute] = [
    *(_proxy(endpoint) for endpoint in PROXIED),
    Route(_RESPONSE, stored_response, methods=["GET", "DELETE"], name="response"),
    Route(_RESPONSE + "/cancel", stored_response, methods=["POST"], name="response_cancel"),
    Route(_RESPONSE + "/input_items", stored_response, methods=["GET"], name="response_items"),
    Route("/v1/models", list_models, methods=["GET"], name="models"),
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"], name="model"),
]
