"""RelayResponse: opens the upstream, relays its bytes, and cleans up on every exit.

An ASGI callable rather than a Starlette StreamingResponse because it must:
- open the upstream before anything is sent, so errors before the first byte are still
  ordinary OpenAI error responses (and, later, fallback points);
- watch for the client going away during the whole exchange, the wait for the first
  byte included (its connection says so, `app.api.client_link`; under another ASGI
  server, `receive()` does), and then abort the upstream request (uvicorn's `send`
  silently drops messages after a disconnect, so writing alone would never notice);
- end a stream that breaks after its first byte with one in-band error event and
  `data: [DONE]`;
- keep a streaming client that is held while its backend wakes from timing out: after
  `wake_notice_s` it sends `200 text/event-stream` and an SSE comment
  (`: waking reasoning 5s`) every `wake_notice_s`. Comments carry no content, so the
  request can still fail over; an error after them is sent in-band;
- end what is still open when the gateway stops (`OpenRelays.end_all`, shortly before the
  server's grace is over): a `gateway_stopping` error, in-band in a stream begun, rather
  than a connection cut with no end; and likewise end with `internal_error` what an
  unexpected exception broke, rather than leaving the server's plain-text 500.
Chunks are passed on as they arrive; SSE is not re-parsed.

The dispatcher decides where the request goes; a model with a fallback chain may answer
from another entry, and then the exchange's `x-microscheduler-route` and
`x-microscheduler-fallbacks` headers are added (after wake notices, when the status line
is already out, they come as one SSE comment, `: route deepseek; fallbacks 1; ...`).
When a body ends, its last bytes go to `Exchange.body_done` (token usage).

A request that waited before its upstream was opened (its backend's start, a slot, a
free connection; `app.activity.Waits`) says how long and why in
`x-microscheduler-wait: 2.31s; reason=wake`; a stream whose status line went out with
the wake notices says it in one SSE comment before the first event
(`: wait 2.31s; reason=wake`). Its tokens and the fallbacks taken go to the request's
context, for its activity entry.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Final, Protocol

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from app.activity import WAIT_HEADER, Waits
from app.api.client_link import link_of
from app.api.handlers import error_response
from app.api.middleware import RequestContext, context_of
from app.errors import GatewayError, GatewayStopping, UpstreamError, UpstreamUnavailable
from app.jsonwire import sse_data
from app.lifecycle.lease import WaitNotice
from app.routing.chains import FALLBACKS_HEADER
from app.routing.dispatcher import Dispatcher
from app.routing.exchange import Call, Exchange
from app.routing.local import LOWERED_HEADER
from app.routing.patience import EXPECTED_WAKE_HEADER
from app.settings.endpoints import Api
from app.tasks import OpenRelays
from app.upstreams.sse_errors import stream_error
from app.upstreams.usage import UsageStripper

logger = logging.getLogger(__name__)

DONE_EVENT: Final = b"data: [DONE]\n\n"
# The APIs whose streams end with `data: [DONE]` (Responses and Messages end with an event).
DONE_TERMINATED: Final = frozenset({Api.CHAT, Api.COMPLETIONS, Api.TRANSCRIPTIONS,
                                    Api.TRANSLATIONS})  # fmt: skip
MAX_ERROR_BODY: Final = 64 * 1024
# How long the end of a response cut short (shutdown, a bug) may take to write.
END_WRITE_S: Final = 0.5
UNEXPECTED: Final = "The gateway failed unexpectedly; see its log."
_SSE_EXTRA_HEADERS: Final = [(b"x-accel-buffering", b"no"), (b"cache-control", b"no-cache")]


SSE_TYPE: Final = b"text/event-stream; charset=utf-8"


class Dialect(Protocol):
    """How the client's API words what the gateway itself says: an error before the first
    byte, an error inside a stream already begun, a keep-alive while a backend wakes (in a
    stream of `stream_type`)."""

    @property
    def stream_type(self) -> bytes: ...

    def error_response(self, err: GatewayError) -> Response: ...

    def stream_error(self, err: GatewayError, last_chunk: bytes) -> bytes: ...

    def upstream_stream_error(self, status: int, body: bytes) -> bytes: ...

    def keepalive(self, backend: str, waited_s: float, detail: str | None) -> bytes: ...


class OpenAIDialect:
    """OpenAI's envelope; in a stream, one `data: {"error": ...}` event and `[DONE]`; SSE
    comments (`: waking reasoning 5s`) as keep-alives."""

    stream_type = SSE_TYPE

    def error_response(self, err: GatewayError) -> Response:
        return error_response(err)

    def stream_error(self, err: GatewayError, last_chunk: bytes) -> bytes:
        return _error_event(err, last_chunk)

    def upstream_stream_error(self, status: int, body: bytes) -> bytes:
        return _upstream_error_event(status, body)

    def keepalive(self, backend: str, waited_s: float, detail: str | None) -> bytes:
        why = f" ({detail})" if detail else ""
        return f": waking {backend} {int(waited_s)}s{why}\n\n".encode()


OPENAI: Final = OpenAIDialect()


class RelayResponse(Response):
    # A Response only so routes can return it; it builds its own messages in __call__.
    _ctx: RequestContext  # set first thing in __call__
    _waits: Waits

    def __init__(
        self,
        dispatcher: Dispatcher,
        call: Call,
        *,
        dialect: Dialect = OPENAI,
        stored: tuple[str, str] | None = None,
        relays: OpenRelays | None = None,
    ) -> None:
        """`stored`: (response id, entry): a stored response's follow-up, opened on the
        entry that created it rather than where the call routes. `relays`: where the
        relay is registered while it runs, so a stopping gateway can end it in-band."""
        self._dispatcher = dispatcher
        self._call = call
        self._dialect = dialect
        self._stored = stored
        self._relays = relays
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The observer's context: the request's record, its waits, and how far the
        # response got (its `send` keeps that).
        ctx = self._ctx = context_of(scope)
        self._waits = ctx.waits
        route = self._call.route
        ctx.model, ctx.backend = route.name, route.backend
        relays = self._relays
        if relays is not None and relays.stopping:
            self._key_done("error")
            await self._dialect.error_response(_stopping())(scope, receive, send)
            return
        watch = _DisconnectWatch(receive, scope)
        if relays is not None:
            relays.add(watch.task)
        notice = _WakeNotice(send, route.backend, self._dialect) if self._call.stream else None
        exchange: Exchange | None = None
        try:
            try:
                exchange = await self._open(ctx, notice)
            except GatewayError as err:
                watch.stop()
                await self._refused(scope, receive, send, ctx, notice, err)
                return
            if notice is not None and notice.started:
                await self._relay_after_notice(exchange, send, watch)
            else:
                await self._relay(exchange, send, watch)
        except asyncio.CancelledError:
            if watch.disconnected:
                watch.absorb_cancel()
                ctx.client_gone = True
                logger.info(
                    "client disconnected, upstream request cancelled backend=%s",
                    route.backend,
                )
            elif relays is not None and relays.ending(watch.task):
                watch.absorb_cancel()
                watch.stop()
                logger.info("gateway stopping, response ended backend=%s", route.backend)
                await self._end(scope, receive, send, ctx, _stopping())
            else:
                raise
        except Exception:
            watch.stop()
            logger.exception("relay failed unexpectedly backend=%s", route.backend)
            await self._end(scope, receive, send, ctx, GatewayError(UNEXPECTED))
        finally:
            if relays is not None:
                relays.discard(watch.task)
            watch.stop()
            if exchange is not None:
                exchange.finish()
                _took(ctx, exchange)
            self._key_done("served" if exchange is not None else "cancelled")

    async def _open(self, ctx: RequestContext, notice: _WakeNotice | None) -> Exchange:
        """The exchange with the upstream the dispatcher chose (a stored response's
        follow-up: the entry that created it); raises `GatewayError`."""
        if self._stored is not None:
            exchange = await self._dispatcher.open_stored(*self._stored, self._call, notice)
        else:
            exchange = await self._dispatcher.open(self._call, notice)
        ctx.backend = exchange.backend
        exchange.key = self._call.key
        return exchange

    async def _refused(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext,
        notice: _WakeNotice | None,
        err: GatewayError,
    ) -> None:
        """No upstream answered: `err` as the client's error response (in-band when wake
        notices began the stream), with the wait and the fallbacks it took."""
        self._key_done("error")
        _note_fallbacks(ctx, err.headers.get(FALLBACKS_HEADER.decode()),
                        err.headers.get(EXPECTED_WAKE_HEADER.decode()))  # fmt: skip
        wait = self._wait_header()
        if wait is not None:  # a new dict: the error's may be shared
            err.headers = {**err.headers, WAIT_HEADER.decode(): wait.decode()}
        if notice is not None and notice.started:
            self._broke(_label(err))
            await send(_body(self._dialect.stream_error(err, b""), more=False))
        else:
            await self._dialect.error_response(err)(scope, receive, send)

    def _broke(self, label: str | None) -> None:
        """The response ended with an error after its status line went out (`label`: the
        error's code; None: it did not): its activity entry and access line say so, its
        status stays what went out."""
        if label is not None and self._ctx.stream_error is None:
            self._ctx.stream_error = label

    def _key_done(self, outcome: str) -> None:
        if self._call.key is not None:
            self._call.key.finish(outcome)

    def _wait_header(self) -> bytes | None:
        return self._waits.header()

    async def _end(
        self, scope: Scope, receive: Receive, send: Send, out: RequestContext, err: GatewayError
    ) -> None:
        """End the response with `err`, however far it got: an error response if nothing
        was sent, the in-band error if a stream was begun. A body other than a stream
        cannot say it failed: it is left unfinished, so the server closes the connection
        and the client sees it cut, never complete. Bounded: a client that does not read
        does not hold the gateway."""
        try:
            async with asyncio.timeout(END_WRITE_S):
                if not out.head_sent:
                    await self._dialect.error_response(err)(scope, receive, send)
                    return
                if not out.ended:
                    self._broke(_label(err))
                if out.sse and not out.ended:
                    await send(_body(self._dialect.stream_error(err, out.last), more=False))
        except TimeoutError:
            logger.info("the client did not take the response's end; closing")

    async def _relay(self, exchange: Exchange, send: Send, watch: _DisconnectWatch) -> None:
        """Send the response on, ending a broken SSE stream with an in-band error."""
        upstream = exchange.response
        sse = upstream.is_event_stream
        headers = upstream.headers + _SSE_EXTRA_HEADERS if sse else upstream.headers
        if exchange.headers:
            headers = headers + exchange.headers
        wait = self._wait_header()
        if wait is not None:
            headers = [*headers, (WAIT_HEADER, wait)]
        if self._call.key is not None:
            headers = headers + self._call.key.headers()
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        await self._relay_body(exchange, send, watch, sse=sse)

    async def _relay_after_notice(
        self, exchange: Exchange, send: Send, watch: _DisconnectWatch
    ) -> None:
        """The status line is already sent (200, event stream): relay a stream as is,
        turn anything else into one in-band error event."""
        upstream = exchange.response
        if self._dialect.stream_type == SSE_TYPE:  # comments: SSE has them, NDJSON has not
            comment = _route_comment(exchange.headers or [])
            if comment:
                await send(_body(comment, more=True))
            wait = self._wait_header()
            if wait is not None:
                await send(_body(b": wait " + wait + b"\n\n", more=True))
        if upstream.status == 200 and upstream.is_event_stream:
            await self._relay_body(exchange, send, watch, sse=True)
            return
        body = upstream.first_chunk
        if not upstream.complete:
            async for chunk in upstream.rest():
                body += chunk
                if len(body) > MAX_ERROR_BODY:
                    break
        watch.stop()
        self._broke(f"upstream_{upstream.status}")
        error = self._dialect.upstream_stream_error(upstream.status, body)
        await send(_body(error, more=False))

    async def _relay_body(
        self, exchange: Exchange, send: Send, watch: _DisconnectWatch, *, sse: bool
    ) -> None:
        upstream = exchange.response
        cut_short = sse and self._call.api in DONE_TERMINATED
        # The usage event the gateway asked for on the key's behalf is not the client's.
        # It is counted here, unless the stream is a translation that counts its own
        # usage (`tail_usage` False: the Anthropic provider's, counted by the chain).
        count = exchange.count if exchange.tail_usage else _uncounted
        strip = UsageStripper(count) if sse and self._call.usage_added else None
        first = upstream.first_chunk if strip is None else strip.feed(upstream.first_chunk)
        if upstream.complete:
            watch.stop()
            if strip is not None:
                first += strip.flush()
            if cut_short and _without_done(first):
                await send(_body(first, more=True))
                await self._ended_early(exchange, send, first)
                return
            await send(_body(first, more=False))
            if sse:
                self._broke(stream_error(first))
            exchange.body_done(first)
            return
        await send(_body(first, more=True))
        previous, last = b"", first
        try:
            async for chunk in upstream.rest():
                if strip is not None:
                    chunk = strip.feed(chunk)
                    if not chunk:
                        continue
                await send(_body(chunk, more=True))
                previous, last = last, chunk
            if strip is not None and (rest := strip.flush()):
                await send(_body(rest, more=True))
                previous, last = last, rest
        except UpstreamError as err:
            self._dispatcher.record_stream_error(exchange, err)
            logger.warning(
                "upstream failed mid-response backend=%s error=%s", exchange.backend, err
            )
            watch.stop()
            self._broke(_label(err))
            if sse:
                await send(_body(self._dialect.stream_error(err, last), more=False))
            # Otherwise return without finishing: the server closes the connection, so the
            # client sees a truncated response rather than a silently shortened one.
            return
        watch.stop()
        if cut_short and _without_done(previous + last):
            await self._ended_early(exchange, send, last)
            return
        await send(_body(b"", more=False))
        if sse:  # the upstream's own error event, before [DONE]: its last chunks only
            self._broke(stream_error(previous + last))
        exchange.body_done(previous + last)

    async def _ended_early(self, exchange: Exchange, send: Send, last: bytes) -> None:
        """A stream that ended cleanly but without `[DONE]` was cut short: it ends with
        the in-band error, never as a silently short answer."""
        error = UpstreamUnavailable(
            f"upstream {exchange.backend!r} ended the stream without [DONE]", kind="disconnected"
        )
        self._dispatcher.record_stream_error(exchange, error)
        self._broke(_label(error))
        logger.warning("upstream stream ended without [DONE] backend=%s", exchange.backend)
        await send(_body(self._dialect.stream_error(error, last), more=False))


def _label(err: GatewayError) -> str:
    """A gateway error's label for the activity and the access line: its code."""
    return str(err.code or err.type)


def _took(ctx: RequestContext, exchange: Exchange) -> None:
    """What the answer took, for the request's activity entry: its tokens, the fallbacks."""
    ctx.usage = exchange.usage
    if exchange.headers:
        fields = dict(exchange.headers)
        _note_fallbacks(ctx, fields.get(FALLBACKS_HEADER), fields.get(EXPECTED_WAKE_HEADER))


def _note_fallbacks(
    ctx: RequestContext, fallbacks: bytes | str | None, expected: bytes | str | None
) -> None:
    """The fallbacks taken, their reasons and a priced-out entry's expected wake."""
    ctx.fallbacks = fallbacks_taken(fallbacks)
    text = fallbacks.decode() if isinstance(fallbacks, bytes) else fallbacks or ""
    ctx.fallback_reasons = tuple(p.rpartition("=")[2].strip() for p in text.split(";")[1:])
    if expected:
        seen = expected.decode() if isinstance(expected, bytes) else expected
        times = [p.rpartition("=")[2].strip().removesuffix("s") for p in seen.split(";")]
        ctx.expected_wake_s = max((float(t) for t in times if _is_seconds(t)), default=None)


def _is_seconds(text: str) -> bool:
    return text.replace(".", "", 1).isdigit()


def fallbacks_taken(value: bytes | str | None) -> int:
    """The count of `x-microscheduler-fallbacks` (`0`, `2; a=local_stopped; ...`)."""
    if value is None:
        return 0
    text = value.decode() if isinstance(value, bytes) else value
    head = text.split(";", 1)[0].strip()
    return int(head) if head.isdigit() else 0


def _without_done(tail: bytes) -> bool:
    return not tail.rstrip().endswith(b"data: [DONE]")


def _body(data: bytes, *, more: bool) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


def _route_comment(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The gateway's headers (a chain's route, a lowered `max_tokens`) as one SSE comment,
    for a stream whose headers are already out; empty when there are none."""
    fields = dict(headers)
    lines = b""
    route = fields.get(b"x-microscheduler-route")
    if route is not None:
        fallbacks = fields.get(b"x-microscheduler-fallbacks", b"0")
        lines += b": route " + route + b"; fallbacks " + fallbacks + b"\n"
    lowered = fields.get(LOWERED_HEADER)
    if lowered is not None:
        lines += b": max-tokens-lowered " + lowered + b"\n"
    return lines + b"\n" if lines else b""


def _error_event(err: GatewayError, last_chunk: bytes) -> bytes:
    return _event_with_done(err.body(), last_chunk)


def _event_with_done(payload: object, last_chunk: bytes) -> bytes:
    # Close an event the upstream left half-written, so ours parses on its own.
    ended = not last_chunk or last_chunk.endswith((b"\n\n", b"\r\n\r\n"))
    boundary = b"" if ended else b"\n\n"
    return boundary + sse_data(payload) + DONE_EVENT


def _upstream_error_event(status: int, body: bytes) -> bytes:
    """An upstream error response, as the in-band error event of a stream already begun."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        text = body[:MAX_ERROR_BODY].decode(errors="replace").strip()
        error = {
            "message": f"upstream answered {status}: {text}"
            if text
            else f"upstream answered {status}",
            "type": "server_error" if status >= 500 else "invalid_request_error",
            "param": None,
            "code": status,
        }
    return _event_with_done({"error": error}, b"")


class _WakeNotice:
    """Keeps a held streaming client alive with SSE comments; sends the status line once."""

    def __init__(self, send: Send, backend: str, dialect: Dialect) -> None:
        self._send = send
        self._backend = backend
        self._dialect = dialect
        self.started = False

    async def __call__(self, waited_s: float, detail: str | None = None) -> None:
        if not self.started:
            self.started = True
            await self._send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", self._dialect.stream_type),
                                *_SSE_EXTRA_HEADERS],
                }
            )  # fmt: skip
        line = self._dialect.keepalive(self._backend, waited_s, detail)
        await self._send(_body(line, more=True))

    def for_backend(self, backend: str) -> WaitNotice:
        """The notice while a fallback chain waits for `backend` (named in the comments)."""

        async def notice(waited_s: float, detail: str | None) -> None:
            self._backend = backend
            await self(waited_s, detail)

        return notice


