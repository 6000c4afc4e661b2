"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol (its fastest) plus
what it lacks against slow and abusive clients (`ServerConfig` says why each limit and
default).

- A request head (request line and headers) must arrive within `header_timeout_s` of the
  connection opening, or of its first byte on a kept-alive connection: uvicorn has no
  header timeout, and a client dribbling one byte at a time (slowloris) would hold its
  connection forever. Partial head: 408 then close; nothing yet: just close.
- A head over `max_header_bytes` is answered 431 and closed (httptools alone has no
  limit). The head is measured from the first byte after the previous request's body to
  the blank line that ends it. A chunked body's trailer fields count against the same
  limit (httptools hands them to `on_header` like headers, and buffers a field whole).
- At most `max_connections` open. A new connection over the cap closes one to make room:
  the one whose head began longest ago and is still incomplete (slowloris), else the one
  idle longest (kept alive, or opened and silent). When every connection has a request in
  flight, the newcomer is held in one of `RESERVE` reserve slots for at most
  `RESERVE_HEAD_S`: a `GET /health` or `/ready` is served there (probes must not restart a
  busy gateway), anything else is answered 503. A full reserve gives the slot of its oldest
  connection whose head is not complete (503) to the newcomer, so an attacker cannot hold
  it; a probe with its whole head is answered at once and closed.
- A refusal (408, 431, 503) is written, the connection half-closed, and what the client
  still sends read and dropped for up to `LINGER_S` before closing (at most `MAX_LINGERING`
  such sockets): closing with its request unread would send a TCP reset that destroys
  the answer before the client reads it.

- A response's status line and headers wait for its first body bytes (`_OneWrite`, at
  most until the loop's next turn): uvicorn writes them apart, so an answer ready at once
  cost two writes, two segments and two wake-ups of the client; now one.

Only the connection layer lives here; the body's size and time are
`app.api.middleware.BodyGuard`'s. (h11's implementation bounds a head by itself, but costs
about a quarter of the gateway's throughput: measured with `bench/overhead.py`.)
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.errors import GatewayError, RequestHeadersTooLarge, RequestTimeout, TooManyConnections
from app.settings.root import ServerConfig

_HEAD_END = b"\r\n\r\n"
RESERVE = 8  # connections over the cap waiting to show they are a health probe
RESERVE_HEAD_S = 2.0  # (at most header_timeout_s) for the request line to arrive there
PROBE_PATHS = (b"/health", b"/ready")
_PROBE_LINE_MAX = 2048  # a reserve connection's request line longer than this is refused
LINGER_S = 2.0  # a refused connection's unread request is read and dropped this long
MAX_LINGERING = 256  # beyond this many lingering sockets, a refusal just closes

Slot = dict["GatewayProtocol", None]


class Slots:
    """One server's connections that can make room at the cap, oldest first (a dict keeps
    insertion order, so finding the oldest and moving one is O(1))."""

    def __init__(self) -> None:
        self.partial: Slot = {}  # a head begun but not complete: oldest head first
        self.idle: Slot = {}  # silent since opening, or kept alive between requests
        # Over the cap: each waiting for its request line (its gate), or serving a probe (None).
        self.reserve: dict[GatewayProtocol, _Gate | None] = {}
        self.lingering = 0


class GatewayProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with a header timeout, a head size limit and a connection cap.

    Give uvicorn `configured(limits)`: the class it returns holds one server's `Slots`."""

    limits: ClassVar[ServerConfig] = ServerConfig()
    slots: ClassVar[Slots]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timer: asyncio.TimerHandle | None = None
        # Bytes of the request head read so far; None once its headers are complete.
        self.head_bytes: int | None = 0
        self._head_tail = b""  # the last bytes read of a head (its end may straddle reads)
        # Bytes after a chunk header not followed by data (the last chunk's trailer section):
        # None outside one; -1 in the read it began in (its trailer part is not counted).
        self.trailer_bytes: int | None = None
        self.slot: Slot | None = None  # which of `slots.partial` / `slots.idle` holds this
        self.reserved = False  # admitted over the cap (a reserve slot)

    @classmethod
    def configured(cls, limits: ServerConfig) -> type[GatewayProtocol]:
        """The protocol class to give uvicorn (`http=`) for these limits (one per server)."""
        return type("ConfiguredGatewayProtocol", (cls,), {"limits": limits, "slots": Slots()})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()
        self._enter(self.slots.idle)
        over = len(self.connections) - len(self.slots.reserve) > self.limits.max_connections
        if over and not self._make_room():
            self._admit_over_cap()

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave_slots()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.head_bytes is not None:
            if self.head_timer is None:  # the first byte of the next request on a kept-alive one
                self._arm_head_timer()
            if self._head_too_large(data):
                limit = self.limits.max_header_bytes
                self._refuse(
                    RequestHeadersTooLarge(
                        f"The request line and headers are larger than this gateway accepts "
                        f"({limit} bytes; see MICROSCHEDULER_SERVER__MAX_HEADER_BYTES)."
                    )
                )
                return
        super().data_received(data)
        if self.trailer_bytes is not None:
            self._count_trailers(len(data))

    def on_headers_complete(self) -> None:
        self.head_bytes = None
        self._head_tail = b""
        self._disarm_head_timer()
        self._enter(None)
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not before:
            self.cycle.transport = _OneWrite(self.transport, self.cycle, self.loop)  # type: ignore[assignment]
        if self.reserved and self.cycle is not None:
            self.cycle.keep_alive = False  # a probe over the cap: one request, then close

    def on_chunk_header(self) -> None:
        self.trailer_bytes = -1  # the last chunk's trailers may follow, or this chunk's data

    def on_body(self, body: bytes) -> None:
        self.trailer_bytes = None
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.head_bytes = 0  # what comes next is the next request's head
        self.trailer_bytes = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Idle: the newest request answered, none queued (a pipelined one starts above).
        done = self.cycle is None or self.cycle.response_complete
        if done and self.slot is None and not self.pipeline and not self.transport.is_closing():
            self._enter(self.slots.idle)

    def _head_too_large(self, data: bytes) -> bool:
        assert self.head_bytes is not None
        limit = self.limits.max_header_bytes
        seen = self._head_tail + data
        end = seen.find(_HEAD_END)
        if end < 0:
            self.head_bytes += len(data)
            self._head_tail = seen[-(len(_HEAD_END) - 1) :]
            if self.slot is not self.slots.partial and not self.reserved:
                self._enter(self.slots.partial)  # the head began: the first to make room
            return self.head_bytes > limit
        # The head ends in this read (body bytes may follow it).
        size = self.head_bytes + end + len(_HEAD_END) - len(self._head_tail)
        self.head_bytes += len(data)
        return size > limit + len(_HEAD_END)

    def _count_trailers(self, size: int) -> None:
        seen = self.trailer_bytes
        assert seen is not None
        if seen < 0:
            self.trailer_bytes = 0
            return
        self.trailer_bytes = seen + size
        if self.trailer_bytes > self.limits.max_header_bytes and not self.transport.is_closing():
            self._refuse(
                RequestHeadersTooLarge(
                    f"The request's trailer fields are larger than this gateway accepts "
                    f"({self.limits.max_header_bytes} bytes; see "
                    "MICROSCHEDULER_SERVER__MAX_HEADER_BYTES)."
                )
            )

    def _arm_head_timer(self, timeout_s: float | None = None) -> None:
        self._disarm_head_timer()
        self.head_timer = self.loop.call_later(
            timeout_s or self.limits.header_timeout_s, self._head_timed_out
        )

    def _disarm_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing() or self.head_bytes is None:
            return
        if self.head_bytes or self._head_tail:
            self._refuse(
                RequestTimeout(
                    f"The request headers did not arrive within {self.limits.header_timeout_s:g} s "
                    "(see MICROSCHEDULER_SERVER__HEADER_TIMEOUT_S)."
                )
            )
        else:
            self._leave_slots()
            self.transport.close()

    # --- the connection cap ---------------------------------------------------------------

    def _enter(self, slot: Slot | None) -> None:
        if self.slot is not None:
            del self.slot[self]
        if slot is not None:
            slot[self] = None
        self.slot = slot

    def _leave_slots(self) -> None:
        self._enter(None)
        if self.reserved:
            gate = self.slots.reserve.pop(self, None)
            if gate is not None:
                gate.stop()

    def _make_room(self) -> bool:
        """Close the incomplete head begun longest ago, else the connection idle longest;
        False when every other connection has a request in flight."""
        for slot in (self.slots.partial, self.slots.idle):
            for victim in slot:  # oldest first
                if victim is not self:
                    victim._leave_slots()
                    self.connections.discard(victim)
                    victim._disarm_head_timer()
                    victim.transport.close()
                    return True
        return False

    def _admit_over_cap(self) -> None:
        """Every connection has a request in flight: wait in a reserve slot for a probe's
        request line (the oldest waiting one makes room when all are taken), or 503."""
        self._enter(None)
        self._disarm_head_timer()
        reserve = self.slots.reserve
        if len(reserve) >= RESERVE:
            # Waiting: for its request line (a gate), or for the rest of a probe's head.
            waiting = next(
                (c for c, gate in reserve.items() if gate is not None or c.head_bytes is not None),
                None,
            )
            if waiting is None:  # every reserve slot is answering a probe
                self._refuse(self._too_many())
                return
            waiting._refuse(waiting._too_many())
        self.reserved = True
        gate = _Gate(self, min(RESERVE_HEAD_S, self.limits.header_timeout_s))
        reserve[self] = gate
        self.transport.set_protocol(gate)

    def _pass_probe(self, head: bytes) -> None:
        """A reserve connection asked for a probe path: parse and serve it here."""
        self.slots.reserve[self] = None
        self.transport.set_protocol(self)
        self._arm_head_timer(min(RESERVE_HEAD_S, self.limits.header_timeout_s))
        self.data_received(head)

    def _too_many(self) -> TooManyConnections:
        return TooManyConnections(
            f"The gateway has {self.limits.max_connections} connections open, each with a "
            "request in flight; retry shortly (see MICROSCHEDULER_SERVER__MAX_CONNECTIONS).",
        )

    def _refuse(self, err: GatewayError) -> None:
        """Answer outside the parser (unless a response has started), drop the connection
        from the server's books, and close it gracefully (`_linger`)."""
        self._leave_slots()
        self._disarm_head_timer()
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        cycle = self.cycle
        started = cycle is not None and cycle.response_started
        if cycle is not None:
            if not cycle.response_complete:
                cycle.disconnected = True  # the application's sends are dropped from now on
            cycle.message_event.set()
        if self.flow is not None:
            self.flow.resume_writing()
        _linger(self.transport, None if started else raw_response(err), self.slots, self.loop)


