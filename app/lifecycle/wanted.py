"""No load nobody waits for: whether a backend's start under way is still wanted.

A cold start of a `lazy` backend begun only for held requests is not `kept`; it is
cancelled when the last of them leaves before it is ready (its client went away, or it
waited the backend's own `max_wait_s`) and none comes back within `start_cancel_grace_s`.
Any other reason keeps a start for good: an explicit start (`Backend.start()`: the admin
route, a restore, a profile, a schedule, a reload; a warm-up), a `pinned` or `standby`
backend, a wake from sleep, or a request whose own shorter wait ran out (a fallback chain
moving on). Admission evicts nobody for a start that is not wanted (`app.vram.arbiter`).

`StartWant` keeps the mark and the grace timer, and says so (event `start_cancelled`,
`microscheduler_start_cancelled_total`, the log); the backend stops the start, under its
lock, through its stop path (`Backend`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

from app.events import EventLog
from app.lifecycle.load import LoadStatus, StartClock
from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.state import BackendState
from app.tasks import cancel_and_wait, spawn

logger = logging.getLogger(__name__)

# How long a lazy start nobody waits for any more goes on before it is cancelled, so a
# client that retries at once finds it under way (settings: `start_cancel_grace_s`).
START_CANCEL_GRACE_S: Final = 2.0


class Held(Protocol):
    @property
    def waiting(self) -> int: ...  # requests held for the backend


class Starting(Protocol):
    """What it reads of its backend (`app.lifecycle.backend.Backend`)."""

    @property
    def name(self) -> str: ...
    @property
    def state(self) -> BackendState: ...
    @property
    def requests(self) -> Held: ...
    def load(self) -> LoadStatus | None: ...


class StartWant:
    def __init__(
        self,
        backend: Starting,
        clock: StartClock,
        metrics: LifecycleMetrics,
        events: EventLog | None,
        *,
        grace_s: float,
        cancel: Callable[[asyncio.Task[None] | None], Awaitable[None]],
    ) -> None:
        """`cancel(start)`: stop the start `start` if it is still under way and unwanted."""
        self._backend = backend
        self._clock = clock
        self._metrics = metrics
        self._events = events
        self._grace_s = grace_s
        self._cancel = cancel
        self.kept = True  # the start under way has a reason besides held requests
        self._timer: asyncio.Task[None] | None = None

    @property
    def wanted(self) -> bool:
        return self.kept or bool(self._backend.requests.waiting)

    @property
    def grace(self) -> asyncio.Task[None] | None:
        """The grace timer last begun (done once its start was cancelled or kept)."""
        return self._timer

    def unwanted_start(self, state: BackendState) -> bool:
        """Whether a backend in `state` has a start under way that nobody wants."""
        return state is BackendState.STARTING and not self.wanted

    def left(self, kept: bool, start: asyncio.Task[None] | None) -> None:
        """A held request left; `kept`: its own shorter wait ran out (the start goes on).
        When none is left waiting for a start not `kept`, its grace begins (again)."""
        if self._backend.state is not BackendState.STARTING or self.kept:
            return
        if kept:
            self.kept = True
        elif not self._backend.requests.waiting:
            if self._timer is not None:
                self._timer.cancel()
            name = f"start-unwanted:{self._backend.name}"
            self._timer = spawn(self._after_grace(start), name=name)

    async def _after_grace(self, start: asyncio.Task[None] | None) -> None:
        await asyncio.sleep(self._grace_s)  # a timer: a retry may come meanwhile
        await self._cancel(start)

    def cancelled(self, phase: str | None = None) -> str:
        """The start is cancelled (in `phase`; None: its load's): the event, the counter
        and the log line; returns the backend's reason for it."""
        load = self._backend.load()
        phase = phase or ("launching" if load is None else load.phase)
        spent = self._clock.elapsed_s() or 0.0
        name = self._backend.name
        self._metrics.start_cancelled.labels(name).inc()
        if self._events is not None:
            self._events.record(
                "start_cancelled", backend=name, phase=phase, seconds=round(spent, 3), waiters=0
            )
        logger.info(
            "start cancelled, nobody waits for it backend=%s phase=%s seconds=%.2f",
            name,
            phase,
            spent,
        )
        return f"start cancelled after {spent:.1f}s ({phase}): nobody waits for it"

    async def close(self) -> None:
        await cancel_and_wait(self._timer)