def _stopping() -> GatewayStopping:
    return GatewayStopping(
        "The gateway is shutting down and ended this response before it was complete; retry."
    )


class _DisconnectWatch:
    """Cancels the current task when the client disconnects, until `stop()`.

    Told by the connection itself where the gateway's server runs the request (its
    `ClientLink`); under another ASGI server, by a task awaiting `receive()`: the body
    has been read already, so the next `receive()` only returns once the client has
    gone (or the response is complete, which `stop()` covers first).
    """

    __slots__ = ("_link", "_stopped", "_waiter", "disconnected", "task")

    def __init__(self, receive: Receive, scope: Scope) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.disconnected = False
        self._stopped = False
        self._link = link_of(scope)
        self._waiter: asyncio.Future[Message] | None = None
        if self._link is not None:
            self._link.watch(self._lost)
        else:
            self._waiter = asyncio.ensure_future(receive())
            self._waiter.add_done_callback(self._on_message)

    def _on_message(self, waiter: asyncio.Future[Message]) -> None:
        if waiter.cancelled():
            return
        # A server whose receive() fails has lost the client too; retrieving the error
        # keeps it from being reported as never retrieved.
        waiter.exception()
        self._lost()

    def _lost(self) -> None:
        if not self._stopped:
            self.disconnected = True
            self.task.cancel()

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            if self._link is not None:
                self._link.unwatch()
            if self._waiter is not None:
                self._waiter.remove_done_callback(self._on_message)
                self._waiter.cancel()

    def absorb_cancel(self) -> None:
        """The cancellation came from us: undo it so the task can finish cleanly."""
        self.task.uncancel()


def _uncounted(prompt: int, completion: int) -> None:
    """A usage event already counted elsewhere (`Exchange.tail_usage` False)."""