class _OneWrite:
    """The transport a request's cycle writes its response to: the status line and
    headers are held until the first body bytes follow them, or at the latest until the
    loop's next turn (a response that starts and then waits), and leave with them in one
    write. Everything else passes straight through (`100 Continue`, later chunks)."""

    __slots__ = ("_cycle", "_head", "_held", "_loop", "_transport")

    def __init__(
        self, transport: asyncio.Transport, cycle: Any, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._transport = transport
        self._cycle = cycle
        self._loop = loop
        self._head: bytes | None = None
        self._held: asyncio.Handle | None = None  # the next turn's flush; None once passed

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            assert self._held is not None
            self._held.cancel()
            self._transport.write(head + data)
        elif self._held is None and self._cycle.response_started:
            self._head = data  # uvicorn marks the response started, then writes its head
            self._held = self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        head, self._head = self._head, None
        # A client gone (or refused) meanwhile: nothing is written, as uvicorn would not.
        if head is not None and not self._cycle.disconnected and not self._transport.is_closing():
            self._transport.write(head)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        if self._head is not None:
            assert self._held is not None
            self._held.cancel()
            self._flush()
        self._transport.close()


class _Gate(asyncio.Protocol):
    """A reserve connection's protocol until its request line shows what it asks: a
    `GET /health` or `/ready` goes back to its `GatewayProtocol`, anything else gets 503."""

    def __init__(self, owner: GatewayProtocol, timeout_s: float) -> None:
        self.owner = owner
        self.head = b""
        self.timer: asyncio.TimerHandle | None = owner.loop.call_later(timeout_s, self._refuse)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def data_received(self, data: bytes) -> None:
        self.head += data
        end = self.head.find(b"\r\n")
        if end < 0:
            if len(self.head) > _PROBE_LINE_MAX:
                self._refuse()
            return
        method, _, rest = self.head[:end].partition(b" ")
        path = rest.partition(b" ")[0].partition(b"?")[0]
        self.stop()
        if method == b"GET" and path in PROBE_PATHS:
            self.owner._pass_probe(self.head)
        else:
            self._refuse()

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop()
        self.owner.connection_lost(exc)

    def _refuse(self) -> None:
        self.timer = None
        self.owner._refuse(self.owner._too_many())


class _Linger(asyncio.Protocol):
    """A refused connection after its answer: reads and drops what the client still sends
    until it closes or `LINGER_S` passes."""

    def __init__(self, slots: Slots, timer: asyncio.TimerHandle) -> None:
        self.slots, self.timer = slots, timer
        slots.lingering += 1

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None  # the client read the answer and closed: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self.slots.lingering -= 1


def _linger(
    transport: asyncio.Transport,
    answer: bytes | None,
    slots: Slots,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Write `answer`, half-close, and drop the client's unread bytes for a bounded time:
    a close with bytes unread sends a reset, which can destroy the answer unread."""
    if answer is not None:
        transport.write(answer)
    if slots.lingering >= MAX_LINGERING or not transport.can_write_eof():
        transport.close()
        return
    transport.set_protocol(_Linger(slots, loop.call_later(LINGER_S, transport.close)))
    transport.write_eof()
    transport.resume_reading()


def raw_response(err: GatewayError) -> bytes:
    """A whole HTTP/1.1 response carrying `err`'s envelope, closing the connection."""
    body = json.dumps(err.body()).encode()
    phrase = HTTPStatus(err.status).phrase
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        **err.headers,
        "connection": "close",
    }
    head = f"HTTP/1.1 {err.status} {phrase}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()
    )
    return head.encode("latin-1") + b"\r\n" + body
