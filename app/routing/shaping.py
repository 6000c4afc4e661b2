"""Request shaping: what of a client's request goes to its upstream. Pure: no I/O.

The API reads a request (its body, its model, its key) and hands it here for what only
the upstream sees: the headers passed on (`upstream_headers`: hop-by-hop ones, the
gateway's credentials and the client's request id dropped, `app.upstreams.http`), the
stream's usage asked for on a key's behalf (`with_stream_usage`, `app.upstreams.usage`),
and the body for the route's own backend (`upstream_body`). A request that goes to a
target in another API (Anthropic's Messages as OpenAI chat or vLLM's `/tokenize`,
Ollama's `/api/*` as chat or embeddings) is shaped next door, in `app.routing.translation`:
its body written once, as JSON, for the route's upstream model, with these headers. So
`app.api` never builds what goes on the wire (`tests/unit/test_layout.py` checks it).
"""

from __future__ import annotations

from typing import Any, Protocol

from app.routing.registry import Route
from app.settings.endpoints import Api
from app.upstreams.http import forwardable_request_headers
from app.upstreams.multipart import boundary_of
from app.upstreams.provider import body_with_model
from app.upstreams.usage import USAGE_OPTION_APIS, asks_usage, with_usage


class ClientBody(Protocol):
    """A client's request body as read (`app.api.protocol.ParsedRequest`)."""

    @property
    def raw(self) -> bytes: ...

    @property
    def payload(self) -> dict[str, Any]: ...

    @property
    def content_type(self) -> str: ...


def upstream_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The client's headers (an ASGI scope's) that its upstream gets."""
    return forwardable_request_headers(headers)


def with_stream_usage(
    payload: dict[str, Any], *, stream: bool, api: Api, counts_tokens: bool
) -> tuple[dict[str, Any], bool]:
    """(`payload`, True) asking for the stream's usage when the key has a limit that
    counts tokens (`counts_tokens`) and the client did not ask; else (`payload`, False)
    unchanged. Only the payload changes here: the body is written once, where it is sent
    (`local_body`, a provider's `body_for`), and the relay strips the event it added
    (`Call.usage_added`)."""
    if not (counts_tokens and stream and api in USAGE_OPTION_APIS) or asks_usage(payload):
        return payload, False
    return with_usage(payload), True


def upstream_body(request: ClientBody, route: Route) -> bytes:
    """The body for the route's backend, as raw bytes: the client's, untouched, unless a
    form names an alias (its `model` field replaced in place). A JSON body is never written
    here: where it is sent, `app.routing.local.local_body` writes it once from the payload
    when anything in it changes (an alias's model, usage asked for, the key's priority, a
    lowered `max_tokens`), and relays these bytes otherwise."""
    if not route.rewrites or boundary_of(request.content_type) is None:
        return request.raw
    return body_with_model(request.payload, request.raw, request.content_type, route.upstream_model)
