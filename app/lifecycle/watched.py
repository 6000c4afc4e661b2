"""A backend's watch: its periodic check and its restart backoff (`Backend.watcher`).

- `watch()`, once per `health_interval_s` (`app.control.supervisor`): a health check
  (an idle server's less often, `app.control.polling`);
  a managed server found dead while ready or asleep fails the backend (or, scaled to 0 by
  its owner under kubernetes `scale: external`, stops it); an external server found
  healthy again is asked what it serves (it may be another server now).
- A pinned backend that is down (its start failed, its server died, admission found no
  room, or the sleep guard stopped it for a failed wake) is started again once its
  backoff has passed: 5 s doubling to 5 min with each failure in a row (`restart_in_s`,
  shown in `/backends`).

The watcher reads its backend through `Watched` and changes it only through the three
transitions it is given (`restart`, `fail`, `owner_stopped`), which the backend makes
under its lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from app.lifecycle.server import Server, exit_text
from app.lifecycle.state import BackendState, RestartBackoff, Stateful
from app.runtimes.base import Runtime

logger = logging.getLogger(__name__)


class Watched(Stateful, Protocol):
    """What the watch reads of its backend."""

    @property
    def runtime(self) -> Runtime: ...
    async def learn(self) -> None: ...


class Watcher:
    def __init__(
        self,
        backend: Watched,
        server: Server,
        backoff_s: float,
        *,
        restart: Callable[[], Awaitable[None]],
        fail: Callable[[str], Awaitable[None]],
        owner_stopped: Callable[[], Awaitable[None]],
    ) -> None:
        self._backend = backend
        self._server = server
        self._restart = restart  # under the backend's lock: started again, if still down
        self._fail = fail
        self._owner_stopped = owner_stopped
        self.backoff = RestartBackoff(backoff_s)  # after failures in a row
        self.refused = False  # stopped because admission found no room (kind no_vram)
        # Stopped by the sleep guard for a failed wake: a pinned one starts again cold.
        self.guard_stopped = False
        self.learn_due = True  # an external server: learn at the next health check passed

    async def check_health(self) -> bool:
        """One health check of its server; records the outcome. Never raises."""
        return await self._server.check_health()

    async def watch(self, *, health: bool = True) -> None:
        """One periodic check: health, whether a managed server died while ready, and a
        restart of a failed pinned backend once its backoff has passed. `health`: whether
        this round asks its server's health (False: an idle server, asked less often,
        `app.control.polling`; the runtime is still asked whether the server exited)."""
        backend, server = self._backend, self._server
        if self.down and self.retry_in() == 0:
            await self._restart()
            return
        if backend.state in (BackendState.READY, BackendState.SLEEPING) and backend.runtime.managed:
            exited = await server.exited()
            if exited is not None and exited.stopped_by_owner:
                await self._owner_stopped()
                return
            if exited is not None:
                code, more = exit_text(exited)
                await self._fail(f"its server exited with {code}{more}")
                return
        if not health:
            return
        if (
            backend.state in (BackendState.READY, BackendState.FAILED)
            or not backend.runtime.managed
        ):
            healthy = await server.check_health()
            self.learn_due = self.learn_due or not healthy  # back as another server?
            if healthy and self.learn_due and backend.state is BackendState.READY:
                await backend.learn()

    @property
    def down(self) -> bool:
        """A pinned backend the watch starts again once its backoff has passed: it failed
        (its start, or its server died), admission found no room for its start, or the
        sleep guard stopped it for a failed wake."""
        backend = self._backend
        state = backend.state
        stopped = state is BackendState.STOPPED and (self.refused or self.guard_stopped)
        down = state is BackendState.FAILED or stopped
        return down and not backend.lazy and backend.runtime.managed

    def retry_in(self) -> float:
        """Seconds until a failed backend may be started again (0: now)."""
        return self.backoff.retry_in(time.monotonic())

    @property
    def restart_in_s(self) -> float | None:
        """A pinned backend that is down: seconds until the watch starts it again (the
        backoff doubles from 5 s to 5 min with each failure in a row); None otherwise."""
        return self.retry_in() if self.down else None

    def failed(self) -> None:
        """A failure in a row (a start failed or was refused, its server died): the
        backoff grows, and a pinned backend's restart is logged."""
        self.backoff.failed(time.monotonic())
        if self.down:
            logger.warning(
                "pinned backend down, restarting in the background backend=%s "
                "retry_in_s=%.0f failures=%d",
                self._backend.name,
                self.retry_in(),
                self.backoff.failures,
            )
