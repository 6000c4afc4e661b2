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
- At most `cap` connections with a request (`app.api.capacity`: sized from the file
  limit, or `max_connections`). A new connection over the cap closes one to make room:
  the one whose head began longest ago and is still incomplete (slowloris), else the one
  idle longest (kept alive, or opened and silent). When every connection has a request in
  flight, the newcomer waits in a reserve slot (`RESERVE`) for its request line, at most
  `RESERVE_HEAD_S`: a `GET /health` or `/ready` is served there (probes must not restart
  a busy gateway); any other request joins the queue (`QUEUE`, first come first served),
  and is let in as soon as a connection closes or goes idle, or answered 503 after
  `queue_timeout_s`. A full reserve gives the slot of its oldest connection still without
  its head to the newcomer (503) once that one had `FRESH_S`, so slow sockets
  cannot hold it.
- While the queue is full, or the reserve full of young connections, the gateway stops
  accepting (`Slots.acceptor`, `app.api.accept`): newcomers wait in the kernel's backlog,
  connected, as HAProxy's `maxconn` leaves them; a burst waits instead of being cut.
- A refusal (408, 431, 503) is answered outside the parser and lingers
  (`app.api.refusals`), so the client reads it instead of a TCP reset.

- Each request's scope holds its `ClientLink` (`app.api.client_link`): the relay learns
  there that its client left, and `BodyGuard` that the body is all in, without a task
  or a timer of their own per request.
- A response's status line and headers wait for its first body bytes (`OneWrite`, at
  most until the loop's next turn): uvicorn writes them apart, so an answer ready at once
  cost two writes, two segments and two wake-ups of the client; now one.

Only the connection layer lives here; the body's size and time are
`app.api.middleware.BodyGuard`'s. (h11's implementation bounds a head by itself, but costs
about a quarter of the gateway's throughput: measured with `bench/overhead.py`.)
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Protocol

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.api.capacity import ConnectionCap, current_file_limit, sized
from app.api.client_link import LINK_KEY, ClientLink
from app.api.intake import Intake
from app.api.one_write import OneWrite
from app.api.refusals import Lingering, linger, raw_response
from app.errors import GatewayError, RequestHeadersTooLarge, RequestTimeout, TooManyConnections
from app.settings.root import ServerConfig

_HEAD_END = b"\r\n\r\n"
RESERVE = 64  # connections over the cap waiting to show they are a health probe
RESERVE_HEAD_S = 2.0  # (at most header_timeout_s) for the request line to arrive there
# A connection this new and silent keeps its place (in a burst every client connects
# before any request is read); older, it is closed to make room, or its reserve slot
# handed over.
FRESH_S = 0.25
QUEUE = 256  # requests over the cap waiting for a connection; more wait in the backlog
_QUEUED_BYTES = 64 * 1024  # a queued request's bytes read ahead; the rest waits unread
PROBE_PATHS = (b"/health", b"/ready")
_PROBE_LINE_MAX = 2048  # a reserve connection's request line longer than this is refused

Slot = dict["GatewayProtocol", None]


