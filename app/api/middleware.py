"""Pure ASGI middleware: request id, per-request metrics and the access log line; the
guard on every request body (size, time, closing a connection whose body was not read);
and the guard on where a browser's request comes from (`Origin`, and CORS for the origins
listed in `MICROSCHEDULER_ALLOWED_ORIGINS`).

Each request gets a `RequestContext` in its scope; the relay fills in what only it knows
(the configured model name, the backend, a client that went away, the answer's tokens,
the fallbacks taken), and this middleware records it once the response is over,
whatever path the request took: metrics, the access line, and an `app.activity` entry
for each request to a model API (not `/v1/models`). The context's `Waits` is the
request's `app.activity.current_waits` while it is served.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import logs
from app.activity import Activity, Entry, Waits, current_waits, entry_at
from app.api.protocol import ENDPOINT_BY_PATH
from app.errors import PayloadTooLarge, RequestTimeout
from app.metrics import Metrics

CONTEXT_KEY: Final = "microscheduler.context"
CLIENT_CLOSED: Final = 499  # nginx's convention: the client went away before the end
NOT_ACTIVITY: Final = frozenset({"models"})  # listings: not requests to a model


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
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens of the answer
    fallbacks: int = 0  # entries of a fallback chain passed over
    fallback_reasons: tuple[str, ...] = ()  # and why
    expected_wake_s: float | None = None  # a cold entry passed over: its expected wake
    waits: Waits = field(default_factory=Waits)  # app.activity.current_waits


def context_of(scope: Scope) -> RequestContext | None:
    ctx = scope.get(CONTEXT_KEY)
    return ctx if isinstance(ctx, RequestContext) else None


class RequestObserver:
    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        access_log: bool,
        activity: Activity | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log
        self.activity = activity

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
        waits_token = current_waits.set(ctx.waits)
        try:
            await self.app(scope, receive, observed_send)
        finally:
            self._record(scope, ctx)
            current_waits.reset(waits_token)
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
        if (
            self.activity is not None
            and ctx.endpoint is not None
            and ctx.endpoint not in NOT_ACTIVITY
        ):
            self.activity.record(_entry(ctx, status, ended))


def _entry(ctx: RequestContext, status: int, ended: float) -> Entry:
    """The activity entry of a finished request: names and numbers, never its body."""
    at, duration = entry_at(ctx.started, ended)
    waits = ctx.waits
    prompt, completion = (None, None) if ctx.usage is None else ctx.usage
    return Entry(
        at=at,
        key=ctx.key or None,
        model=ctx.model or None,
        route=ctx.backend or None,
        api=ctx.endpoint or "",
        status=status,
        prompt_tokens=prompt,
        completion_tokens=completion,
        wait_s=waits.total_s if waits.waited else 0.0,
        wait_reason=waits.reason,
        fallbacks=ctx.fallbacks,
        duration_s=duration,
        fallback_reasons=ctx.fallback_reasons,
        expected_wake_s=ctx.expected_wake_s,
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
