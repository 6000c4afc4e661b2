"""One lifecycle object per backend: its state, its runtime, its leases, its health.

- `acquire()` is the data plane's only way in: it returns a `Lease` on a ready backend,
  starting a stopped one and holding the request meanwhile (bounded by `max_waiting`
  and `max_wait_s`). It decides under the backend's lock, so a request that arrives
  while a stop is in progress waits for the stop and then starts the backend again.
- The lock guards state transitions only and is never held across I/O.
- Starting is single-flight: the first caller creates the start task, later callers
  wait on the same task without owning it, so a caller that goes away never cancels a
  start others need. Stopping is single-flight the same way.
- A start runs inside the admission context (VRAM check, eviction, one start per GPU at
  a time); a stop drains leases up to `drain_timeout_s` before stopping the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol

import httpx

from app.errors import BackendUnavailable, GatewayError, WakeTimeout
from app.events import EventLog
from app.lifecycle.state import BackendState, check_transition
from app.metrics import Metrics
from app.planner.footprint import Footprint
from app.runtimes.base import Runtime, RuntimeFailure, RuntimeStatus
from app.settings import BackendConfig
from app.tasks import cancel_and_wait, spawn
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm import ControlError, SleepUnsupported, VllmControl

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S: Final = 2.0
READINESS_POLL_S: Final = 0.05  # /health while starting: a refused connection is cheap
# Whether the server still runs, while starting: a Docker inspect through the proxy each
# time, so not at every health poll.
STATUS_POLL_S: Final = 0.5
# After a failure, requests get the failure for this long instead of a new start, so a
# crash-looping server is not restarted by every request; pinned backends are restarted
# by the watch after it. It doubles with each failure in a row, up to the maximum.
RESTART_BACKOFF_S: Final = 5.0
MAX_RESTART_BACKOFF_S: Final = 300.0

# What can keep a backend from starting, most telling first: a GPU profile disabled it,
# a VRAM yield took it, a VRAM zone stopped it.
BLOCK_KINDS: Final = ("disabled", "yielded", "blocked")

# Called every `wake_notice_s` while a request is held, with the seconds waited so far.
WaitNotice = Callable[[float], Awaitable[None]]


class AdmissionRefused(Exception):
    """Admission could not make room for a start; the message says what holds the memory."""


class Admission(Protocol):
    def admit(self, backend: Backend, *, check: bool = True) -> AbstractAsyncContextManager[None]:
        """Entered around a start: reserve the backend's VRAM (evicting if needed) and
        keep other starts on its GPUs out until the start is over. Raises
        `AdmissionRefused` when the backend does not fit. `check=False` (a wake from
        sleep) only keeps other starts out."""


class Unchecked:
    """Admission when there is no GPU to check: every start is allowed."""

    def admit(self, backend: Backend, *, check: bool = True) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()


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
        *,
        admission: Admission | None = None,
        wake_notice_s: float = 5.0,
        restart_backoff_s: float = RESTART_BACKOFF_S,
        control: VllmControl | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.runtime = runtime
        self.upstream = upstream
        self.admission: Admission = admission or Unchecked()
        self.control = control or VllmControl(health_client, config.url)
        self._events = events
        # How a yield frees its memory; a GPU profile may override the config.
        self.yield_method_override: str | None = None
        self.last_drain_timed_out = False  # the last stop went ahead with requests in flight
        # GPU memory used after its last start minus before it, as the probe saw it (starts
        # on a GPU are one at a time, so the difference is this backend's).
        self.measured_mib: int | None = None
        # What admission counts for it: `vram_mib`, else the active profile's share, else
        # the planner's estimate from its model description (Services keeps it current).
        self.footprint: Footprint | None = (
            None if config.vram_mib is None else Footprint(config.vram_mib, "vram_mib")
        )
        self._health_client = health_client
        self._metrics = metrics
        self._wake_notice_s = wake_notice_s
        self._restart_backoff_s = restart_backoff_s
        self.state = BackendState.STOPPED
        self.reason: str | None = None  # why it is in its state, for errors and /backends
        self.healthy: bool | None = None  # last health check; None before the first
        self.health_error: str | None = None
        self.in_flight = 0
        self.waiting = 0
        self.holds_vram = False  # admitted and not yet stopped: counted on its GPUs
        self.last_used = time.monotonic()
        self.last_start_s: float | None = None
        self.runtime_detail: str | None = None
        # Why it may not start now (VRAM zones, a yield, a GPU profile): key -> description
        # for errors; each block has a kind (the error's `backend_<kind>` code).
        self.blocks: dict[str, str] = {}
        self._block_kinds: dict[str, str] = {}
        self._refused = False  # stopped because admission found no room (kind no_vram)
        self._failures = 0  # in a row; reset when it becomes ready
        self._retry_at: float | None = None  # failed: no new start before this
        self._lock = asyncio.Lock()
        self._start_task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        self._drained.set()
        self._in_flight_gauge = metrics.in_flight.labels(name)
        self._waiting_gauge = metrics.waiting.labels(name)
        self._up_gauge = metrics.backend_up.labels(name)
        metrics.declare_backend(name)
        metrics.set_backend_state(name, self.state)

    @property
    def vram_mib(self) -> int | None:
        """MiB it holds on each of its GPUs, for admission; None: not checked."""
        return None if self.footprint is None else self.footprint.mib

    @property
    def lazy(self) -> bool:
        return self.config.lifecycle == "lazy"

    def idle_s(self, now: float | None = None) -> float:
        """Seconds since the last request ended (0 while requests are in flight)."""
        if self.in_flight:
            return 0.0
        return (time.monotonic() if now is None else now) - self.last_used

    # -- data plane -----------------------------------------------------------------

    async def acquire(
        self, on_wait: WaitNotice | None = None, *, max_wait_s: float | None = None
    ) -> Lease:
        """A lease on the ready backend; starts it if needed and holds the caller meanwhile.

        Raises `BackendUnavailable` (blocked, failed, refused, queue full) or
        `WakeTimeout` (still not ready after `max_wait_s`, or the backend's own
        `max_wait_s` when that is shorter; a fallback chain passes a shorter one).
        """
        if self.state is BackendState.READY and not self.blocks:
            return self._lease()  # the hot path: no lock, no await
        return await self._acquire_slow(on_wait, max_wait_s)

    async def _acquire_slow(self, on_wait: WaitNotice | None, max_wait_s: float | None) -> Lease:
        self._check_blocked()
        if self.waiting >= self.config.max_waiting:
            raise BackendUnavailable(
                f"backend {self.name!r} is {self.state} and already holds "
                f"{self.waiting} waiting requests (max_waiting); retry shortly",
                kind="queue_full",
                retry_after_s=5,
            )
        self.waiting += 1
        self._waiting_gauge.inc()
        try:
            limit = self.config.max_wait_s
            if max_wait_s is not None:
                limit = min(limit, max_wait_s)
            lease = await self._until_ready(
                backoff=True, max_wait_s=limit, on_wait=on_wait, lease=True
            )
        finally:
            self.waiting -= 1
            self._waiting_gauge.dec()
        assert lease is not None
        return lease

    async def _until_ready(
        self, *, backoff: bool, max_wait_s: float | None, on_wait: WaitNotice | None, lease: bool
    ) -> Lease | None:
        """Decide under the lock, wait without it, until ready; then, with `lease`, take
        the lease under the same lock that saw it ready (a stop cannot slip between).

        Waits for a stop in progress and decides again; a start it waited for that did
        not end ready raises why."""
        began = time.monotonic()
        deadline = None if max_wait_s is None else began + max_wait_s
        while True:
            async with self._lock:
                step = self._next_step(backoff=backoff)
                if step is None:
                    return self._lease() if lease else None
                task, joined_start = step
            await self._wait_for(task, began, deadline, on_wait)
            if joined_start and self.state is not BackendState.READY:
                raise self._unavailable()

    async def _wait_for(
        self,
        task: asyncio.Task[None],
        began: float,
        deadline: float | None,
        on_wait: WaitNotice | None,
    ) -> None:
        """Wait for a start or stop without owning it: cancelling this wait leaves it
        running. `deadline=None` waits as long as it takes."""
        while not task.done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if deadline is not None and remaining is not None and remaining <= 0:
                raise WakeTimeout(
                    f"backend {self.name!r} is still {self.state} after "
                    f"{deadline - began:g}s (max_wait_s); retry later"
                )
            step = remaining
            if on_wait is not None:
                step = self._wake_notice_s if step is None else min(step, self._wake_notice_s)
            await asyncio.wait({task}, timeout=step)
            if task.done() or on_wait is None:
                continue
            if deadline is None or time.monotonic() < deadline:
                await on_wait(time.monotonic() - began)

    def _lease(self) -> Lease:
        self.in_flight += 1
        self.last_used = time.monotonic()
        self._drained.clear()
        self._in_flight_gauge.inc()
        return Lease(self)

    def _release(self) -> None:
        self.in_flight -= 1
        self.last_used = time.monotonic()
        self._in_flight_gauge.dec()
        if self.in_flight == 0:
            self._drained.set()

    @property
    def blocked_as(self) -> str | None:
        """The most telling kind of what blocks it (`BLOCK_KINDS` order); None: nothing."""
        if not self._block_kinds:
            return None
        return min(self._block_kinds.values(), key=BLOCK_KINDS.index)

    def _check_blocked(self) -> None:
        kind = self.blocked_as
        if kind is None:
            return
        what = "; ".join(d for k, d in self.blocks.items() if self._block_kinds[k] == kind)
        if kind == "disabled":
            message = f"backend {self.name!r} is disabled by {what}"
        elif kind == "yielded":
            message = (
                f"backend {self.name!r} gave its VRAM to {what}; "
                "it comes back after POST /vram/restore"
            )
        else:
            message = (
                f"backend {self.name!r} is stopped to make room for {what}; "
                "it wakes again when that is released"
            )
        raise BackendUnavailable(message, kind=kind)

    def _check_backoff(self) -> None:
        if self.state is BackendState.FAILED and self._retry_in() > 0:
            raise self._unavailable()

    def _retry_in(self) -> float:
        """Seconds until a failed backend may be started again (0: now)."""
        if self._retry_at is None:
            return 0.0
        return max(0.0, self._retry_at - time.monotonic())

    def _unavailable(self) -> GatewayError:
        detail = f": {self.reason}" if self.reason else ""
        if self.state is BackendState.STARTING:
            return BackendUnavailable(
                f"backend {self.name!r} is starting; retry shortly",
                kind="starting",
                retry_after_s=5,
            )
        if self.state is BackendState.FAILED:
            return BackendUnavailable(
                f"backend {self.name!r} failed{detail}",
                kind="failed",
                retry_after_s=max(1, math.ceil(self._retry_in())),
            )
        kind = "no_vram" if self._refused else "stopped"
        return BackendUnavailable(f"backend {self.name!r} is {self.state}{detail}", kind=kind)

    # -- control plane ----------------------------------------------------------------

    async def start(self) -> None:
        """Start (or join the start in progress) and wait for it, unbounded by `max_wait_s`.

        Raises `BackendUnavailable` when it did not become ready.
        """
        await self._until_ready(backoff=False, max_wait_s=None, on_wait=None, lease=False)

    def _next_step(self, *, backoff: bool) -> tuple[asyncio.Task[None], bool] | None:
        """Under the lock: None when ready, else the task to wait for and whether it is
        a start (a stop in progress is waited for, then the caller decides again)."""
        self._check_blocked()
        if self.state is BackendState.READY:
            return None
        if self.state is BackendState.STOPPING:
            assert self._stop_task is not None
            return self._stop_task, False
        if self.state is BackendState.STARTING:
            assert self._start_task is not None
            return self._start_task, True
        if self.state is BackendState.SLEEPING:
            return self._begin_start(adopt=True, wake=True), True
        if backoff:
            self._check_backoff()
        return self._begin_start(adopt=False), True

    def _begin_start(self, *, adopt: bool, wake: bool = False) -> asyncio.Task[None]:
        """Under the lock: stopped, failed or sleeping -> starting, with the one start task.

        `adopt`: the server already runs (and holds its memory), so skip admission;
        `wake`: it sleeps, so wake it (`POST /wake_up`) instead of starting it."""
        if not self.runtime.managed:
            # Nothing to launch: it is ready at once; health is watched and reported.
            self._set_state(BackendState.STARTING, None)
            self._set_state(BackendState.READY, f"not managed: {self.runtime.describe()}")
            self.holds_vram = True
            self._start_task = spawn(_nothing(), name=f"start:{self.name}")
            return self._start_task
        self._set_state(BackendState.STARTING, "waking from sleep" if wake else None)
        self._start_task = spawn(self._run_start(adopt, wake), name=f"start:{self.name}")
        return self._start_task

    async def _run_start(self, adopt: bool, wake: bool = False) -> None:
        began = time.monotonic()
        outcome = "failed"
        if wake:
            admitted = self.admission.admit(self, check=False)
        elif adopt:
            admitted = contextlib.nullcontext()
        else:
            admitted = self.admission.admit(self)
        try:
            async with admitted:
                self.holds_vram = True  # admitted: counted on its GPUs from now on
                if wake:
                    await self._wake()
                else:
                    await self.runtime.start()
                await self._wait_healthy(time.monotonic() + self.config.start_timeout_s)
            duration = time.monotonic() - began
            async with self._lock:
                if self.state is not BackendState.STARTING:
                    return  # a stop took over
                self.last_start_s = duration
                self.last_used = time.monotonic()
                self._failures, self._retry_at = 0, None
                self._set_state(BackendState.READY, None)
            outcome = "ready"
            self._metrics.start_duration.labels(self.name).observe(duration)
            logger.info(
                "backend ready backend=%s runtime=%s start_s=%.2f",
                self.name,
                self.runtime.kind,
                duration,
            )
        except AdmissionRefused as exc:
            outcome = "refused"
            async with self._lock:
                if self.state is BackendState.STARTING:
                    self._set_state(BackendState.STOPPED, f"not enough VRAM to start: {exc}")
                    self._refused = True
        except RuntimeFailure as exc:
            await self._fail(str(exc))
        except _StartFailed as exc:
            await self._fail(str(exc))
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._metrics.starts.labels(self.name, outcome).inc()

    async def _wake(self) -> None:
        try:
            await self.control.wake_up()
        except ControlError as exc:
            # Half awake is no state to serve from: stop it, the next start is a clean one.
            logger.error("wake from sleep failed, stopping backend=%s error=%s", self.name, exc)
            await self.runtime.stop()
            raise _StartFailed(f"wake from sleep failed ({exc}); stopped it") from None

    async def _wait_healthy(self, deadline: float) -> None:
        """Poll `/health` until it answers 200; fail at once if the server exits.

        A refused connection means still loading (vLLM opens its port late). When the
        runtime cannot be asked (Docker proxy down) the health check alone decides.
        """
        next_status = 0.0
        while True:
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + STATUS_POLL_S
                try:
                    status = await self.runtime.status()
                except RuntimeFailure as exc:
                    logger.warning("runtime status unknown backend=%s error=%s", self.name, exc)
                else:
                    self.runtime_detail = status.detail
                    if not status.running:
                        code, more = _exit_text(status)
                        raise _StartFailed(f"exited with {code} before it was ready{more}")
            if await self.check_health():
                return
            if time.monotonic() >= deadline:
                await self.runtime.stop()
                raise _StartFailed(
                    f"not healthy {self.config.start_timeout_s:g}s after start "
                    "(start_timeout_s); stopped it"
                )
            await asyncio.sleep(READINESS_POLL_S)

    async def stop(self, reason: str, *, drain_timeout_s: float | None = None) -> None:
        """Drain leases (up to `drain_timeout_s`), then stop the runtime. Idempotent.

        Raises `BackendUnavailable` (kind `runtime`) when the runtime could not stop it:
        the server may still run and hold its memory."""
        while True:
            async with self._lock:
                if self.state is BackendState.STOPPED:
                    return
                if self.state is not BackendState.STOPPING:
                    self._begin_stop(reason, drain_timeout_s)
                    break
            await self._stopped()  # a stop (or a sleep) already under way: then decide again
        await self._stopped()
        if self.state is BackendState.FAILED:
            raise BackendUnavailable(
                f"backend {self.name!r} could not be stopped: {self.reason}", kind="runtime"
            )

    async def stop_if_idle(self, now: float) -> bool:
        """The reaper's stop: decided under the lock, so a request that just arrived wins."""
        async with self._lock:
            ttl = self.config.idle_ttl_s
            if not (
                self.lazy
                and ttl > 0
                and self.state is BackendState.READY
                and self.in_flight == 0
                and now - self.last_used >= ttl
            ):
                return False
            self._begin_stop("idle", None)
        await self._stopped()
        return True

    async def sleep(self, reason: str, *, level: int, drain_timeout_s: float | None = None) -> str:
        """Drain, then put the server to sleep (vLLM sleep mode); "slept" or "stopped".

        A server without sleep mode (404: no `VLLM_SERVER_DEV_MODE=1`) is stopped
        instead, and the log says why. A backend that is not ready is stopped. Raises
        like `stop()`."""
        async with self._lock:
            state = self.state
            if state is BackendState.SLEEPING:
                return "slept"
            if state is BackendState.READY and self.runtime.managed:
                self._begin_stop(reason, drain_timeout_s, sleep_level=level)
            elif state is BackendState.STOPPED:
                return "stopped"
        if state is not BackendState.READY or not self.runtime.managed:
            await self.stop(reason, drain_timeout_s=drain_timeout_s)
            return "stopped"
        await self._stopped()
        if self.state is BackendState.FAILED:
            raise BackendUnavailable(
                f"backend {self.name!r} could not be stopped: {self.reason}", kind="runtime"
            )
        return "slept" if self.state is BackendState.SLEEPING else "stopped"

    async def start_logged(self, why: str) -> None:
        """`start()` for a background task: a start that fails is logged, not raised (the
        backend's state and `/status` say why)."""
        try:
            await self.start()
        except BackendUnavailable as exc:
            logger.error("start failed backend=%s why=%s error=%s", self.name, why, exc.message)

    @property
    def yield_method(self) -> str:
        return self.yield_method_override or self.config.yield_.method

    async def _stopped(self) -> None:
        """Wait, without owning it, for the stop task begun under the lock."""
        task = self._stop_task
        assert task is not None
        await asyncio.wait({task})

    def _begin_stop(
        self, reason: str, drain_timeout_s: float | None, *, sleep_level: int | None = None
    ) -> None:
        """Under the lock: -> stopping, with the one stop task (which ends in `sleeping`
        instead when `sleep_level` is given and the server offers sleep mode)."""
        start_task = self._start_task
        what = "stop" if sleep_level is None else f"sleep (level {sleep_level})"
        self._set_state(BackendState.STOPPING, f"{what} requested ({reason})")
        drain = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        self._stop_task = spawn(
            self._run_stop(reason, drain, start_task, sleep_level), name=f"stop:{self.name}"
        )

    async def _run_stop(
        self,
        reason: str,
        drain_s: float,
        start_task: asyncio.Task[None] | None,
        sleep_level: int | None = None,
    ) -> None:
        if start_task is not None and not start_task.done():
            start_task.cancel()
            await asyncio.wait({start_task})
        self.last_drain_timed_out = False
        if self.in_flight:
            logger.info(
                "backend draining backend=%s in_flight=%d drain_timeout_s=%g",
                self.name,
                self.in_flight,
                drain_s,
            )
            try:
                await asyncio.wait_for(self._drained.wait(), drain_s)
            except TimeoutError:
                self.last_drain_timed_out = True
                self._metrics.drain_timeouts.labels(self.name).inc()
                logger.warning(
                    "drain timed out, stopping with requests in flight backend=%s in_flight=%d",
                    self.name,
                    self.in_flight,
                )
        if sleep_level is not None and await self._try_sleep(sleep_level):
            async with self._lock:
                self._set_state(BackendState.SLEEPING, f"asleep (level {sleep_level}, {reason})")
            return
        try:
            if self.runtime.managed:
                await self.runtime.stop()
        except RuntimeFailure as exc:
            # The server may still hold its memory: keep counting it.
            await self._fail(f"stop failed: {exc}", holds_vram=True)
            return
        async with self._lock:
            self._set_state(BackendState.STOPPED, f"stopped by the gateway ({reason})")
        self._metrics.stops.labels(self.name, reason).inc()

    async def _try_sleep(self, level: int) -> bool:
        """`POST /sleep`; False (and the reason logged) when it must be stopped instead."""
        try:
            await self.control.sleep(level)
        except SleepUnsupported as exc:
            logger.warning("sleep mode not offered, stopping instead backend=%s why=%s",
                           self.name, exc)  # fmt: skip
            self._metrics.backend_sleeps.labels(self.name, "stopped").inc()
            return False
        except ControlError as exc:
            logger.error("sleep failed, stopping instead backend=%s error=%s", self.name, exc)
            self._metrics.backend_sleeps.labels(self.name, "failed").inc()
            return False
        self._metrics.backend_sleeps.labels(self.name, "slept").inc()
        return True

    async def adopt(self) -> None:
        """At gateway start: take over a server that is already running (it outlived a
        previous gateway), without an admission check since its memory is already in
        use. Leaves a server that is not running stopped."""
        try:
            status = await self.runtime.status()
        except RuntimeFailure as exc:
            logger.warning("cannot tell whether it runs backend=%s error=%s", self.name, exc)
            return
        if not status.running:
            return
        logger.info("adopting running server backend=%s detail=%s", self.name, status.detail)
        asleep = False
        if self.config.yield_.method == "sleep" or self.yield_method_override == "sleep":
            try:
                asleep = await self.control.is_sleeping()
            except ControlError:
                asleep = False  # no sleep mode, or not answering yet: treat it as awake
        async with self._lock:
            if self.state is not BackendState.STOPPED:
                return
            if asleep:
                self.holds_vram = True
                self._set_state(BackendState.SLEEPING, "found asleep at gateway start")
                return
            task = self._begin_start(adopt=True)
        await asyncio.wait({task})

    async def abandon(self) -> None:
        """At gateway shutdown: stop waiting for starts and stops in progress. A container
        keeps doing what it was told (the engine finishes a stop on its own)."""
        for task in (self._start_task, self._stop_task):
            await cancel_and_wait(task)

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
        """One periodic check: health, whether a managed server died while ready, and a
        restart of a failed pinned backend once its backoff has passed."""
        if (
            self.state is BackendState.FAILED
            and not self.lazy
            and self.runtime.managed
            and self._retry_in() == 0
        ):
            async with self._lock:
                if self.state is BackendState.FAILED and not self.blocks:
                    logger.info(
                        "restarting pinned backend backend=%s failures=%d",
                        self.name,
                        self._failures,
                    )
                    self._begin_start(adopt=False)
            return
        if self.state in (BackendState.READY, BackendState.SLEEPING) and self.runtime.managed:
            try:
                status = await self.runtime.status()
            except RuntimeFailure as exc:
                self.runtime_detail = f"unknown: {exc}"
            else:
                self.runtime_detail = status.detail
                if not status.running:
                    code, more = _exit_text(status)
                    await self._fail(f"its server exited with {code}{more}")
                    return
        if self.state in (BackendState.READY, BackendState.FAILED) or not self.runtime.managed:
            await self.check_health()

    async def _fail(self, reason: str, *, holds_vram: bool = False) -> None:
        async with self._lock:
            if self.state not in (BackendState.FAILED, BackendState.STOPPED):
                self._set_state(BackendState.FAILED, reason)
                self._failures += 1
                backoff = self._restart_backoff_s * 2 ** min(self._failures - 1, 16)
                self._retry_at = time.monotonic() + min(MAX_RESTART_BACKOFF_S, backoff)
                self.holds_vram = holds_vram

    def block(self, key: str, description: str, kind: str = "blocked") -> None:
        """Refuse to start (requests get `backend_<kind>` naming `description`) until
        unblocked. `kind` is one of `BLOCK_KINDS`."""
        assert kind in BLOCK_KINDS, kind
        self.blocks[key] = description
        self._block_kinds[key] = kind

    def unblock(self, key: str) -> None:
        self.blocks.pop(key, None)
        self._block_kinds.pop(key, None)

    def _set_state(self, target: BackendState, reason: str | None) -> None:
        previous = self.state
        self.state = check_transition(previous, target)
        self.reason = reason
        self._refused = False
        if target is BackendState.STOPPED:
            self.holds_vram = False
        self._metrics.set_backend_state(self.name, target)
        if self._events is not None:
            self._events.record(
                "backend_state", backend=self.name, state=str(target), reason=reason
            )
        log = logger.warning if target is BackendState.FAILED else logger.info
        log(
            "backend state backend=%s from=%s to=%s reason=%s",
            self.name,
            previous,
            target,
            reason or "-",
        )


def _exit_text(status: RuntimeStatus) -> tuple[str, str]:
    """("code 137", ", OOM-killed: ...") from a status like "exited (137), OOM-killed: ..."."""
    code = "no exit code" if status.exit_code is None else f"code {status.exit_code}"
    prefix = f"exited ({status.exit_code})"
    if status.detail.startswith(prefix):
        return code, status.detail[len(prefix) :]
    return code, f" ({status.detail})" if status.detail else ""


class _StartFailed(Exception):
    """The server was launched but did not become ready; the message says why."""


async def _nothing() -> None:
    return None
