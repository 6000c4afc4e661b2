"""One queue per backend: the requests held for it, in the order they get a lease.

A request is held (holds a `Ticket`) while its backend is not ready (reason `wake`), and
while it is ready but `max_inflight` requests are in flight already (reason
`max_inflight`). The order is `serve_order`: a ticket past half its own wait (the
backend's `max_wait_s`, or a fallback chain's shorter one) goes first (oldest first), so a
stream of high-priority requests cannot starve a low one past its own deadline; the rest
go by key priority, and within a priority the client keys take turns (weighted by their
`weight`: `app.lifecycle.key_turns`), each key's requests in arrival order.

The ordering is pure (`serve_order`, `next_ticket`); `TicketQueue` keeps the tickets,
their counts (the `requests_waiting` gauges) and the keys' turns (`KeyTurns`). No locks:
every change is synchronous. The backend grants (takes a lease on a ticket's behalf and
wakes its holder); see `app.lifecycle.backend`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from app.errors import BackendUnavailable, UnavailableKind
from app.lifecycle.key_turns import NO_KEY, KeyShare, KeyTurns
from app.lifecycle.lease import Lease, Leases
from app.metrics import Metrics
from app.settings.keys import Priority

NO_TURNS: Final[Mapping[str, int]] = MappingProxyType({})  # every key at 0


class WaitReason(StrEnum):
    """Why a ticket waits: the `reason` label of `requests_waiting`."""

    WAKE = "wake"  # its backend is not ready (starting, stopping, stopped)
    SLOT = "max_inflight"  # its backend is ready, with max_inflight requests in flight


@dataclass(eq=False, slots=True)
class Ticket:
    """One held request. `collated`: it was queued on a ready backend when a stop began,
    so the stop's drain still serves it."""

    rank: int  # Priority.rank: lower is served first
    seq: int  # arrival order within its backend
    arrived: float  # time.monotonic()
    aged_at: float = math.inf  # from then on it goes first: half its wait after arrival
    reason: WaitReason = WaitReason.WAKE
    collated: bool = False
    share: KeyShare = NO_KEY  # its client key: whose turn it takes
    lease: Lease | None = None  # granted: taken on its behalf, not yet handed over
    _signal: asyncio.Future[None] | None = field(default=None, repr=False)

    def armed(self) -> asyncio.Future[None]:
        """A fresh future the holder awaits; `wake()` resolves it."""
        self._signal = asyncio.get_running_loop().create_future()
        return self._signal

    def wake(self) -> None:
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(None)


def serve_order(
    ticket: Ticket, now: float, virtual: Mapping[str, int] = NO_TURNS
) -> tuple[int, int, int, int]:
    """The sort key of `ticket` at `now` (lower is served first): aged tickets (at or past
    their `aged_at`) by arrival, ahead of the rest by (priority, its key's virtual time in
    `virtual` (`KeyTurns.virtual`; none: 0), arrival)."""
    if now >= ticket.aged_at:
        return (0, 0, 0, ticket.seq)
    return (1, ticket.rank, virtual.get(ticket.share.name, 0), ticket.seq)


def next_ticket(
    tickets: Iterable[Ticket], now: float, virtual: Mapping[str, int] = NO_TURNS
) -> Ticket | None:
    """The ticket to serve first, or None when there is none. A linear scan: the keys
    change with time (aging, turns), and a queue is bounded by `max_waiting` (64 by
    default)."""
    return min(tickets, key=lambda t: serve_order(t, now, virtual), default=None)


