"""Pure ASGI middleware: request id, per-request metrics and the access log line.

Each request gets a `RequestContext` in its scope; the relay fills in what only it knows
(the configured model name, the backend, a client that went away), and this middleware
records it once the response is over, whatever path the request took.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import logs
from app.api.protocol import ENDPOINT_BY_PATH
from app.metrics import Metrics

logger = logging.getLogger("app.access")

CONTEXT_KEY: Final = "microscheduler.context"
CLIENT_CLOSED: Final = 499  # nginx's convention: the client went away before the end


@dataclass(slots=True)
class RequestContext:
    request_id: str
    started: float
    endpoint: str | None
    model: str = ""
    backend: str = ""
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
            logger.info(
                "request method=%s path=%s status=%d model=%s backend=%s duration_ms=%.1f",
                scope["method"],
                scope["path"],
                status,
                ctx.model or "-",
                ctx.backend or "-",
                (ended - ctx.started) * 1000,
            )


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = bytes(value).decode("latin-1")
            if 0 < len(text) <= 128 and text.isprintable():
                return text
            break
    return secrets.token_hex(8)
