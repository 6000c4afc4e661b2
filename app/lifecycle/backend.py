"""One lifecycle object per backend: its state, its runtime, its leases, its health.

The lock guards state transitions only and is never held across I/O. Starting is
single-flight: the first caller creates the start task, later callers await the same task
through `asyncio.shield`, so a caller that goes away never cancels a start others need.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

import httpx

from app.errors import UpstreamUnavailable
from app.lifecycle.state import BackendState, check_transition
from app.metrics import Metrics
from app.runtimes.base import Runtime, RuntimeError_
from app.settings import BackendConfig, ProcessRuntime
from app.tasks import spawn
from app.upstreams.http import HttpUpstream

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S: Final = 2.0
READINESS_POLL_S: Final = 0.25
DEFAULT_START_TIMEOUT_S: Final = 300.0


class Lease:
    """A request's hold on a backend, from routing to the last byte relayed."""

    __slots__ = ("_backend", "_released")

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._backend._release()


class Backend:
    def __init__(
        self,
        name: str,
        config: BackendConfig,
        runtime: Runtime,
        upstream: HttpUpstream,
        health_client: httpx.AsyncClient,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.config = config
        self.runtime = runtime
        self.upstream = upstream
        self._health_client = health_client
        self._metrics = metrics
        self.state = BackendState.STOPPED
        self.reason: str | None = None  # why it is in its state, for errors and /ready
        self.healthy: bool | None = None  # last health check; None before the first
        self.health_error: str | None = None
        self.in_flight = 0
        self.last_start_s: float | None = None
        self._lock = asyncio.Lock()
        self._start_task: asyncio.Task[None] | None = None
        self._in_flight_gauge = metrics.in_flight.labels(name)
        self._up_gauge = metrics.backend_up.labels(name)
        metrics.declare_backend(name)

    # -- data plane -----------------------------------------------------------------

    async def ensure_ready(self) -> None:
        """Return when the backend can take a request, else raise `UpstreamUnavailable`."""
        if self.state is BackendState.READY:
            code = self.runtime.exit_code()
            if code is None:
                return
            await self._mark_exited(code)
        retry = {"retry-after": "5"} if self.state is BackendState.STARTING else None
        raise UpstreamUnavailable(self._unavailable_message(), kind="not_ready", headers=retry)

    def lease(self) -> Lease:
        self.in_flight += 1
        self._in_flight_gauge.inc()
        return Lease(self)

    def _release(self) -> None:
        self.in_flight -= 1
        self._in_flight_gauge.dec()

    def _unavailable_message(self) -> str:
        if self.state is BackendState.STARTING:
            return f"backend {self.name!r} is starting; retry shortly"
        detail = f": {self.reason}" if self.reason else ""
        return f"backend {self.name!r} is {self.state}{detail}"

    # -- control plane ----------------------------------------------------------------

    async def start(self) -> None:
        """Start (or join the start in progress) and wait for its outcome.

        A backend the gateway does not manage is ready at once: its health is watched
        and reported, but requests are always tried, so a recovered server is used at once.
        """
        async with self._lock:
            if self.state is BackendState.READY:
                return
            if not self.runtime.managed:
                self._set_state(BackendState.STARTING, None)
                self._set_state(BackendState.READY, f"not managed: {self.runtime.describe()}")
                return
            if self._start_task is None or self._start_task.done():
                self._set_state(BackendState.STARTING, None)
                self._start_task = spawn(self._run_start(), name=f"start:{self.name}")
            task = self._start_task
        await asyncio.shield(task)

    async def _run_start(self) -> None:
        began = time.monotonic()
        try:
            await self.runtime.start()
        except RuntimeError_ as exc:
            await self._fail(str(exc))
            return
        timeout = (
            self.config.runtime.start_timeout_s
            if isinstance(self.config.runtime, ProcessRuntime)
            else DEFAULT_START_TIMEOUT_S
        )
        if not await self._wait_healthy(began + timeout, timeout):
            return
        self.last_start_s = time.monotonic() - began
        async with self._lock:
            if self.state is BackendState.STARTING:
                self._set_state(BackendState.READY, None)
        logger.info(
            "backend ready backend=%s runtime=%s start_s=%.2f",
            self.name,
            self.runtime.kind,
            self.last_start_s,
        )

    async def _wait_healthy(self, deadline: float, budget_s: float) -> bool:
        """Poll `/health` until it answers 200; fail at once if the server exits."""
        while True:
            code = self.runtime.exit_code()
            if code is not None:
                await self._fail(f"exited with code {code} before it was ready")
                return False
            if await self.check_health():
                return True
            if time.monotonic() >= deadline:
                await self.runtime.stop()
                await self._fail(f"not healthy {budget_s:g}s after start; stopped it")
                return False
            await asyncio.sleep(READINESS_POLL_S)

    async def stop(self) -> None:
        async with self._lock:
            if self.state in (BackendState.STOPPED, BackendState.STOPPING):
                return
            self._set_state(BackendState.STOPPING, "stopping")
            start_task = self._start_task
        if start_task is not None and not start_task.done():
            start_task.cancel()
        try:
            await self.runtime.stop()
        finally:
            async with self._lock:
                self._set_state(BackendState.STOPPED, "stopped by the gateway")

    async def check_health(self) -> bool:
        """One `GET /health`; records the outcome. Never raises."""
        error: str | None
        try:
            response = await self._health_client.get(
                self.config.url + self.config.health_path, timeout=HEALTH_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}".rstrip(": ")
        else:
            ok = response.status_code == 200
            error = None if ok else f"health answered {response.status_code}"
        if ok != self.healthy:
            log = logger.info if ok else logger.warning
            log("backend health backend=%s healthy=%s error=%s", self.name, ok, error)
        self.healthy, self.health_error = ok, error
        self._up_gauge.set(1 if ok else 0)
        return ok

    async def watch(self) -> None:
        """One periodic check: health, and whether a managed server died while ready."""
        if self.state is BackendState.READY:
            code = self.runtime.exit_code()
            if code is not None:
                await self._mark_exited(code)
                return
        if self.state in (BackendState.READY, BackendState.FAILED) or not self.runtime.managed:
            await self.check_health()

    async def _mark_exited(self, code: int) -> None:
        await self._fail(f"its server exited with code {code}")

    async def _fail(self, reason: str) -> None:
        async with self._lock:
            if self.state not in (BackendState.FAILED, BackendState.STOPPED):
                self._set_state(BackendState.FAILED, reason)

    def _set_state(self, target: BackendState, reason: str | None) -> None:
        previous = self.state
        self.state = check_transition(previous, target)
        self.reason = reason
        log = logger.warning if target is BackendState.FAILED else logger.info
        log(
            "backend state backend=%s from=%s to=%s reason=%s",
            self.name,
            previous,
            target,
            reason or "-",
        )
