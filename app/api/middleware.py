"""Pure ASGI middleware: request id, per-request metrics and the access log line; the
guard on every request body (size, time, closing a connection whose body was not read);
and the guard on where a browser's request comes from (`Origin`, and CORS for the origins
listed in `MICROSCHEDULER_ALLOWED_ORIGINS`).

Each request gets a `RequestContext` in its scope; the relay fills in what only it knows
(the configured model name, the backend, a client that went away, the answer's tokens,
the fallbacks taken, the error that ended a response begun: `stream_error`), and this
middleware records it once the response is over, whatever path the request took:
metrics, the access line, and an `app.activity` entry for each request to a model API
(not `/v1/models`). The context's `Waits` is the request's `app.activity.current_waits`
while it is served.

The observer is always the outermost layer (`app.api.fastpath.GatewayApp`), so every
request below it has its context (`context_of`). One `send` wrapper serves the whole
stack: the observer's, which also keeps how far the response got (status line out, event
stream, last chunk, ended; the relay's end of a response cut short reads it) and adds
`BodyGuard`'s `connection: close` when a response starts before the body was read
(`body_pending`).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass, field
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import logs
from app.activity import Activity, Entry, Waits, current_waits, entry_at
from app.api.client_link import link_of
from app.api.protocol import ENDPOINT_BY_PATH
from app.errors import PayloadTooLarge, RequestTimeout
from app.metrics import Metrics

CONTEXT_KEY: Final = "microscheduler.context"
CLIENT_CLOSED: Final = 499  # nginx's convention: the client went away before the end
NOT_ACTIVITY: Final = frozenset({"models"})  # listings: not requests to a model
_CLOSE: Final = (b"connection", b"close")
# The content types of a stream the relay ends in-band (`RequestContext.sse`).
STREAM_TYPES: Final = (b"text/event-stream", b"application/x-ndjson")
# A client's request id is kept when it is 1-128 of these (a UUID, a ULID, hex, dotted or
# colon-separated ids); another gets a new one. It never reaches a backend
# (`app.upstreams.http`).
SAFE_REQUEST_ID: Final = re.compile(rb"[A-Za-z0-9._:+/-]{1,128}")
_IDS_DRAWN: Final = 256  # request ids per draw of randomness


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
    # The error that ended the response after its status line went out (the relay's own
    # in-band error, or the upstream's error event before `[DONE]`): its code.
    stream_error: str | None = None
    # How far the response got, as the observer's `send` saw it (`Progress`).
    sse: bool = False  # its status line said `text/event-stream` (or Ollama's NDJSON)
    last: bytes = b""  # its last non-empty body chunk
    ended: bool = False  # its last body message went out
    # `BodyGuard`: the body is still being read (a response now says `connection: close`).
    body_pending: bool = False

    @property
    def head_sent(self) -> bool:
        return self.status != 0


def context_of(scope: Scope) -> RequestContext:
    """The request's context, which `RequestObserver` (always above every route) put in
    its scope."""
    ctx: RequestContext = scope[CONTEXT_KEY]
    return ctx


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
        self._ids = ""  # random hex drawn ahead: 16 characters per request id
        self._ids_at = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _given_request_id(scope) or self._new_id()
        ctx = RequestContext(rid, time.perf_counter(), ENDPOINT_BY_PATH.get(scope["path"]))
        scope[CONTEXT_KEY] = ctx
        rid_header = (b"x-request-id", rid.encode())

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), rid_header]
                if ctx.body_pending and _has_body(scope):
                    headers.append(_CLOSE)
                message["headers"] = headers
                ctx.status = message["status"]
                ctx.sse = _is_event_stream(headers)
            else:
                if body := message.get("body"):
                    if ctx.first_byte_at is None:
                        ctx.first_byte_at = time.perf_counter()
                    ctx.last = body
                ctx.ended = not message.get("more_body", False)
            await send(message)

        token = logs.request_id.set(rid)
        waits_token = current_waits.set(ctx.waits)
        try:
            await self.app(scope, receive, observed_send)
        finally:
            self._record(scope, ctx)
            current_waits.reset(waits_token)
            logs.request_id.reset(token)

    def _new_id(self) -> str:
        """16 random hex characters, as `secrets.token_hex(8)`, from a draw of the OS's
        randomness made for `_IDS_DRAWN` requests at a time."""
        at = self._ids_at
        if at >= len(self._ids):
            self._ids, at = os.urandom(8 * _IDS_DRAWN).hex(), 0
        self._ids_at = at + 16
        return self._ids[at : at + 16]

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
        if self.access_log and logs.access_on():  # not formatted for a level that drops it
            broke = "" if ctx.stream_error is None else f" stream_error={ctx.stream_error}"
            logs.access(
                ctx.request_id,
                f"request method={scope['method']} path={scope['path']} status={status} "
                f"model={ctx.model or '-'} backend={ctx.backend or '-'} key={ctx.key or '-'} "
                f"duration_ms={(ended - ctx.started) * 1000:.1f}{broke}",
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
    wait_s, wait_reason = ctx.waits.summary()
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
        wait_s=wait_s,
        wait_reason=wait_reason,
        fallbacks=ctx.fallbacks,
        duration_s=duration,
        fallback_reasons=ctx.fallback_reasons,
        expected_wake_s=ctx.expected_wake_s,
        stream_error=ctx.stream_error,
    )


def _given_request_id(scope: Scope) -> str | None:
    """The client's `x-request-id`, when it is a safe one (`SAFE_REQUEST_ID`): it is
    written in every log line of the request, where a space or `=` would forge fields."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            if SAFE_REQUEST_ID.fullmatch(value):
                return bytes(value).decode("ascii")
            break
    return None


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
        ctx = context_of(scope)
        ctx.body_pending = True  # the observer's `send` says `connection: close`
        link = link_of(scope)

        async def guarded_receive() -> Message:
            nonlocal done, size, deadline
            if done:  # afterwards: only http.disconnect, awaited as long as the response
                return await receive()
            if link is not None and link.body_in():  # all read: `receive()` does not wait
                message = await receive()
            else:
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
            if done:
                ctx.body_pending = False
            return message

        await self.app(scope, guarded_receive, send)


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than this gateway accepts ({limit} bytes; "
        "see MICROSCHEDULER_MAX_BODY_BYTES).",
        headers={"connection": "close"},
    )


def _is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    """A stream that can end with an in-band error: server-sent events, or Ollama's
    NDJSON (`app.api.ollama`)."""
    return any(
        name == b"content-type" and value.startswith(STREAM_TYPES) for name, value in headers
    )


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return bytes(value).strip() not in (b"", b"0")
        if name == b"transfer-encoding":
            return True
    return False
