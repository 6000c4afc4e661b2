"""The fake vLLM's route table: which routes exist (by task and flags, as vLLM 0.33
registers them), its ``/openapi.json``, the 404/405 for the rest, and the checks vLLM makes
before a handler runs (the API key, the JSON content type).

vLLM 0.33 registers routers by the model's supported tasks
(``vllm/entrypoints/launchers/api_server/routers.py`` ``register_api_routers``): the
generate routers (``vllm/entrypoints/generate/api_router.py``) only for ``generate``, the
speech-to-text ones only for ``transcription``
(``vllm/entrypoints/speech_to_text/factories.py``), the pooling ones by pooling task
(``vllm/entrypoints/pooling/factories.py`` ``register_pooling_api_routers``: ``/pooling``
for any, ``/classify`` for ``classify``, ``/v1/embeddings`` for ``embed``, ``/score`` and
``/rerank`` for ``embed`` or a ``classify`` model with ``num_labels == 1``,
``vllm/entrypoints/pooling/utils.py`` ``enable_scoring_api``). ``tests/fixtures/
vllm_0_33_routes.json`` is that table, extracted from vLLM's source; a test checks the fake
against it.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from app.sim.text import ApiError, dumps

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# vLLM's tasks the fake can serve (``vllm/tasks.py`` ``SupportedTask``), one per server.
TASKS = ("generate", "embed", "classify", "transcription")

# vllm/entrypoints/serve/middleware/authenticate.py GUARDED_PREFIX
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
_UNAUTHORIZED = b'{"error":"Unauthorized"}'
_NOT_FOUND = b'{"detail":"Not Found"}'
_NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'

# vllm/entrypoints/serve/utils/api_utils.py validate_json_request, its RequestValidationError
# rendered by vllm/entrypoints/serve/exception_handling/handlers/validation.py (the error
# is a string, not a dict, so `param` stays null).
UNSUPPORTED_MEDIA_TYPE = ApiError(
    400,
    "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
    "Bad Request",
)


def is_json(request: web.Request) -> bool:
    """vLLM's ``validate_json_request``: the media type, lower-cased, before any ``;``."""
    content_type = request.headers.get("content-type", "").lower()
    return content_type.split(";", maxsplit=1)[0] == "application/json"


def _parsed_first(request: web.Request) -> bool:
    """FastAPI reads a JSON body before the route's dependencies run when the request has
    no content type or a JSON one (``application/json``, ``application/*+json``), so
    there a body that is not JSON fails as ``json_invalid`` before the content-type check."""
    content_type = request.headers.get("content-type")
    if content_type is None:
        return True
    media = content_type.split(";", maxsplit=1)[0].strip().lower()
    return media.startswith("application/") and (
        media == "application/json" or media.endswith("+json")
    )


def _json_only(handler: Handler) -> Handler:
    """The route behind vLLM's ``Depends(validate_json_request)``."""

    async def check(request: web.Request) -> web.StreamResponse:
        if not is_json(request):
            if _parsed_first(request):
                raw = await request.read()
                try:
                    if raw:
                        json.loads(raw)
                except ValueError:
                    return await handler(request)  # its json_invalid error, as vLLM's
            err = UNSUPPORTED_MEDIA_TYPE
            return web.Response(status=err.status, body=err.body(), content_type="application/json")
        return await handler(request)

    return check


def api_key_middleware(keys: list[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """vLLM's ``AuthenticationMiddleware`` (``vllm/entrypoints/serve/middleware/
    authenticate.py``): paths under ``GUARDED_PREFIX`` need ``Authorization: Bearer KEY``
    (the scheme case-insensitive), any method but OPTIONS; a 401 ``{"error":
    "Unauthorized"}`` otherwise. Every other path (``/health``, ``/tokenize``, ``/pooling``,
    ``/classify``, ``/score``, ``/rerank``, ``/metrics``, the dev endpoints) is open."""
    hashes = [hashlib.sha256(k.encode()).digest() for k in keys]

    def verify(header: str | None) -> bool:
        if not header:
            return False
        scheme, _, param = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(param.encode()).digest()
        match = False
        for known in hashes:
            match |= secrets.compare_digest(digest, known)
        return match

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.method != "OPTIONS"
            and request.path.startswith(GUARDED_PREFIX)
            and not verify(request.headers.get("Authorization"))
        ):
            return web.Response(status=401, body=_UNAUTHORIZED, content_type="application/json")
        return await handler(request)

    return authenticate


@dataclass(frozen=True)
class _Entry:
    method: str
    path: str
    pattern: re.Pattern[str]
    in_schema: bool
    json_only: bool


def _pattern(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")


class RouteTable:
    """Registers the fake's routes on an aiohttp app and remembers them, for
    ``/openapi.json`` and for telling a wrong method (405) from a wrong path (404), as
    Starlette's router does (FastAPI's default body: vLLM's own handler is registered for
    ``fastapi.HTTPException`` only, and the router raises Starlette's)."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._entries: list[_Entry] = []

    def add(
        self,
        method: str,
        path: str,
        handler: Handler,
        *,
        json_only: bool = False,
        in_schema: bool = True,
    ) -> None:
        """One route; ``json_only`` for the routes vLLM gives ``Depends(
        validate_json_request)``; ``in_schema`` False for routes outside ``/openapi.json``
        (``/metrics``, a mount in vLLM; the fake's test controls)."""
        self._app.router.add_route(method, path, _json_only(handler) if json_only else handler)
        self._entries.append(_Entry(method, path, _pattern(path), in_schema, json_only))

    def routes(self) -> list[tuple[str, str, bool]]:
        """``(method, path, json_only)`` of every route, in registration order."""
        return [(e.method, e.path, e.json_only) for e in self._entries]

    def openapi(self, title: str = "FastAPI", version: str = "0.1.0") -> bytes:
        """The routes in an OpenAPI document shaped like FastAPI's (paths, methods,
        operation ids); request and response schemas are left out."""
        paths: dict[str, dict[str, object]] = {}
        for entry in self._entries:
            if not entry.in_schema:
                continue
            name = re.sub(r"\W", "_", entry.path.strip("/")) or "root"
            operation_id = f"{name}_{entry.path.replace('/', '_')}_{entry.method.lower()}"
            paths.setdefault(entry.path, {})[entry.method.lower()] = {
                "summary": name.replace("_", " ").title(),
                "operationId": re.sub(r"\W", "_", operation_id),
                "responses": {"200": {"description": "Successful Response"}},
            }
        doc = {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths}
        return dumps(doc)

    def allowed(self, path: str) -> list[str]:
        """The methods registered for ``path`` (empty: no such path)."""
        methods: list[str] = []
        for entry in self._entries:
            if entry.pattern.match(path) and entry.method not in methods:
                methods.append(entry.method)
                if entry.method == "GET":
                    methods.append("HEAD")
        return methods

    async def fallback(self, request: web.Request) -> web.StreamResponse:
        """No route for this method and path: 405 with ``Allow`` when the path exists
        under another method, else 404."""
        allowed = self.allowed(request.path)
        if allowed:
            return web.Response(
                status=405,
                body=_NOT_ALLOWED,
                content_type="application/json",
                headers={"Allow": ", ".join(allowed)},
            )
        return web.Response(status=404, body=_NOT_FOUND, content_type="application/json")
