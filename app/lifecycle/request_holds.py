"""The data-plane half of a backend: the requests that hold it (leases) and those held
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
- The time a request is held is counted on it (`app.activity.add_wait`): `queue` for a
  slot, `wake` for the start, and of that, `yield` while the start waited for memory
  other models hold (`Server.vram_waited_s`).

`app.lifecycle.backend.Backend` is the one subclass: it owns these fields and the
lifecycle (`_next_step`, `_unavailable`, `start_progress`); they are split only to keep
each module readable.
"""

from __future__ import annotations

import asyncio
import math
import time

from app.activity import WaitKind, add_wait
from app.errors import GatewayError, WakeTimeout
from app.lifecycle.blocks import Blocks
from app.lifecycle.lease import Lease, Leases, WaitNotice, wait_without_owning
from app.lifecycle.queue import Ticket, TicketQueue, WaitReason, no_slot, queue_full
from app.lifecycle.server import Server
from app.lifecycle.state import BackendState
from app.settings import BackendConfig
from app.settings.keys import Priority


class Holding:
    # Set by Backend.__init__.
    name: str
    config: BackendConfig
    state: BackendState
    _blocks: Blocks
    _lock: asyncio.Lock
    _queue: TicketQueue
    _leases: Leases
    _wake_notice_s: float
    server: Server
    # The schedules holding it warm (`keep_warm` windows): no idle stop while any does.
    kept_warm: frozenset[str] = frozenset()

    def _next_step(self, *, backoff: bool) -> tuple[asyncio.Task[None], bool] | None:
        """Under the lock: None when ready, else the task to wait for and whether it is
        a start (see Backend)."""
        raise NotImplementedError

    @property
    def lazy(self) -> bool:
        """Started on demand and idle-stopped (see Backend)."""
        raise NotImplementedError

    def _unavailable(self) -> GatewayError:
        """Why it cannot take requests now (see Backend)."""
        raise NotImplementedError

    def start_progress(self) -> str | None:
        """While starting: what the start waits for (see Backend)."""
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        """Requests holding a lease (relaying through it)."""
        return self._leases.in_flight

    @property
    def waiting(self) -> int:
        """Requests held: until it is ready, or for a slot (`queued`)."""
        return len(self._queue)

    @property
    def queued(self) -> int:
        """Requests held for a slot on the ready backend (`max_inflight` in flight)."""
        return self._queue.count(WaitReason.SLOT)

    @property
    def last_used(self) -> float:
        """`time.monotonic()` when a request last began or ended."""
        return self._leases.last_used

    def idle_s(self, now: float | None = None) -> float:
        """Seconds since the last request ended (0 while requests are in flight)."""
        return self._leases.idle_s(now)

    def idle_stop_in_s(self, now: float | None = None) -> float | None:
        """Seconds until the reaper stops (or puts to sleep) this backend as idle past
        `idle_ttl_s`; None when no idle stop is counting down: pinned, no TTL, not ready,
        or requests in flight or held."""
        ttl = self.config.idle_ttl_s
        if (
            not self.lazy  # lazy or standby: what the reaper stops (`_idle_past_ttl`)
            or ttl <= 0
            or self.state is not BackendState.READY
            or self._leases.in_flight
            or self._queue
            or self.kept_warm
        ):
            return None
        return max(0.0, ttl - self._leases.idle_s(now))

    async def acquire(
        self,
        on_wait: WaitNotice | None = None,
        *,
        max_wait_s: float | None = None,
        priority: Priority = Priority.NORMAL,
    ) -> Lease:
        """A lease on the ready backend; starts it if needed and holds the caller meanwhile
        (and while `max_inflight` requests are in flight), in the queue's order.

        Raises `BackendUnavailable` (blocked, failed, refused, queue full, no free slot in
        time) or `WakeTimeout` (still not ready after `max_wait_s`, or the backend's own
        `max_wait_s` when that is shorter; a fallback chain passes a shorter one).
        """
        limit = self.config.max_inflight
        if (
            self.state is BackendState.READY
            and not self._blocks
            and (limit is None or (self._leases.in_flight < limit and not self._queue))
        ):
            return self._leases.take()  # the hot path: no lock, no await
        self._check_blocked()
        if len(self._queue) >= self.config.max_waiting:
            raise queue_full(self.name, self.state, len(self._queue))
        wait_s = min(self.config.max_wait_s, math.inf if max_wait_s is None else max_wait_s)
        ticket = self._queue.enter(priority, wait_s)
        try:
            lease = await self._until_ready(
                ticket, backoff=True, max_wait_s=wait_s, on_wait=on_wait
            )
        finally:
            self._queue.leave(ticket)
            if ticket.lease is not None:  # granted as its holder went away: give it back
                ticket.lease.release()
        assert lease is not None
        return lease

    def keep_warm(self, holder: str, *, on: bool) -> None:
        """Hold it warm for `holder` (no idle stop), or let that hold go."""
        self.kept_warm = self.kept_warm | {holder} if on else self.kept_warm - {holder}

    async def warm_up(self) -> bool:
        """Begin its start (or wake) without waiting for it, as a request would; the
        start is the backend's own task, so nobody's going away cancels it. False when it
        may not start now (blocked, failed in its backoff); True when ready or starting."""
        async with self._lock:
            try:
                self._next_step(backoff=True)
            except GatewayError:
                return False
        return True

    async def _until_ready(
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
        (`_grant`), and return its lease; without one (a start's own wait), return None."""
        began = time.monotonic() if ticket is None else ticket.arrived
        deadline = None if max_wait_s is None else began + max_wait_s
        while True:
            async with self._lock:
                if ticket is not None and ticket.lease is None and self._serves(ticket):
                    self._grant()
                if ticket is not None and ticket.lease is not None:
                    lease, ticket.lease = ticket.lease, None
                    return lease
                if ticket is not None and self._serves(ticket):
                    self._queue.set_reason(ticket, WaitReason.SLOT)
                    task: asyncio.Future[None] = ticket.armed()
                    joined_start = False
                else:
                    if ticket is not None:
                        self._queue.set_reason(ticket, WaitReason.WAKE)
                    step = self._next_step(backoff=backoff)
                    if step is None:  # ready (a ticket would have been served above)
                        return None
                    task, joined_start = step
            slot = ticket is not None and ticket.reason is WaitReason.SLOT
            waited_from, vram_from = time.monotonic(), self.server.vram_waited_s
            try:
                done = await wait_without_owning(
                    task, began=began, deadline=deadline, on_wait=on_wait,
                    every_s=self._wake_notice_s,
                    detail=self._slot_detail if slot else self.start_progress,
                )  # fmt: skip
            finally:
                if ticket is not None:
                    self._count_wait(slot, waited_from, vram_from)
            if not done and ticket is not None and ticket.lease is not None:
                continue  # granted as the deadline passed: the loop hands the lease over
            if not done:
                assert max_wait_s is not None
                if slot:
                    raise no_slot(self.name, max_wait_s, self.config.max_inflight, self.queued)
                raise WakeTimeout(
                    f"backend {self.name!r} is still {self.state} after {max_wait_s:g}s "
                    "(max_wait_s); retry later"
                )
            if (
                joined_start
                and self.state is not BackendState.READY
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
        held = min(waited, max(0.0, self.server.vram_waited_s - vram_since))
        if held > 0:
            add_wait(WaitKind.YIELD, held)
        add_wait(WaitKind.WAKE, waited - held)

    def _serves(self, ticket: Ticket) -> bool:
        """Whether `ticket` may have a slot: the backend is ready, or draining a stop that
        began while the ticket was queued on the ready backend (collated)."""
        return self.state is BackendState.READY or (
            self.state is BackendState.STOPPING and ticket.collated
        )

    def _grant(self) -> None:
        """Give the free slots to queued tickets in queue order: to any while ready, to the
        collated ones while a stop drains. Synchronous, like the hot path: no lock holder
        awaits between changing the state and letting go of the lock, so the lease is
        taken in the state seen here (a stop cannot slip in between)."""
        state = self.state
        if self._queue and state in (BackendState.READY, BackendState.STOPPING):
            self._queue.grant(
                self._leases,
                self.config.max_inflight,
                collated_only=state is BackendState.STOPPING,
            )

    def _slot_detail(self) -> str:
        return f"queued for a slot, max_inflight {self.config.max_inflight}"

    def _check_blocked(self) -> None:
        refusal = self._blocks.refusal(self.name, time.time())
        if refusal is not None:
            raise refusal