class Acceptor(Protocol):
    """What the connection cap needs of the listener (`app.api.accept.Acceptor`)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class Slots:
    """One server's connections: the cap, and those that can make room at it, oldest first
    (a dict keeps insertion order, so finding the oldest and moving one is O(1))."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.connections: set[Any] = set()  # uvicorn's (the server's): every one open
        self.fresh: Slot = {}  # silent since opening: oldest first
        self.partial: Slot = {}  # a head begun but not complete: oldest head first
        self.idle: Slot = {}  # kept alive between requests
        # Over the cap: each waiting for its request line (its gate), or serving a probe (None).
        self.reserve: dict[GatewayProtocol, _Gate | None] = {}
        self.queue: dict[GatewayProtocol, _Gate] = {}  # a request each, oldest first
        self.lingering = Lingering()  # refused, their answer on its way (`app.api.refusals`)
        self.intake = Intake()  # new requests a turn of the loop takes in
        self.acceptor: Acceptor | None = None  # set by the server that accepts
        self.accepting = True
        self._reserve_timer: asyncio.TimerHandle | None = None
        self._fresh_timer: asyncio.TimerHandle | None = None

    def within(self) -> int:
        """Connections counted against the cap (all but those waiting over it)."""
        return len(self.connections) - len(self.reserve) - len(self.queue)

    def room(self) -> int:
        """How many more connections to accept now: under the cap, and in the reserve."""
        return max(self.cap - self.within(), 0) + max(RESERVE - len(self.reserve), 0)

    def view(self, sizing: ConnectionCap | None = None) -> dict[str, Any]:
        """`GET /status`'s `connections`: the cap, how it was sized, and its use now."""
        files = None if sizing is None else sizing.files
        return {
            "max": self.cap,
            "sized_by": None if sizing is None else sizing.source,
            "summary": None if sizing is None else sizing.describe(),
            "warning": None if sizing is None else sizing.warning(),
            "file_limit": None if files is None else {"soft": files.soft, "hard": files.hard},
            "backlog": None if sizing is None else sizing.backlog,  # the listen queue in force
            "open": self.within(),
            "queued": len(self.queue),  # requests over the cap waiting for one
            "held": len(self.intake.waiting),  # new requests waiting for the loop's next turns
            "reserve": len(self.reserve),  # over the cap, showing their request line
            "lingering": len(self.lingering),  # refused, their answer read by the client
            "accepting": self.accepting,  # False: newcomers wait in the kernel's backlog
        }

    def make_room(self, newcomer: GatewayProtocol | None) -> bool:
        """Close the incomplete head begun longest ago, else the connection idle longest,
        else the one silent longest since it opened (once it had `FRESH_S`: in a burst,
        every client connects before any request is read); False when there is none."""
        victim = next(iter(self.partial), None)
        if victim is None:
            victim = next(iter(self.idle), None)
        if victim is None:
            victim = next((c for c in self.fresh if c is not newcomer), None)
            if victim is None or victim.loop.time() - victim.opened < FRESH_S:
                return False
        victim._leave_slots()
        self.connections.discard(victim)
        victim._disarm_head_timer()
        victim.transport.close()
        return True

    def let_in(self) -> None:
        """Queued requests take the room there is (or can be made), oldest first; while
        some wait, again when the oldest silent connection is no longer fresh."""
        while self.queue and (self.within() < self.cap or self.make_room(None)):
            waiting = next(iter(self.queue))
            waiting._from_queue(self.queue.pop(waiting))
        if self.queue and self.fresh and self._fresh_timer is None:
            oldest = next(iter(self.fresh))
            self._fresh_timer = oldest.loop.call_at(oldest.opened + FRESH_S, self._fresh_aged)
        self.steer()

    def _fresh_aged(self) -> None:
        self._fresh_timer = None
        self.let_in()

    def steer(self) -> None:
        """Accept newcomers, or leave them in the kernel's backlog: while the queue is
        full, or every reserve slot is waiting for a request line (until the oldest of
        them had `FRESH_S`, and a newcomer may take its slot)."""
        self._accept(len(self.queue) < QUEUE and len(self.reserve) < RESERVE)
        if len(self.reserve) >= RESERVE and self._reserve_timer is None:
            loop = asyncio.get_running_loop()
            self._reserve_timer = loop.call_later(FRESH_S, self._reserve_aged)

    def _reserve_aged(self) -> None:
        self._reserve_timer = None
        self._accept(len(self.queue) < QUEUE)  # one newcomer may take the oldest slot

    def _accept(self, want: bool) -> None:
        if want == self.accepting or self.acceptor is None:
            return
        self.accepting = want
        if want:
            self.acceptor.resume()
        else:
            self.acceptor.pause()


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
        self.slot: Slot | None = None  # which of `slots.fresh`/`.partial`/`.idle` holds this
        self.opened = 0.0  # the loop's time when it connected
        self.reserved = False  # admitted over the cap (a reserve slot)
        self.held: bytes | None = None  # a new request's bytes, waiting for its turn (`Intake`)
        self.watched: set[ClientLink] = set()  # its requests' links a relay watches

    @classmethod
    def configured(cls, limits: ServerConfig, cap: int | None = None) -> type[GatewayProtocol]:
        """The protocol class to give uvicorn (`http=`) for these limits (one per server):
        at most `cap` connections (`app.api.capacity`), else `limits.max_connections`,
        else what this process's file limit holds."""
        if cap is None:
            cap = limits.max_connections or sized(current_file_limit().soft)
        return type("ConfiguredGatewayProtocol", (cls,), {"limits": limits, "slots": Slots(cap)})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        slots = self.slots
        slots.connections = self.connections
        self.opened = self.loop.time()
        self._arm_head_timer()
        self._enter(slots.fresh)
        if slots.within() > slots.cap and not slots.make_room(self):
            self._admit_over_cap()

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave_slots()
        super().connection_lost(exc)
        for link in tuple(self.watched):
            link.lost()
        if not self.reserved and self.slots.queue:  # its room goes to a queued request
            self.slots.let_in()

    def data_received(self, data: bytes) -> None:
        if self.held is not None:  # read before its pause took effect
            self.held += data
            return
        new = self.head_bytes == 0 and not self._head_tail  # a new request: in its turn
        if new and not self.slots.intake.admit(self, self.loop):
            self._hold(data)
            return
        self._received(data)

    def _hold(self, data: bytes) -> None:
        """Wait for the turn (`take_in`): reading paused, no header timeout meanwhile (the
        request came whole or in part; the loop's pace is not the client's), and not to
        be closed to make room (it has a request)."""
        self.held = data
        self.transport.pause_reading()
        self._disarm_head_timer()
        self._enter(None)

    def take_in(self) -> None:
        data, self.held = self.held, None
        if data is None or self.transport.is_closing():
            return
        self.transport.resume_reading()
        self._received(data)

    def _received(self, data: bytes) -> None:
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
        cycle = self.cycle
        if cycle is not None and cycle is not before:
            cycle.transport = OneWrite(self.transport, cycle, self.loop)  # type: ignore[assignment]
            cycle.scope[LINK_KEY] = ClientLink(cycle, self.flow, self.watched)  # type: ignore[typeddict-unknown-key]
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
            if self.slots.queue:  # a request waits: this idle connection makes room
                self.slots.let_in()

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
        if self.held is not None:
            self.held = None
            self.slots.intake.forget(self)
        if self.reserved:
            slots = self.slots
            gate = slots.reserve.pop(self, None) or slots.queue.pop(self, None)
            if gate is not None:
                gate.stop()
            slots.steer()

    def _admit_over_cap(self) -> None:
        """Every connection has a request in flight: wait in a reserve slot for the request
        line (`_Gate`). A full reserve hands the slot of its oldest connection still
        waiting for its head over, once that one had `FRESH_S` (503); until then
        the newcomer comes in beside it, and the listener pauses (`Slots.steer`)."""
        self._enter(None)
        self._disarm_head_timer()
        reserve = self.slots.reserve
        if len(reserve) >= RESERVE:
            # Waiting: for its request line (a gate), or for the rest of a probe's head.
            oldest = next(
                (c for c, gate in reserve.items() if gate is not None or c.head_bytes is not None),
                None,
            )
            gate = reserve.get(oldest) if oldest is not None else None
            if oldest is not None and (gate is None or gate.age() >= FRESH_S):
                oldest._refuse(oldest._too_many())
        self.reserved = True
        gate = _Gate(self, min(RESERVE_HEAD_S, self.limits.header_timeout_s))
        reserve[self] = gate
        self.transport.set_protocol(gate)
        self.slots.steer()

    def _asks(self, gate: _Gate) -> None:
        """A reserve connection's request line is not a probe: in at once if there is room
        now, else into the queue for at most `queue_timeout_s`."""
        slots = self.slots
        del slots.reserve[self]
        slots.queue[self] = gate
        gate.queued(self.limits.queue_timeout_s)
        slots.let_in()

    def _from_queue(self, gate: _Gate) -> None:
        """In: a connection like any other from here, its bytes read so far parsed now."""
        gate.stop()
        self.reserved = False
        self.transport.set_protocol(self)
        self.transport.resume_reading()
        self._arm_head_timer()
        self.data_received(gate.head)

    def _pass_probe(self, head: bytes) -> None:
        """A reserve connection asked for a probe path: parse and serve it here."""
        self.slots.reserve[self] = None
        self.transport.set_protocol(self)
        self._arm_head_timer(min(RESERVE_HEAD_S, self.limits.header_timeout_s))
        self._received(head)  # a probe does not wait for the loop's intake

    def _too_many(self, waited_s: float | None = None) -> TooManyConnections:
        waited = "" if waited_s is None else f" (this one waited {waited_s:g} s for one)"
        return TooManyConnections(
            f"The gateway has {self.slots.cap} connections open, each with a request in "
            f"flight{waited}; retry shortly (see MICROSCHEDULER_SERVER__MAX_CONNECTIONS).",
        )

    def _refuse(self, err: GatewayError) -> None:
        """Answer outside the parser (unless a response has started), drop the connection
        from the server's books, and close it gracefully (`linger`)."""
        within = not self.reserved  # its room goes to a queued request
        self._leave_slots()
        self._disarm_head_timer()
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        if within and self.slots.queue:
            self.slots.let_in()
        cycle = self.cycle
        started = cycle is not None and cycle.response_started
        if cycle is not None:
            if not cycle.response_complete:
                cycle.disconnected = True  # the application's sends are dropped from now on
            cycle.message_event.set()
        if self.flow is not None:
            self.flow.resume_writing()
        answer = None if started else raw_response(err)
        linger(self.transport, answer, self.slots.lingering, self.loop)


