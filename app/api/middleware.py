"""Pure ASGI middleware: request id, per-request metrics and the access log line; the
guard on every request body (size, time, closing a connection whose body was not read);
and the guard on where a browser's request comes from (`Origin`, and CORS for the origins
listed in `MICROSCHEDULER_ALLOWED_ORIGINS`).

Each request gets a `RequestContext` in its scope; the relay fills in what only it knows
(the configured model name, the backend, a client that went away), and this middleware
records it once the response is over, whatever path the request took.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import logs
from app.api.handlers import error_response
from app.api.protocol import ENDPOINT_BY_PATH
from app.errors import PayloadTooLarge, PermissionDenied, RequestTimeout
from app.metrics import Metrics
from app.origins import OriginPolicy, origin_refused

CONTEXT_KEY: Final = "microscheduler.context"
CLIENT_CLOSED: Final = 499  # nginx's convention: the client went away before the end
# The model APIs outside /v1/: vLLM's names (/rerank, /score, /tokenize...).
_MODEL_PATHS: Final = frozenset(path for path in ENDPOINT_BY_PATH if not path.startswith("/v1/"))
_CORS_METHODS: Final = b"GET, POST, DELETE, OPTIONS"
_CORS_HEADERS: Final = b"authorization, content-type, x-api-key, anthropic-version, x-request-id"
_CORS_EXPOSED: Final = b"x-request-id, retry-after"
_TOKEN_LIST: Final = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_, ")


@dataclass(slots=True)
class RequestContext:
    request_id: str
    started: float
    endpoint: str | None
    model: str = ""
    backend: str = ""
    key: str = ""  # the client key's name (keys.yaml), never its secret
    status: int = 0
    first_byte_at: float | None = None
    client_gone: bool = False


def context_of(scope: Scope) -> RequestContext | None:
    ctx = scope.get(CONTEXT_KEY)
    return ctx if isinstance(ctx, RequestContext) else None


class RequestObserver:
    def __init__(self, app: ASGIApp, *, metrics: Metrics, access_log: bool) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _request_id(scope)
        ctx = RequestContext(rid, time.perf_counter(), ENDPOINT_BY_PATH.get(scope["path"]))
        scope[CONTEXT_KEY] = ctx
        rid_header = (b"x-request-id", rid.encode())

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                ctx.status = message["status"]
                message["headers"] = [*message.get("headers", ()), rid_header]
            elif ctx.first_byte_at is None and message.get("body"):
                ctx.first_byte_at = time.perf_counter()
            await send(message)

        token = logs.request_id.set(rid)
        try:
            await self.app(scope, receive, observed_send)
        finally:
            self._record(scope, ctx)
            logs.request_id.reset(token)

    def _record(self, scope: Scope, ctx: RequestContext) -> None:
        ended = time.perf_counter()
        status = CLIENT_CLOSED if ctx.client_gone else (ctx.status or 500)
        if ctx.endpoint is not None:
            self.metrics.observe_request(
                model=ctx.model,
                backend=ctx.backend,
                endpoint=ctx.endpoint,
                status=status,
                duration_s=ended - ctx.started,
                ttfb_s=None if ctx.first_byte_at is None else ctx.first_byte_at - ctx.started,
            )
        if self.access_log:
            logs.access(
                ctx.request_id,
                f"request method={scope['method']} path={scope['path']} status={status} "
                f"model={ctx.model or '-'} backend={ctx.backend or '-'} key={ctx.key or '-'} "
                f"duration_ms={(ended - ctx.started) * 1000:.1f}",
            )


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = bytes(value).decode("latin-1")
            if 0 < len(text) <= 128 and text.isprintable():
                return text
            break
    return secrets.token_hex(8)


class BodyGuard:
    """Every route's request body, whoever reads it (the relay, the admin API): at most
    `max_body_bytes` (413), all of it within `body_timeout_s` of the first read (408);
    both close the connection. A response that starts before the body was read to its
    end (413 on a declared length, 415, 401, 404...) says `connection: close`, so a
    client cannot hold the connection by trickling the rest of a body nobody reads."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        done = False
        size = 0
        deadline: float | None = None

        async def guarded_receive() -> Message:
            nonlocal done, size, deadline
            if done:  # afterwards: only http.disconnect, awaited as long as the response
                return await receive()
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.body_timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(
                    f"The request body did not arrive within {self.body_timeout_s:g} s "
                    f"({size} bytes received; see MICROSCHEDULER_SERVER__BODY_TIMEOUT_S)."
                ) from None
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.max_body_bytes:
                    raise too_large(self.max_body_bytes)
                done = not message.get("more_body", False)
            else:
                done = True
            return message

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not done and _has_body(scope):
                message["headers"] = [*message.get("headers", ()), (b"connection", b"close")]
            await send(message)

        await self.app(scope, guarded_receive, guarded_send)


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than this gateway accepts ({limit} bytes; "
        "see MICROSCHEDULER_MAX_BODY_BYTES).",
        headers={"connection": "close"},
    )


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return bytes(value).strip() not in (b"", b"0")
        if name == b"transfer-encoding":
            return True
    return False


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
