"""The watched half of a backend: what its periodic check finds and does.

- `watch()`, once per `health_interval_s` (`app.control.supervisor`): a health check
  (an idle server's less often, `app.control.polling`);
  a managed server found dead while ready or asleep fails the backend (or, scaled to 0 by
  its owner under kubernetes `scale: external`, stops it); an external server found
  healthy again is asked what it serves (it may be another server now).
- A pinned backend that is down (its start failed, its server died, or admission found no
  room) is started again once its backoff has passed: 5 s doubling to 5 min with each
  failure in a row (`restart_in_s`, shown in `/backends`).

`app.lifecycle.backend.Backend` is the one subclass: it owns the fields and the
transitions used here; they are split only to keep each module readable, as
`app.lifecycle.request_holds` is.
"""

from __future__ import annotations

import asyncio
import logging

from app.lifecycle.blocks import Blocks
from app.lifecycle.server import Server, exit_text
from app.lifecycle.state import BackendState, RestartBackoff
from app.runtimes.base import Runtime

logger = logging.getLogger(__name__)


class Watched:
    # Set by Backend.__init__.
    name: str
    state: BackendState
    runtime: Runtime
    server: Server
    _lock: asyncio.Lock
    _blocks: Blocks
    _backoff: RestartBackoff
    _refused: bool
    _learn_due: bool

    @property
    def lazy(self) -> bool:
        raise NotImplementedError  # see Backend

    def _retry_in(self) -> float:
        raise NotImplementedError  # see Backend

    def _begin_start(self, *, adopt: bool, wake: bool = False) -> asyncio.Task[None]:
        raise NotImplementedError  # see Backend

    async def _fail(self, reason: str, *, holds_vram: bool = False) -> None:
        raise NotImplementedError  # see Backend

    def _set_state(self, target: BackendState, reason: str | None) -> None:
        raise NotImplementedError  # see Backend

    async def learn(self) -> None:
        raise NotImplementedError  # see Backend

    async def check_health(self) -> bool:
        """One health check of its server; records the outcome. Never raises."""
        return await self.server.check_health()

    async def watch(self, *, health: bool = True) -> None:
        """One periodic check: health, whether a managed server died while ready, and a
        restart of a failed pinned backend once its backoff has passed. `health`: whether
        this round asks its server's health (False: an idle server, asked less often,
        `app.control.polling`; the runtime is still asked whether the server exited)."""
        if self._down_pinned() and self._retry_in() == 0:
            async with self._lock:
                if self._down_pinned() and not self._blocks:
                    logger.info(
                        "restarting pinned backend backend=%s failures=%d",
                        self.name,
                        self._backoff.failures,
                    )
                    self._begin_start(adopt=False)
            return
        if self.state in (BackendState.READY, BackendState.SLEEPING) and self.runtime.managed:
            exited = await self.server.exited()
            if exited is not None and exited.stopped_by_owner:
                await self._stopped_by_owner()
                return
            if exited is not None:
                code, more = exit_text(exited)
                await self._fail(f"its server exited with {code}{more}")
                return
        if not health:
            return
        if self.state in (BackendState.READY, BackendState.FAILED) or not self.runtime.managed:
            healthy = await self.server.check_health()
            self._learn_due = self._learn_due or not healthy  # back as another server?
            if healthy and self._learn_due and self.state is BackendState.READY:
                await self.learn()

    def _down_pinned(self) -> bool:
        """A pinned backend the watch starts again once its backoff has passed: it failed
        (its start, or its server died), or admission found no room for its start."""
        down = self.state is BackendState.FAILED or (
            self.state is BackendState.STOPPED and self._refused
        )
        return down and not self.lazy and self.runtime.managed

    @property
    def restart_in_s(self) -> float | None:
        """A pinned backend that is down: seconds until the watch starts it again (the
        backoff doubles from 5 s to 5 min with each failure in a row); None otherwise."""
        return self._retry_in() if self._down_pinned() else None

    def _log_retry(self) -> None:
        if self._down_pinned():
            logger.warning(
                "pinned backend down, restarting in the background backend=%s "
                "retry_in_s=%.0f failures=%d",
                self.name,
                self._retry_in(),
                self._backoff.failures,
            )

    async def _stopped_by_owner(self) -> None:
        """Its owner stopped it (kubernetes `scale: external`: KEDA or an HPA scaled it to 0):
        stopped, not failed, releasing what it held as a stop does; the next request starts
        it again, held until the owner runs it. Not counted in `backend_stops_total`,
        which counts the gateway's stops."""
        async with self._lock:
            if self.state not in (BackendState.READY, BackendState.SLEEPING):
                return
            why = "scaled to 0 by its owner"
            self._set_state(BackendState.STOPPING, why)
            self._set_state(BackendState.STOPPED, f"{why}; the next request waits for it to "
                            "scale up")  # fmt: skip
