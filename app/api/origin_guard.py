"""`OriginGuard`: browser pages of other sites cannot drive the gateway. Every route,
the fast path's too, sits behind it (`app.api.fastpath.GatewayApp`); the decisions are
`app.access.origins.OriginPolicy`'s (pure), this module only reads headers and writes the
refusal, the CORS headers and the preflight answers."""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.access.origins import OriginPolicy, origin_refused
from app.api.handlers import error_response
from app.api.protocol import ENDPOINT_BY_PATH
from app.errors import PermissionDenied

# The model APIs outside /v1/: vLLM's names (/rerank, /score, /tokenize...).
_MODEL_PATHS: Final = frozenset(path for path in ENDPOINT_BY_PATH if not path.startswith("/v1/"))
_CORS_METHODS: Final = b"GET, POST, DELETE, OPTIONS"
_CORS_HEADERS: Final = b"authorization, content-type, x-api-key, anthropic-version, x-request-id"
_CORS_EXPOSED: Final = b"x-request-id, retry-after"
_TOKEN_LIST: Final = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_, ")


def is_model_path(path: str) -> bool:
    """The model APIs (`/v1/...` and vLLM's names): a client key protects them when set."""
    return path.startswith("/v1/") or path in _MODEL_PATHS


class OriginGuard:
    """Every route, the fast path's too: a request that carries `Origin` (a browser page
    sent it) is admitted when that origin is listed (`MICROSCHEDULER_ALLOWED_ORIGINS`: it
    gets CORS headers, and its preflights are answered) or is the gateway's own (scheme
    and `Host` of the request, where `Host` names the gateway unless the route needs a
    key: `OriginPolicy`); on the model APIs, when client keys are configured, also any
    other (a browser sends no key on a page's behalf; no CORS headers). Others get 403
    `permission_denied`. A request without `Origin` costs one scan of its headers."""

    def __init__(
        self, app: ASGIApp, *, policy: OriginPolicy, client_keys: bool, admin_key: bool
    ) -> None:
        self.app = app
        self.policy = policy
        self.client_keys = client_keys
        self.admin_key = admin_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") if scope["type"] == "http" else None
        if origin is None:
            await self.app(scope, receive, send)
            return
        text = origin.decode("latin-1")
        if self.policy.listed(text):
            if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
                await _preflight(origin, _header(scope, b"access-control-request-headers"), send)
            else:
                await self.app(scope, receive, _with_cors(origin, send))
            return
        if not self._admitted(scope, text):
            await error_response(PermissionDenied(origin_refused(text)))(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _admitted(self, scope: Scope, origin: str) -> bool:
        if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
            return False  # a preflight: answered for listed origins only
        model = is_model_path(scope["path"])
        if model and self.client_keys:
            return True
        raw_host = _header(scope, b"host")
        host = None if raw_host is None else raw_host.decode("latin-1")
        if not self.policy.same_origin(origin, scope["scheme"], host):
            return False
        keyed = self.admin_key and not model
        return keyed or self.policy.host_trusted(host)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _with_cors(origin: bytes, send: Send) -> Send:
    headers = [
        (b"access-control-allow-origin", origin),
        (b"access-control-expose-headers", _CORS_EXPOSED),
        (b"vary", b"Origin"),
    ]

    async def cors_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *headers]
        await send(message)

    return cors_send


async def _preflight(origin: bytes, requested: bytes | None, send: Send) -> None:
    """A listed origin's preflight: the methods, the usual headers and those it asks for
    (when they are plain header names)."""
    allowed = _CORS_HEADERS
    if requested and len(requested) <= 1024 and set(requested.lower()) <= _TOKEN_LIST:
        allowed += b", " + requested.lower()
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [
                (b"access-control-allow-origin", origin),
                (b"access-control-allow-methods", _CORS_METHODS),
                (b"access-control-allow-headers", allowed),
                (b"access-control-max-age", b"600"),
                (b"vary", b"Origin"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})