class TicketQueue:
    """The held requests of one backend and their counts by reason."""

    def __init__(
        self, backend: str, metrics: Metrics, on_change: Callable[[], None] | None = None
    ) -> None:
        self._tickets: dict[int, Ticket] = {}  # by seq; insertion order is arrival order
        self._seq = 0
        self._counts = dict.fromkeys(WaitReason, 0)
        self._gauges = {why: metrics.waiting.labels(backend, why) for why in WaitReason}
        self._on_change = on_change  # the counts changed (live status)
        self._turns = KeyTurns()

    def __len__(self) -> int:
        return len(self._tickets)

    def count(self, reason: WaitReason) -> int:
        return self._counts[reason]

    def enter(
        self,
        priority: Priority,
        wait_s: float,
        now: float | None = None,
        *,
        share: KeyShare = NO_KEY,
    ) -> Ticket:
        """A ticket for a request of `share`'s key that waits at most `wait_s` (it ages at
        half of it)."""
        self._seq += 1
        arrived = time.monotonic() if now is None else now
        ticket = Ticket(
            priority.rank, self._seq, arrived, aged_at=arrived + wait_s / 2, share=share
        )
        rank = ticket.rank
        self._turns.entered(
            share.name, lambda: (t.share.name for t in self._tickets.values() if t.rank == rank)
        )
        self._tickets[ticket.seq] = ticket
        self._count(ticket.reason, 1)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """Take `ticket` out (granted, gone, or failed); a second call does nothing."""
        if self._tickets.pop(ticket.seq, None) is not None:
            self._count(ticket.reason, -1)
            self._turns.left(ticket.share.name)

    def holds(self, ticket: Ticket) -> bool:
        return ticket.seq in self._tickets

    def set_reason(self, ticket: Ticket, reason: WaitReason) -> None:
        if ticket.reason is not reason and self.holds(ticket):
            self._count(ticket.reason, -1)
            self._count(reason, 1)
        ticket.reason = reason

    def first(self, now: float, *, collated_only: bool) -> Ticket | None:
        tickets = self._tickets.values()
        virtual = self._turns.virtual
        if collated_only:
            return next_ticket((t for t in tickets if t.collated), now, virtual)
        return next_ticket(tickets, now, virtual)

    def take_first(self, now: float, *, collated_only: bool = False) -> Ticket | None:
        """The first ticket (`first`), out of the queue and counted as its key's turn."""
        ticket = self.first(now, collated_only=collated_only)
        if ticket is not None:
            self._turns.served(ticket.share)
            self.leave(ticket)
        return ticket

    def grant(self, leases: Leases, max_inflight: int | None, *, collated_only: bool) -> None:
        """While fewer than `max_inflight` (None: no limit) leases are held, take one for
        the first ticket (`serve_order`) and wake its holder."""
        now = time.monotonic()
        while max_inflight is None or leases.in_flight < max_inflight:
            ticket = self.take_first(now, collated_only=collated_only)
            if ticket is None:
                return
            ticket.lease = leases.take()
            ticket.wake()

    def collate(self) -> None:
        """A stop begins on the ready backend: every ticket queued now is served by its
        drain."""
        for ticket in self._tickets.values():
            ticket.collated = True

    def uncollate(self) -> None:
        """The drain is over: tickets still queued wait for the stop like later ones."""
        for ticket in self._tickets.values():
            ticket.collated = False

    def wake_all(self) -> None:
        """The backend's state changed: every holder decides again."""
        for ticket in self._tickets.values():
            ticket.wake()

    def _count(self, reason: WaitReason, delta: int) -> None:
        self._counts[reason] += delta
        self._gauges[reason].inc(delta)
        if self._on_change is not None:
            self._on_change()


def queue_full(backend: str, state: str, waiting: int) -> BackendUnavailable:
    return BackendUnavailable(
        f"backend {backend!r} is {state} and already holds {waiting} waiting requests "
        "(max_waiting); retry shortly",
        kind=UnavailableKind.QUEUE_FULL,
        retry_after_s=5,
    )


def no_slot(
    backend: str, waited_s: float, max_inflight: int | None, queued: int
) -> BackendUnavailable:
    """A request held `waited_s` (its `max_wait_s`) that got no slot on the ready backend.

    A 503 `backend_queue_full`, not a 504 wake timeout: the backend is up and answering,
    only busy. The client is told to retry shortly (Retry-After), and a fallback chain
    moves on without counting a failure against the entry's circuit, as for a full queue
    (a busy backend is not a broken one)."""
    return BackendUnavailable(
        f"backend {backend!r} had no free slot after {waited_s:g}s (max_wait_s): "
        f"max_inflight {max_inflight} requests are in flight and {queued} more are queued; "
        "retry shortly",
        kind=UnavailableKind.QUEUE_FULL,
        retry_after_s=5,
    )
