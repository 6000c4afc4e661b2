"""One lifecycle object per backend: its state and transitions, and the parts it owns.

- The lock guards state transitions only and is never held across I/O.
- Starting is single-flight: the first caller creates the start task, later callers
  wait on the same task without owning it, so a caller that goes away never cancels a
  start others need. Stopping is single-flight the same way.
- A start runs inside the admission context (VRAM check, eviction, one start per GPU at
  a time); a stop drains leases up to `drain_timeout_s` before stopping the runtime.
- Its parts: `server` (the I/O with its server: runtime, health, sleep mode,
  `app.lifecycle.server`), `watcher` (the periodic check and the restart backoff,
  `app.lifecycle.watched`), `memory` (what it holds on its GPUs and asleep,
  `app.lifecycle.memory`; its sleeps' guard, `app.lifecycle.sleep_guard`), `requests`
  (the queue, the leases and `acquire()`, the data plane's only way in,
  `app.lifecycle.request_holds`). Each reads the backend through a small protocol and
  changes it only through the transitions it is given; the API reads it through
  `app.lifecycle.view.BackendView`.
- What it serves (`serving`) is learned from its server when it becomes ready (`learn()`).
- A lazy start begun only for held requests is cancelled when they all leave before it is
  ready (`want`, `app.lifecycle.wanted`); `start()` is explicit: never cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from app.errors import BackendUnavailable, GatewayError, UnavailableKind
from app.events import EventLog
from app.lifecycle import admission as rules
from app.lifecycle.adapters import LoadedAdapters
from app.lifecycle.admission import Admission, AdmissionRefused, StartUnwanted, Unchecked
from app.lifecycle.blocks import BlockKind, Blocks
from app.lifecycle.load import WAITING_FOR_VRAM, LoadStatus, StartClock, StartDurations
from app.lifecycle.memory import Memory
from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.release import Release, ReleasePolicy, Unbudgeted
from app.lifecycle.request_holds import RequestHolds
from app.lifecycle.served import LearnedRecords, Served
from app.lifecycle.server import Server, StartFailed, wake_failure
from app.lifecycle.sleep_guard import GuardCause, SleepGuard
from app.lifecycle.state import (
    RESTART_BACKOFF_S,
    BackendState,
    SleepOutcome,
    StartOutcome,
    StopReason,
    check_transition,
    refusal,
)
from app.lifecycle.wanted import START_CANCEL_GRACE_S, StartWant
from app.lifecycle.watched import Watcher
from app.runtimes.base import Runtime, RuntimeFailure
from app.settings import BackendConfig, ReleaseConfig
from app.tasks import cancel_and_wait, spawn
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm import VllmClient

logger = logging.getLogger(__name__)


class Backend:
    def __init__(
        self,
        name: str,
        config: BackendConfig,
        runtime: Runtime,
        upstream: HttpUpstream,
        vllm: VllmClient,
        metrics: LifecycleMetrics,
        *,
        admission: Admission | None = None,
        wake_notice_s: float = 5.0,
        restart_backoff_s: float = RESTART_BACKOFF_S,
        events: EventLog | None = None,
        learned: LearnedRecords | None = None,  # what its servers said, kept across restarts
        release: ReleasePolicy | None = None,
        durations: StartDurations | None = None,
        start_cancel_grace_s: float = START_CANCEL_GRACE_S,
    ) -> None:
        self.name = name
        self.config = config
        self.runtime = runtime
        self.upstream = upstream  # the data plane: client requests (aiohttp)
        changed = None if events is None else events.changed  # pushes /status/stream
        self.server = Server(name, runtime, vllm, metrics, on_progress=changed)  # its I/O
        self._clock = StartClock(name, durations or StartDurations(None))  # the eta of a start
        self.admission: Admission = admission or Unchecked()
        # How it gives memory back (sleep level or stop): its host's RAM book decides.
        self.release_policy: ReleasePolicy = release or Unbudgeted()
        self._events = events
        self.last_drain_timed_out = False  # the last stop went ahead with requests in flight
        # Moves when the server loses what was loaded at runtime (LoRA adapters,
        # app.lifecycle.adapters): stopped, failed, or asleep at any level but 1.
        self.adapters_epoch = 0
        self.adapters = LoadedAdapters(name, vllm, config.max_loras)  # loaded on its server
        self._metrics = metrics
        self.state = BackendState.STOPPED
        self.reason: str | None = None  # why it is in its state, for errors and /backends
        self.memory = Memory(self)  # what it holds, on its GPUs and asleep
        self._guard = SleepGuard(name, self.memory.sleeps, metrics.sleep_guard, events)
        self.last_start_s: float | None = None
        self.ready_since: float | None = None  # monotonic; for min_resident_s
        # Why it may not start now (VRAM zones, a yield, a GPU profile).
        self._blocks = Blocks()
        self._lock = asyncio.Lock()  # guards its transitions, never held across I/O
        self.requests = RequestHolds(
            self,
            metrics,
            changed,
            lock=self._lock,
            next_step=self._next_step,
            unavailable=self._unavailable,
            left=lambda kept: self.want.left(kept, self._start_task),
            went_idle=self.admission.went_idle,
            wake_notice_s=wake_notice_s,
        )
        self._start_task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        grace_s, cancel = start_cancel_grace_s, self._cancel_unwanted
        self.want = StartWant(self, self._clock, metrics, events, grace_s=grace_s, cancel=cancel)
        self._served = Served(config, name=name, records=learned)
        self.watcher = Watcher(
            self,
            self.server,
            restart_backoff_s,
            restart=self._restart_down,
            fail=self._fail,
            owner_stopped=self._stopped_by_owner,
        )
        metrics.declare_backend(name)
        metrics.set_backend_state(name, self.state)

    @property
    def serving(self) -> Served:
        """What it serves and its `max_model_len`: configured, or learned from its server."""
        return self._served

    async def learn(self, ours: str | None = None) -> None:
        """Ask the ready server what it serves (`serving`); raises only `NotOurServer` (`ours`)."""
        if await self.server.learn(self.config.models, self._served, ours=ours):
            self.watcher.learn_due = False

    @property
    def managed(self) -> bool:
        return self.runtime.managed

    @property
    def blocks(self) -> Blocks:
        """What keeps it from starting, key -> description (read-only; see `block`)."""
        return self._blocks

    @property
    def lazy(self) -> bool:
        """Started on demand and evictable: `lazy`, and `standby` (which is loaded once at
        gateway start and put to sleep)."""
        return self.config.lifecycle in ("lazy", "standby")

    @property
    def standby(self) -> bool:
        return self.config.lifecycle == "standby"

    def start_progress(self) -> str | None:
        """While starting: what the start waits for, in words (None otherwise)."""
        if self.state is not BackendState.STARTING:
            return None
        return self.server.start_progress

    def load(self) -> LoadStatus | None:  # while starting: how far (app.lifecycle.load)
        return self._clock.load(self.server) if self.state is BackendState.STARTING else None

    def ready_in_s(self) -> float | None:
        """Seconds until it would be ready for a request arriving now, by its last
        measured cold start or wake, less what the start in progress has done (0: ready).
        None: not known (never measured, stopping, blocked, failed in its backoff)."""
        held = bool(self._blocks) or (
            self.state is BackendState.FAILED and self.watcher.retry_in() > 0
        )
        level = self.memory.asleep_level or 0
        return self._clock.ready_in_s(self.state, held, level, managed=self.runtime.managed)

    def _check_backoff(self) -> None:
        if self.state is BackendState.FAILED and self.watcher.retry_in() > 0:
            raise self._unavailable()

    def _unavailable(self) -> GatewayError:
        retry = self.watcher.retry_in() if self.state is BackendState.FAILED else 0.0
        no_vram = self.watcher.refused
        return refusal(self.name, self.state, self.reason, no_vram=no_vram, retry_in_s=retry)

    # -- control plane ----------------------------------------------------------------

    async def start(self) -> None:
        """Start (or join the start in progress) and wait for it, unbounded by `max_wait_s`.

        Raises `BackendUnavailable` when it did not become ready.
        """
        await self.requests.until_ready(None, backoff=False, max_wait_s=None)

    async def _cancel_unwanted(self, start: asyncio.Task[None] | None) -> None:
        async with self._lock:
            if self._start_task is start and self.want.unwanted_start(self.state):
                self.want.cancelled()
                self._begin_stop(StopReason.UNWANTED, 0.0)

    def _next_step(self, backoff: bool, explicit: bool) -> tuple[asyncio.Task[None], bool] | None:
        """Under the lock: None when ready, else the task to wait for and whether it is
        a start (a stop in progress is waited for, then the caller decides again)."""
        self._blocks.check(self.name)
        if self.state is BackendState.READY:
            return None
        if self.state is BackendState.STOPPING:
            assert self._stop_task is not None
            return self._stop_task, False
        if self.state is BackendState.STARTING:
            assert self._start_task is not None
            self.want.kept = self.want.kept or explicit
            return self._start_task, True
        if self.state is BackendState.SLEEPING:
            return self._begin_start(adopt=True, wake=True), True
        if backoff:
            self._check_backoff()
        return self._begin_start(adopt=False, kept=explicit), True

    def _begin_start(
        self, *, adopt: bool, wake: bool = False, kept: bool = True
    ) -> asyncio.Task[None]:
        """Under the lock: stopped, failed or sleeping -> starting, with the one start task.

        `adopt`: the server already runs (and holds its memory), so skip admission;
        `wake`: it sleeps, so wake it (`POST /wake_up`) instead of starting it; `kept`
        false: begun for held requests only (`app.lifecycle.wanted`)."""
        self.want.kept = kept or adopt or wake or self.config.lifecycle != "lazy"
        if not self.runtime.managed:
            # Nothing to launch: it is ready at once; health is watched and reported.
            self._set_state(BackendState.STARTING, None)
            self._set_state(BackendState.READY, f"not managed: {self.runtime.describe()}")
            self.memory.holds_vram = True
            self._start_task = spawn(asyncio.sleep(0), name=f"start:{self.name}")
            return self._start_task
        timing = self._clock.begin((self.memory.asleep_level or 0) if wake else None)
        self._set_state(BackendState.STARTING, "waking from sleep" if wake else None)
        self._start_task = spawn(self._run_start(timing, adopt, wake), name=f"start:{self.name}")
        return self._start_task

    async def _run_start(
        self, timing: tuple[float, int | None], adopt: bool, wake: bool = False
    ) -> None:
        began, wake_level = timing
        outcome = StartOutcome.FAILED
        if wake:
            admitted = self.admission.admit(self, wake=True)
        else:  # a new server (or one adopted): its sleeps begin again
            self.memory.sleeps.started_cold()
            admitted = contextlib.nullcontext() if adopt else self.admission.admit(self)
        try:
            async with admitted:
                level = self.memory.admitted()  # counted on its GPUs from now on
                await self.server.launch(wake=wake, level=level, gpus=self.memory.gpus)
                await self.server.wait_healthy(self.config.start_timeout_s)
            if not wake or self._served.learned is None:  # a wake: the same server as before
                await self.learn(self.config.served_model)  # before ready: routes its first request
            duration = time.monotonic() - began
            async with self._lock:
                if self.state is not BackendState.STARTING:
                    return  # a stop took over
                self.last_start_s = duration
                if self.server.loaded_weights_gib is not None:  # the host RAM a sleep holds
                    per_gpu = self.server.loaded_weights_gib * 2**30
                    self.memory.record_loaded_weights(round(per_gpu * len(self.memory.gpus)))
                self.requests.leases.touch()
                self.watcher.backoff.reset()
                self._set_state(BackendState.READY, None)
            outcome = StartOutcome.READY
            self._clock.record(duration, cold=not adopt, wake_level=wake_level)
            self._metrics.start_duration.labels(self.name).observe(duration)
            logger.info("backend ready backend=%s runtime=%s start_s=%.2f", self.name,
                        self.runtime.kind, duration)  # fmt: skip
        except StartUnwanted:  # admission would have evicted for nobody (`app.lifecycle.wanted`)
            outcome = StartOutcome.CANCELLED
            async with self._lock:
                if self.state is BackendState.STARTING:  # else a stop took over
                    self._set_state(BackendState.STOPPED, self.want.cancelled(WAITING_FOR_VRAM))
        except AdmissionRefused as exc:
            outcome = StartOutcome.REFUSED
            async with self._lock:
                if self.state is BackendState.STARTING:
                    # A wake refused leaves the server asleep, still holding what it kept.
                    target = BackendState.SLEEPING if wake else BackendState.STOPPED
                    why = f"not enough VRAM to {'wake' if wake else 'start'}: {exc}"
                    self._set_state(target, why)
                    self.watcher.refused = True
                    if not wake and not self.lazy:  # the watch tries again after a backoff
                        self.watcher.failed()
        except StartFailed as exc:
            cause = wake_failure(exc) if wake else None  # a bad wake: the sleep guard's
            if cause is None:
                await self._fail(str(exc))
            else:
                await self._guard_stopped(cause, str(exc))
        except RuntimeFailure as exc:
            await self._fail(str(exc))
        except asyncio.CancelledError:
            outcome = StartOutcome.CANCELLED
            raise
        finally:
            self._metrics.starts.labels(self.name, outcome).inc()
            await self.server.end_watch()

    async def start_ended(self, timeout_s: float) -> bool:
        """Wait, without owning it and at most `timeout_s`, for the start under way to end
        (ready, failed, refused or stopped); False at once when none is under way. For a
        start that needs the memory this one holds (`app.vram.arbiter`)."""
        task = self._start_task
        if self.state is not BackendState.STARTING or task is None or task.done():
            return False
        await asyncio.wait({task}, timeout=timeout_s)
        return True

    async def stop(self, reason: StopReason, *, drain_timeout_s: float | None = None) -> None:
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
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.state is BackendState.FAILED:
            raise BackendUnavailable(
                f"backend {self.name!r} could not be stopped: {self.reason}",
                kind=UnavailableKind.RUNTIME,
            )

    async def stop_if_idle(self, now: float) -> bool:
        """The reaper's stop (or sleep, per `idle.method`), decided under the lock so a
        request that just arrived wins. Asleep it stays so (its residue is small and
        evictable: no second TTL) until a request wakes it or something stops it."""
        if not self._idle_past_ttl(now):
            return False
        await self.release_policy.refresh()  # the host's RAM, only when it may go
        async with self._lock:
            if not self._idle_past_ttl(now):
                return False
            release = self.release_policy.choose(self, self.config.idle, StopReason.IDLE)
            self._begin_stop(StopReason.IDLE, None, release=release)
        await self._stopped()
        return True

    def _idle_past_ttl(self, now: float) -> bool:
        ttl = self.config.idle_ttl_s
        return (
            self.lazy
            and ttl > 0
            and self.state is BackendState.READY
            and self.requests.leases.idle_s(now) >= ttl
            and not self.requests.held_warm(now)  # keep_warm, a client's keep_alive
        )

    async def sleep(
        self, reason: StopReason, *, level: int, drain_timeout_s: float | None = None
    ) -> SleepOutcome:
        """`give_back` with `method: sleep` at `level` (the host RAM budget may deepen a
        level-1 sleep to level 2)."""
        how = ReleaseConfig(method="sleep", level=1 if level == 1 else 2)
        return await self.give_back(reason, how, drain_timeout_s=drain_timeout_s)

    async def give_back(
        self, reason: StopReason, how: ReleaseConfig, *, drain_timeout_s: float | None = None
    ) -> SleepOutcome:
        """Drain, then put the server to sleep or stop it, as its host's RAM book
        chooses for `how` (`app.lifecycle.release`); `SLEPT` or `STOPPED`.

        A server without sleep mode (404: no `VLLM_SERVER_DEV_MODE=1`) is stopped
        instead, and the log says why. A backend that is not ready is stopped. Raises
        like `stop()`."""
        await self.release_policy.refresh()
        async with self._lock:
            state = self.state
            if state is BackendState.SLEEPING and how.method != "stop":
                return SleepOutcome.SLEPT  # taken as it is: its sleep already gave back
            if state is BackendState.READY and self.runtime.managed:
                release = self.release_policy.choose(self, how, reason)
                self._begin_stop(reason, drain_timeout_s, release=release)
            elif state is BackendState.STOPPED:
                return SleepOutcome.STOPPED
        if state is not BackendState.READY or not self.runtime.managed:
            await self.stop(reason, drain_timeout_s=drain_timeout_s)
            return SleepOutcome.STOPPED
        await self._stopped()
        self._raise_if_failed()
        return SleepOutcome.SLEPT if self.state is BackendState.SLEEPING else SleepOutcome.STOPPED

    async def stop_if_asleep(self, reason: StopReason) -> bool:
        """Stop it when it is asleep now (not when a request has begun to wake it);
        True when it was. Raises like `stop()`."""
        async with self._lock:
            if self.state is not BackendState.SLEEPING:
                return False
            self._begin_stop(reason, None)
        await self._stopped()
        self._raise_if_failed()
        return True

    async def start_logged(self, why: str) -> None:
        """`start()` for a background task: a start that fails is logged, not raised (the
        backend's state and `/status` say why)."""
        try:
            await self.start()
        except BackendUnavailable as exc:
            logger.error("start failed backend=%s why=%s error=%s", self.name, why, exc.message)

    async def _stopped(self) -> None:
        """Wait, without owning it, for the stop task begun under the lock."""
        task = self._stop_task
        assert task is not None
        await asyncio.wait({task})

    def _begin_stop(
        self, reason: StopReason, drain_timeout_s: float | None, *, release: Release | None = None
    ) -> None:
        """Under the lock: -> stopping, with the one stop task (which ends in `sleeping`
        instead when `release` says sleep and the server offers sleep mode)."""
        start_task = self._start_task
        sleep_level = None if release is None else release.level
        self.memory.releasing(sleep_level)
        self.requests.floor.clear()  # a client's keep_alive ends with any stop or sleep
        what = "stop" if sleep_level is None else f"sleep (level {sleep_level})"
        if self.state is BackendState.READY:
            self.requests.queue.collate()  # served before the stop: their drain waits for them
        self._set_state(BackendState.STOPPING, f"{what} requested ({reason})")
        drain = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        self._stop_task = spawn(
            self._run_stop(reason, drain, start_task, release), name=f"stop:{self.name}"
        )

    async def _run_stop(
        self,
        reason: StopReason,
        drain_s: float,
        start_task: asyncio.Task[None] | None,
        release: Release | None = None,
    ) -> None:
        sleep_level = None if release is None else release.level
        stopped_why = f"stopped by the gateway ({reason})"
        if start_task is not None and not start_task.done():
            start_task.cancel()
            await asyncio.wait({start_task})
        self.last_drain_timed_out = await self.requests.drain(drain_s)
        if release is not None and sleep_level is not None:
            if release.make_room:  # the least recently used level-1 sleepers go first
                await self.release_policy.make_room(release, self.name)
            async with self.admission.measure_sleep(self) as freed:
                slept = await self.server.sleep(sleep_level, reason)
            if slept is SleepOutcome.SLEPT:
                kept = self.memory.kept_asleep(freed.mib)
                leak = self.memory.record_sleep(sleep_level, freed.mib, kept, time.time())
                async with self._lock:
                    self.memory.slept(kept, sleep_level)
                    if leak is None:
                        why = rules.asleep_reason(sleep_level, reason, kept)
                        self._set_state(BackendState.SLEEPING, why)
                        return
                    # The sleep guard: a sleeper that leaks is stopped, not left asleep.
                    reason, stopped_why = StopReason.SLEEP_GUARD, self._guard.leaked(leak)
        try:
            await self.server.stop()
        except RuntimeFailure as exc:
            # The server may still hold its memory: keep counting it.
            await self._fail(f"stop failed: {exc}", holds_vram=True)
            return
        async with self._lock:
            self._set_state(BackendState.STOPPED, stopped_why)
        self._metrics.stops.labels(self.name, reason).inc()

    async def adopt(self) -> None:
        """At gateway start: take over a server that is already running (it outlived a
        previous gateway), without an admission check since its memory is already in
        use. Leaves a server that is not running stopped."""
        found = await self.server.found_running(may_sleep=self.memory.may_have_slept)
        if not found.running:
            return
        level = await self.server.asleep_level() if found.asleep else None
        async with self._lock:
            if self.state is not BackendState.STOPPED:
                return
            if found.gpus is not None and found.gpus != self.memory.gpus:
                self.memory.place(found.gpus, "found running there at gateway start")
            if found.asleep:
                # `level` from its /metrics; None (not known): its wake reloads the weights.
                self.memory.found_asleep(level)
                known = "" if level is None else f" (level {level})"
                self._set_state(BackendState.SLEEPING, f"found asleep at gateway start{known}")
                return
            task = self._begin_start(adopt=True)
        await asyncio.wait({task})

    async def abandon(self) -> None:
        """At gateway shutdown: stop waiting for starts and stops in progress. A container
        keeps doing what it was told (the engine finishes a stop on its own)."""
        await self.want.close()
        for task in (self._start_task, self._stop_task):
            await cancel_and_wait(task)

    async def _fail(self, reason: str, *, holds_vram: bool = False) -> None:
        async with self._lock:
            if self.state not in (BackendState.FAILED, BackendState.STOPPED):
                self._set_state(BackendState.FAILED, reason)
                self.watcher.failed()
                self.memory.released(holds_vram=holds_vram)

    async def _guard_stopped(self, cause: GuardCause, detail: str) -> None:
        """A wake that failed stopped its server: stopped, and its next request (a pinned
        one: the watch) starts it cold. (A leak: `_run_stop`; a pinned one stays stopped.)"""
        async with self._lock:
            if self.state is not BackendState.STARTING:
                return  # a stop took over
            self._set_state(BackendState.STOPPED, self._guard.tripped(cause, detail))
            self.watcher.guard_stopped = True
        self._metrics.stops.labels(self.name, StopReason.SLEEP_GUARD).inc()

    async def _restart_down(self) -> None:
        """The watch's restart of a pinned backend that is down, past its backoff."""
        async with self._lock:
            if self.watcher.down and not self._blocks:
                failures = self.watcher.backoff.failures
                logger.info("restarting pinned backend backend=%s failures=%d", self.name, failures)
                self._begin_start(adopt=False)

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

    def block(
        self,
        key: str,
        description: str,
        kind: BlockKind = BlockKind.BLOCKED,
        expires_at: float | None = None,
    ) -> None:
        """Refuse to start (requests get `backend_<kind>` naming `description`, with a
        `Retry-After` from `expires_at` when the hold ends by itself) until `unblock(key)`."""
        self._blocks.add(key, description, kind, expires_at)

    def unblock(self, key: str) -> None:
        self._blocks.remove(key)

    def take_over(self, old: Backend, *, leaving: str) -> None:
        """Before this object replaces `old` (a configuration reload rebuilt it): the
        holds placed on `old` from outside carry over: its blocks (a yield, a zone, the
        GPU profile; all but `leaving`, the reload's own), keep-warm holds and the
        profile's yield method."""
        self._blocks.take(old._blocks, leaving=leaving)
        self.requests.take_over(old.requests)
        self.memory.take_over(old.memory)

    def _set_state(self, target: BackendState, reason: str | None) -> None:
        previous = self.state
        self.state = check_transition(previous, target)
        self.reason = reason
        self.watcher.refused = self.watcher.guard_stopped = False
        if target in (BackendState.STOPPED, BackendState.FAILED) or (
            target is BackendState.SLEEPING and self.memory.asleep_level != 1
        ):
            self.adapters_epoch += 1
        if target is BackendState.STOPPED:
            self.memory.released()
        elif target is BackendState.READY:
            self.ready_since = time.monotonic()
            self.requests.grant()
        self.requests.queue.wake_all()  # the holders of tickets decide again
        self._metrics.set_backend_state(self.name, target)
        if self._events is not None:
            self._events.record(
                "backend_state", backend=self.name, state=str(target), reason=reason
            )
        log = logger.warning if target is BackendState.FAILED else logger.info
        log("backend state backend=%s from=%s to=%s reason=%s", self.name, previous, target,
            reason or "-")  # fmt: skip
