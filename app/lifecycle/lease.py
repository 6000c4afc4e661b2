"""Who holds a backend: the requests relaying through it (leases; those waiting for one are
in `app.lifecycle.queue`). A stop drains the leases; the reaper reads how long it has been
idle.

No locks here: every change is synchronous, so it cannot interleave with another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from app.metrics import Metrics, add

# Called every few seconds while a request is held, with the seconds waited so far and
# what the start is waiting for (None when there is nothing to say).
WaitNotice = Callable[[float, str | None], Awaitable[None]]


class Lease:
    """A request's hold on a backend, from routing to the last byte relayed."""

    __slots__ = ("_leases", "_released")

    def __init__(self, leases: Leases) -> None:
        self._leases = leases
        self._released = False

    def release(self) -> None:
        """Give the hold back; a second call does nothing."""
        if not self._released:
            self._released = True
            self._leases._give_back()


class Leases:
    def __init__(
        self,
        backend: str,
        metrics: Metrics,
        on_change: Callable[[], None] | None = None,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        self.in_flight = 0
        self.last_used = time.monotonic()  # when a request last began or ended
        self._drained = asyncio.Event()
        self._drained.set()
        self._in_flight_gauge = metrics.in_flight.labels(backend)
        self._on_change = on_change  # the counts changed (live status)
        # A slot freed: the backend grants it to a queued request at once, before the
        # drain below is told (a stop's drain also waits for the requests it collates).
        self._on_release = on_release

    def take(self) -> Lease:
        self.in_flight += 1
        self.last_used = time.monotonic()
        self._drained.clear()
        add(self._in_flight_gauge)
        if self._on_change is not None:
            self._on_change()
        return Lease(self)

    def _give_back(self) -> None:
        self.in_flight -= 1
        self.last_used = time.monotonic()
        add(self._in_flight_gauge, -1)
        if self._on_release is not None:
            self._on_release()
        if self.in_flight == 0:
            self._drained.set()
        if self._on_change is not None:
            self._on_change()

    def touch(self) -> None:
        """Count as used now (a backend that just became ready is not idle)."""
        self.last_used = time.monotonic()

    def idle_s(self, now: float | None = None) -> float:
        """Seconds since the last request ended (0 while requests are in flight)."""
        if self.in_flight:
            return 0.0
        return (time.monotonic() if now is None else now) - self.last_used

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no lease is held; False when `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._drained.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


async def wait_without_owning(
    task: asyncio.Future[Any],
    *,
    began: float,
    deadline: float | None,
    on_wait: WaitNotice | None,
    every_s: float,
    detail: Callable[[], str | None] | None = None,
) -> bool:
    """Wait for a start or stop that others share: cancelling this wait leaves `task`
    running. Calls `on_wait` every `every_s` meanwhile. False when `deadline` (monotonic;
    None: none) passed first."""
    while not task.done():
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        step = remaining
        if on_wait is not None:
            step = every_s if step is None else min(step, every_s)
        await asyncio.wait({task}, timeout=step)
        if task.done() or on_wait is None:
            continue
        if deadline is None or time.monotonic() < deadline:
            await on_wait(time.monotonic() - began, None if detail is None else detail())
    return True
