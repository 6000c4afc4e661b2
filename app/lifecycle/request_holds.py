"""A backend's requests (`Backend.requests`): those that hold it (leases) and those held
for it (the queue), and `acquire()`, the data plane's only way in.

- `acquire()` returns a `Lease` on a ready backend, starting a stopped one and holding
  the request meanwhile (bounded by `max_waiting` and `max_wait_s`). It decides under
  the backend's lock, so a request that arrives while a stop is in progress waits for
  the stop and then starts the backend again.
- Held requests wait in the backend's one queue (`app.lifecycle.queue`): for the start,
  and with `max_inflight` for a slot. Leases are granted to them synchronously, in queue
  order, whenever a slot may have freed: on a lease's release, on becoming ready, on a
  ticket's arrival while ready. A stop begun on the ready backend still serves the
  tickets queued before it (`TicketQueue.collate`; the drain waits for them too).
- A request that leaves before its lease (its client went away, or its backend's own
  `max_wait_s` ran out) tells the backend (`left`): a lazy start that nobody waits for
  any more may be cancelled (`app.lifecycle.wanted`).
- The time a request is held is counted on it (`app.activity.add_wait`): `queue` for a
  slot, `wake` for the start, and of that, `yield` while the start waited for memory
  other models hold (`Server.vram_waited_s`).

The part reads its backend through `Held` and decides nothing of its lifecycle: it asks
the backend for the next step (`next_step`: start it, join its start, wait for its stop)
and for why it cannot serve (`unavailable`), both under the backend's lock.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from app.activity import WaitKind, add_wait
from app.errors import GatewayError, WakeTimeout
from app.lifecycle.blocks import Blocks
from app.lifecycle.floor import ResidencyFloor
from app.lifecycle.key_turns import NO_KEY, KeyShare
from app.lifecycle.lease import Lease, Leases, WaitNotice, wait_without_owning
from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.queue import Ticket, TicketQueue, WaitReason, no_slot, queue_full
from app.lifecycle.server import Server
from app.lifecycle.state import BackendState, Stateful
from app.settings.keys import Priority

logger = logging.getLogger(__name__)

# The backend's next step for a caller, under its lock: None when ready, else the task to
# wait for and whether it is a start (a stop in progress is waited for, then decided again).
Step = tuple[asyncio.Future[None], bool] | None
# The backend's next step, asked with (`backoff`, `explicit`): `explicit` for a caller that
# is not a held request (an admin start, a restore, a warm-up), whose start is never
# cancelled for want of waiting requests.
NextStep = Callable[[bool, bool], Step]


class Held(Stateful, Protocol):
    """What the requests read of their backend."""

    @property
    def blocks(self) -> Blocks: ...
    @property
    def server(self) -> Server: ...  # the part of a wait that was for others' memory
    def start_progress(self) -> str | None: ...


class RequestHolds:
    def __init__(
        self,
        backend: Held,
        metrics: LifecycleMetrics,
        changed: Callable[[], None] | None,
        *,
        lock: asyncio.Lock,
        next_step: NextStep,
        unavailable: Callable[[], GatewayError],
        left: Callable[[bool], None],
        went_idle: Callable[[], None],
        wake_notice_s: float,
    ) -> None:
        self._backend = backend
        self._blocks = backend.blocks  # one object for the backend's life
        self._lock = lock  # the backend's: guards its transitions
        self._next_step = next_step
        self._unavailable = unavailable
        self._went_idle = went_idle
        self._left = left
        self._wake_notice_s = wake_notice_s
        self._drain_timeouts = metrics.drain_timeouts.labels(backend.name)
        self.queue = TicketQueue(backend.name, metrics, changed)
        self.leases = Leases(backend.name, metrics, changed, on_release=self._released)
        # The schedules holding it warm (`keep_warm` windows): no idle stop while any does.
        self.kept_warm: frozenset[str] = frozenset()
        # A client's `keep_alive` (app.lifecycle.floor): no idle stop, no eviction, until it ends.
        self.floor = ResidencyFloor()

    def _released(self) -> None:
        """A lease was given back: its slot to a queued ticket; when none is left in
        flight, admission hears it (a start may be waiting for this equal's turn)."""
        self.grant()
        if not self.leases.in_flight:
            self._went_idle()

    async def drain(self, drain_s: float) -> bool:
        """A stop's drain: the tickets collated for it granted, then up to `drain_s` for
        the requests in flight to end. True when it timed out (the stop goes ahead with
        them in flight). The collated tickets still queued then wait for the stop, like
        the later ones."""
        name, timed_out = self._backend.name, False
        self.grant()  # the collated tickets (none when it was not ready)
        if self.in_flight:
            logger.info("backend draining backend=%s in_flight=%d queued=%d drain_timeout_s=%g",
                        name, self.in_flight, self.queued, drain_s)  # fmt: skip
            if not await self.leases.drained(drain_s):
                timed_out = True
                self._drain_timeouts.inc()
                logger.warning("drain timed out, stopping with requests in flight backend=%s "
                               "in_flight=%d", name, self.in_flight)  # fmt: skip
        self.queue.uncollate()
        self.queue.wake_all()
        return timed_out

    @property
    def in_flight(self) -> int:
        """Requests holding a lease (relaying through it)."""
        return self.leases.in_flight

    @property
    def waiting(self) -> int:
        """Requests held: until it is ready, or for a slot (`queued`)."""
        return len(self.queue)

    @property
    def queued(self) -> int:
        """Requests held for a slot on the ready backend (`max_inflight` in flight)."""
        return self.queue.count(WaitReason.SLOT)

    @property
    def last_used(self) -> float:
        """`time.monotonic()` when a request last began or ended."""
        return self.leases.last_used

    def idle_s(self, now: float | None = None) -> float:
        """Seconds since the last request ended (0 while requests are in flight)."""
        return self.leases.idle_s(now)

    def idle_stop_in_s(self, now: float | None = None) -> float | None:
        """Seconds until the reaper stops (or puts to sleep) this backend as idle past
        `idle_ttl_s`; None when no idle stop is counting down: pinned, no TTL, not ready,
        or requests in flight or held."""
        backend = self._backend
        ttl = backend.config.idle_ttl_s
        if (
            not backend.lazy  # lazy or standby: what the reaper stops (`_idle_past_ttl`)
            or ttl <= 0
            or backend.state is not BackendState.READY
            or self.leases.in_flight
            or self.queue
            or self.kept_warm
        ):
            return None
        at = time.monotonic() if now is None else now
        floor = self.floor.left_s(at)
        if math.isinf(floor):
            return None
        return max(0.0, ttl - self.leases.idle_s(at), floor)

    async def acquire(
        self,
        on_wait: WaitNotice | None = None,
        *,
        max_wait_s: float | None = None,
        priority: Priority = Priority.NORMAL,
        share: KeyShare = NO_KEY,
    ) -> Lease:
        """A lease on the ready backend; starts it if needed and holds the caller meanwhile
        (and while `max_inflight` requests are in flight), in the queue's order: by
        `priority`, and within it in turn with other keys by `share` (its client key).

        Raises `BackendUnavailable` (blocked, failed, refused, queue full, no free slot in
        time) or `WakeTimeout` (still not ready after `max_wait_s`, or the backend's own
        `max_wait_s` when that is shorter; a fallback chain passes a shorter one).
        """
        backend = self._backend
        config = backend.config
        limit = config.max_inflight
        if (
            backend.state is BackendState.READY
            and not self._blocks
            and (limit is None or (self.leases.in_flight < limit and not self.queue))
        ):
            return self.leases.take()  # the hot path: no lock, no await
        self._blocks.check(backend.name)
        if len(self.queue) >= config.max_waiting:
            raise queue_full(backend.name, backend.state, len(self.queue))
        wait_s = min(config.max_wait_s, math.inf if max_wait_s is None else max_wait_s)
        ticket = self.queue.enter(priority, wait_s, share=share)
        kept = False  # whether its leaving keeps the start going (a shorter wait ran out)
        try:
            lease = await self.until_ready(ticket, backoff=True, max_wait_s=wait_s, on_wait=on_wait)
        except WakeTimeout:
            # A caller's own shorter wait (a fallback chain moving on to its next entry):
            # its start goes on. The backend's own max_wait_s: the client is gone.
            kept = wait_s < config.max_wait_s
            raise
        finally:
            self.queue.leave(ticket)
            if ticket.lease is not None:  # granted as its holder went away: give it back
                ticket.lease.release()
            self._left(kept)  # the backend may cancel a start nobody waits for any more
        assert lease is not None
        return lease

    def held_warm(self, now: float) -> bool:
        """Kept from its idle stop: a schedule's `keep_warm` window, a client's
        `keep_alive` floor (`app.lifecycle.floor`)."""
        return bool(self.kept_warm) or self.floor.left_s(now) > 0

    def keep_warm(self, holder: str, *, on: bool) -> None:
        """Hold it warm for `holder` (no idle stop), or let that hold go."""
        self.kept_warm = self.kept_warm | {holder} if on else self.kept_warm - {holder}

    async def warm_up(self) -> bool:
        """Begin its start (or wake) without waiting for it, as a request would; the
        start is the backend's own task, so nobody's going away cancels it. False when it
        may not start now (blocked, failed in its backoff); True when ready or starting."""
        async with self._lock:
            try:
                self._next_step(True, True)
            except GatewayError:
                return False
        return True

    async def until_ready(
        self,
        ticket: Ticket | None,
        *,
        backoff: bool,
        max_wait_s: float | None,
        on_wait: WaitNotice | None = None,
    ) -> Lease | None:
        """Decide under the lock, wait without it, until ready: start it, join its start,
        or wait for a stop and decide again; a start it joined that did not end ready
        raises why. Then, for a request's `ticket`, until the ticket is granted a slot
        (`grant`), and return its lease; without one (a start's own wait), return None."""
        backend = self._backend
        began = time.monotonic() if ticket is None else ticket.arrived
        deadline = None if max_wait_s is None else began + max_wait_s
        while True:
            async with self._lock:
                if ticket is not None and ticket.lease is None and self._serves(ticket):
                    self.grant()
                if ticket is not None and ticket.lease is not None:
                    lease, ticket.lease = ticket.lease, None
                    return lease
                if ticket is not None and self._serves(ticket):
                    self.queue.set_reason(ticket, WaitReason.SLOT)
                    task: asyncio.Future[None] = ticket.armed()
                    joined_start = False
                else:
                    if ticket is not None:
                        self.queue.set_reason(ticket, WaitReason.WAKE)
                    step = self._next_step(backoff, ticket is None)
                    if step is None:  # ready (a ticket would have been served above)
                        return None
                    task, joined_start = step
            slot = ticket is not None and ticket.reason is WaitReason.SLOT
            waited_from, vram_from = time.monotonic(), backend.server.vram_waited_s
            try:
                done = await wait_without_owning(
                    task, began=began, deadline=deadline, on_wait=on_wait,
                    every_s=self._wake_notice_s,
                    detail=self._slot_detail if slot else backend.start_progress,
                )  # fmt: skip
            finally:
                if ticket is not None:
                    self._count_wait(slot, waited_from, vram_from)
            if not done and ticket is not None and ticket.lease is not None:
                continue  # granted as the deadline passed: the loop hands the lease over
            if not done:
                assert max_wait_s is not None
                if slot:
                    limit = backend.config.max_inflight
                    raise no_slot(backend.name, max_wait_s, limit, self.queued)
                raise WakeTimeout(
                    f"backend {backend.name!r} is still {backend.state} after {max_wait_s:g}s "
                    "(max_wait_s); retry later"
                )
            if (
                joined_start
                and backend.state is not BackendState.READY
                and (ticket is None or (ticket.lease is None and not ticket.collated))
            ):
                raise self._unavailable()

    def _count_wait(self, slot: bool, since: float, vram_since: float) -> None:
        """Count the request's wait since `since`: for a slot, or for the start (the part
        its start waited for memory other models hold, `yield`)."""
        waited = time.monotonic() - since
        if slot:
            add_wait(WaitKind.QUEUE, waited)
            return
        held = min(waited, max(0.0, self._backend.server.vram_waited_s - vram_since))
        if held > 0:
            add_wait(WaitKind.YIELD, held)
        add_wait(WaitKind.WAKE, waited - held)

    def _serves(self, ticket: Ticket) -> bool:
        """Whether `ticket` may have a slot: the backend is ready, or draining a stop that
        began while the ticket was queued on the ready backend (collated)."""
        state = self._backend.state
        return state is BackendState.READY or (state is BackendState.STOPPING and ticket.collated)

    def grant(self) -> None:
        """Give the free slots to queued tickets in queue order: to any while ready, to the
        collated ones while a stop drains. Synchronous, like the hot path: no lock holder
        awaits between changing the state and letting go of the lock, so the lease is
        taken in the state seen here (a stop cannot slip in between)."""
        state = self._backend.state
        if self.queue and state in (BackendState.READY, BackendState.STOPPING):
            self.queue.grant(
                self.leases,
                self._backend.config.max_inflight,
                collated_only=state is BackendState.STOPPING,
            )

    def _slot_detail(self) -> str:
        return f"queued for a slot, max_inflight {self._backend.config.max_inflight}"

    def take_over(self, old: RequestHolds) -> None:
        """The keep-warm holds of the backend this one replaces (a reload)."""
        self.kept_warm = old.kept_warm
        self.floor = old.floor