class _Gate(asyncio.Protocol):
    """A connection's protocol while it waits over the cap: in a reserve slot until its
    request line shows what it asks (a `GET /health` or `/ready` goes back to its
    `GatewayProtocol`, anything else to the queue), then queued until there is room,
    reading ahead at most `_QUEUED_BYTES`. Times out with 503."""

    def __init__(self, owner: GatewayProtocol, timeout_s: float) -> None:
        self.owner = owner
        self.head = b""
        self.since = owner.loop.time()
        self.asked = False  # its request line came (and was not a probe's)
        self.timer: asyncio.TimerHandle | None = owner.loop.call_later(timeout_s, self._refuse)

    def age(self) -> float:
        return self.owner.loop.time() - self.since

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def queued(self, timeout_s: float) -> None:
        self.stop()
        self.timer = self.owner.loop.call_later(timeout_s, self._refuse, timeout_s)
        self._bound()

    def data_received(self, data: bytes) -> None:
        self.head += data
        if self.asked:
            self._bound()
            return
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
            self.asked = True
            self.owner._asks(self)

    def _bound(self) -> None:
        if len(self.head) >= _QUEUED_BYTES:  # the rest stays in the kernel's buffers
            self.owner.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop()
        self.owner.connection_lost(exc)

    def _refuse(self, waited_s: float | None = None) -> None:
        self.timer = None
        self.owner._refuse(self.owner._too_many(waited_s))
