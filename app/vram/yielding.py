"""VRAM yield: free the GPU for an outside workload (a game) with one call, and give it
back afterwards. Built on the arbiter's zones: a yield is the zone named `yield`, so it
is saved, survives restarts and blocks what it took like any zone.

- `yield_vram()` blocks the yieldable backends of the GPU (lazy ones, and pinned ones
  when asked), then drains and stops (or puts to sleep, per backend `yield.method` and
  its host RAM budget: `app.lifecycle.release`) the
  ones holding memory, lowest priority first, until the probe shows `min_free_mib` free
  or nothing is left. It answers what it measured: `freed_mib` is free memory after
  minus before, as the probe saw it, never the sum of configured sizes.
- While it holds, requests for the backends it took get 503 `backend_yielded` (or their
  fallback chain) and never wake them; the zone keeps other starts out of the memory it
  freed.
- Each caller holds the yield on its own (a `Hold`, keyed by its `reason`, with its own
  `ttl_s`): a call while a yield holds adds (or renews) the caller's hold and takes
  nothing more. `restore(reason=R)` ends R's hold; the yield ends only when no hold
  remains (`restore()` without a reason ends every hold: "give it all back"); an expired
  hold ends likewise.
- The yield's end unblocks them: pinned ones are woken or started at once, one after the
  other in the order of their last use (most recent first: `wake_order`), each once the
  one before is ready (or failed), so the model wanted first is back first; lazy ones on
  their next request. A yield that comes meanwhile ends that sequence first.

Answers are typed (`app.vram.yield_answers`); `app.api.views` renders them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from app.errors import BackendUnavailable, ErrorCode, InvalidRequest, YieldNotMet
from app.events import EventLog
from app.gpu.telemetry import GpuSnapshot, free_mib
from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.state import BackendState, SleepOutcome, StopReason
from app.tasks import OwnedTasks, cancel_and_wait
from app.vram.arbiter import VramArbiter
from app.vram.tenant import Tenant
from app.vram.yield_answers import HoldReleased, RestoreReport, YieldOutcome, YieldRequest
from app.vram.zones import YIELD_ZONE, Hold, YieldReport, Zone, gpu_name

logger = logging.getLogger(__name__)

SETTLE_POLL_S: Final = 0.25
# A sleep frees an amount nobody can know beforehand: accept the reading once it has
# held still for one poll and either grew or this long has passed.
SETTLE_QUIET_S: Final = 1.0
# Restore waits this long for pinned backends to be back before it answers; the rest
# are reported as still starting.
RESTORE_WAIT_S: Final = 15.0
# A restore's `why` when the yield undoes itself: its `min_free_mib` was not reached.
NOT_MET: Final = "not met"


class VramYield:
    def __init__(
        self,
        arbiter: VramArbiter,
        backends: Mapping[str, Tenant],
        metrics: LifecycleMetrics,
        events: EventLog,
        *,
        settle_timeout_s: float,
        restore_wait_s: float = RESTORE_WAIT_S,
    ) -> None:
        self._arbiter = arbiter
        self.host = arbiter.host
        self._backends = backends
        self._metrics = metrics
        self._events = events
        self._settle_timeout_s = settle_timeout_s
        self._lock = asyncio.Lock()  # one yield or restore at a time
        self._tasks = OwnedTasks()  # the restore's sequence of starts
        self._restore_wait_s = restore_wait_s
        self._waking: asyncio.Task[None] | None = None  # the last restore's sequence
        metrics.declare_host(self.host)

    @property
    def current(self) -> Zone | None:
        return self._arbiter.book.zones.get(YIELD_ZONE)

    def sync_metrics(self) -> None:
        zone = self.current
        self._metrics.yield_active.labels(self.host).set(1 if zone is not None else 0)
        freed = None if zone is None or zone.report is None else zone.report.freed_mib
        if freed is not None:
            self._metrics.yield_freed.labels(self.host).set(freed * 1024 * 1024)

    # -- yield -------------------------------------------------------------------------

    async def yield_vram(self, request: YieldRequest) -> YieldOutcome:
        """Take the yield, or answer the one held. One verdict for every caller (the page,
        the CLI, a script): an ask beyond the GPU's memory is refused before anything is
        taken (`InvalidRequest`), and a `min_free_mib` the yield could not reach is undone
        here, then refused (`YieldNotMet`, saying what was free and what still holds it)."""
        async with self._lock:
            current = self.current
            if current is not None:
                self._metrics.yields.labels(self.host, "already").inc()
                return await self._join(current, request)
            await cancel_and_wait(self._waking)  # a restore's starts: not one more
            try:
                zone = await self._yield(request)
            except BaseException:
                self._metrics.yields.labels(self.host, "failed").inc()
                raise
            if zone.report is not None and zone.report.met is False:
                self._metrics.yields.labels(self.host, "failed").inc()
                await self._restore(NOT_MET)
                raise YieldNotMet(not_met_message(self.host, zone.report, self._holding(request)))
            self._metrics.yields.labels(self.host, "yielded").inc()
            self.sync_metrics()
            return YieldOutcome(zone, already=False, hold=zone.holds[0])

    async def _join(self, current: Zone, request: YieldRequest) -> YieldOutcome:
        """Add (or renew) the caller's hold of the yield that holds; nothing more is taken
        (its `min_free_mib`, `include_pinned` and `gpu` are not acted on). Saved first:
        when that fails (`StateWriteError`), nothing changes."""
        now = time.time()
        mine = current.hold_of(request.reason)
        hold = Hold(
            request.reason,
            now if mine is None else mine.granted_at,
            None if request.ttl_s is None else now + request.ttl_s,
        )
        others = tuple(h for h in current.holds if h.holder != request.reason)
        zone = current.with_holds((*others, hold))
        await self._arbiter.book.hold_zone(zone)
        self._block(zone)
        logger.info("vram yield hold host=%s holder=%s holders=%s renewed=%s", self.host,
                    request.reason, ",".join(zone.holders), mine is not None)  # fmt: skip
        self._events.record("vram_yield_hold", host=self.host, holder=request.reason,
                            holders=list(zone.holders), renewed=mine is not None)  # fmt: skip
        return YieldOutcome(zone, already=True, hold=hold)

    def _block(self, zone: Zone) -> None:
        """Re-place the yield's blocks: their words name its holders, their end is its."""
        for name in zone.blocks:
            backend = self._backends.get(name)
            if backend is not None:
                backend.block(zone.block_key, zone.describe(), zone.block_kind, zone.expires_at)

    def _holding(self, request: YieldRequest) -> list[str]:
        """What still holds memory on the yield's GPU: the backends the yield did not take
        (out of its scope, or failed to stop), in words."""
        holding = []
        for backend in self._backends.values():
            if request.gpu not in backend.memory.gpus or not _holds_memory(backend):
                continue
            if backend.state is BackendState.SLEEPING:
                continue  # asleep: what it keeps is in the free memory's count
            why = (
                "pinned; include_pinned is false"
                if not backend.lazy and not request.include_pinned
                else "not managed by the gateway"
                if not backend.runtime.managed
                else str(backend.state)
            )
            holding.append(f"{backend.name} ({why})")
        return holding

    async def _yield(self, request: YieldRequest) -> Zone:
        """Block what is in scope, take it (starts first, then in `_yield_order` until
        `min_free_mib` is free), measure, and hold the memory as the yield zone."""
        began = time.monotonic()
        reading = await self._arbiter.read_gpus()
        stats = None if reading is None else reading.usable(request.gpu)
        if reading is not None and stats is None:
            raise InvalidRequest(
                f"{gpu_name(self.host, request.gpu)} is not present (the probe sees "
                f"{reading.usable_indices})",
                param="gpu",
            )
        if stats is not None and request.min_free_mib is not None:
            total = stats.total_mib
            if request.min_free_mib > total:
                raise InvalidRequest(
                    f"min_free_mib {request.min_free_mib:,} MiB is more than "
                    f"{gpu_name(self.host, request.gpu)} has ({total:,} MiB in all): "
                    "nothing was stopped",
                    param="min_free_mib",
                    code=ErrorCode.INVALID_VALUE,
                )
        free_before = free_mib(reading, request.gpu)
        draft = self._draft(request)
        scope = self._scope(request)
        # A yield that could not be saved is refused before anything is blocked or stopped.
        await self._arbiter.book.ensure_state_writable()
        # Block first: from here on, nothing in scope starts or wakes.
        for backend in scope:
            backend.block(draft.block_key, draft.describe(), draft.block_kind, draft.expires_at)
        logger.info("vram yield host=%s reason=%s min_free_mib=%s gpu=%d scope=%s free_mib=%s",
                    self.host, request.reason, request.min_free_mib, request.gpu,
                    ",".join(b.name for b in scope) or "-", free_before)  # fmt: skip
        taken = _Taken()
        try:
            # A start in progress holds the GPU's lock until it ends: stop it first.
            starting = [b for b in scope if b.state is BackendState.STARTING]
            await self._take(starting, taken, sleep=False)
            async with self._arbiter.locked([request.gpu], "the VRAM yield"):
                await self._take_in_order(request, scope, taken, free_before)
                reading = await self._arbiter.read_gpus()
                free_after = free_mib(reading, request.gpu) if reading is not None else None
                # What still runs keeps serving; what is down stays blocked.
                blocked = _keep_blocked(scope, taken, draft.block_key)
                report = _report(
                    request,
                    taken,
                    probe_name=self._arbiter.probe_name,
                    free_before=free_before if reading is not None else None,
                    free_after=free_after,
                    blocked=blocked,
                    duration_s=time.monotonic() - began,
                )
                zone = _held_zone(draft, request, taken, blocked, report)
                # Awaited: the loop serves while the store's thread saves the hold.
                await self._arbiter.book.hold_zone(zone)
        except BaseException:
            for backend in scope:
                backend.unblock(draft.block_key)
            raise
        self._record(report)
        return zone

    def _draft(self, request: YieldRequest) -> Zone:
        """The zone before anything is taken: its block key, words and expiry."""
        now = time.time()
        expires = None if request.ttl_s is None else now + request.ttl_s
        return Zone(
            YIELD_ZONE,
            holder=request.reason,
            gpu=request.gpu,
            mib=0,
            granted_at=now,
            expires_at=expires,
            stopped=(),
            kind="yield",
            host=self.host,
            holds=(Hold(request.reason, now, expires),),
        )

    def _scope(self, request: YieldRequest) -> list[Tenant]:
        """The backends a yield may take: managed ones on its GPU, lazy ones only unless
        it includes pinned ones."""
        return [
            b
            for b in self._backends.values()
            if request.gpu in b.memory.gpus
            and b.runtime.managed
            and (b.lazy or request.include_pinned)
        ]

    async def _take_in_order(
        self, request: YieldRequest, scope: list[Tenant], taken: _Taken, free: int
    ) -> None:
        """Take one backend at a time in `_yield_order`, waiting for what each freed to
        show, until `min_free_mib` is free (or all of them are taken)."""
        for backend in _yield_order(scope):
            if request.min_free_mib is not None and free >= request.min_free_mib:
                return
            if backend.name in taken.stopped or not _holds_memory(backend):
                continue
            if await self._take([backend], taken, sleep=True):
                expected = backend.memory.vram_mib if backend.name in taken.stopped else None
                settled = await self._settle(request, free, expected)
                if settled is not None:
                    free = free_mib(settled, request.gpu)

    def _record(self, report: YieldReport) -> None:
        logger.info("vram yielded host=%s reason=%s freed_mib=%s free_mib=%s stopped=%s slept=%s "
                    "already_asleep=%s", self.host, report.reason, report.freed_mib,
                    report.free_mib, ",".join(report.stopped) or "-",
                    ",".join(report.slept) or "-",
                    ",".join(report.already_asleep) or "-")  # fmt: skip
        self._events.record(
            "vram_yield",
            host=self.host,
            reason=report.reason,
            freed_mib=report.freed_mib,
            free_mib=report.free_mib,
            stopped=list(report.stopped),
            slept=list(report.slept),
            already_asleep=list(report.already_asleep),
            duration_s=report.duration_s,
        )

    async def _take(self, backends: list[Tenant], taken: _Taken, *, sleep: bool) -> bool:
        """Stop (or put to sleep) `backends` together; True when any was (one asleep
        already is taken as it is, `already_asleep`: it frees nothing now)."""

        async def one(backend: Tenant) -> SleepOutcome | None:
            if (
                sleep
                and backend.state is BackendState.SLEEPING
                and backend.memory.yield_how.method != "stop"
            ):
                # Asleep already (blocked, so no wake begins): taken as it is, freeing
                # nothing now; None: the answer's `already_asleep`.
                return None
            if sleep and backend.state in (BackendState.READY, BackendState.SLEEPING):
                # `yield:` (or a GPU profile's method), the sleep level chosen against
                # the host RAM budget like an idle stop's or an eviction's.
                return await backend.give_back(StopReason.YIELD, backend.memory.yield_how)
            await backend.stop(StopReason.YIELD)
            return SleepOutcome.STOPPED

        results = await asyncio.gather(*(one(b) for b in backends), return_exceptions=True)
        took = False
        for backend, result in zip(backends, results, strict=True):
            if isinstance(result, BackendUnavailable):
                taken.failed[backend.name] = result.message
                continue
            if isinstance(result, BaseException):
                raise result
            if result is None:
                taken.already_asleep.append(backend.name)
                continue
            took = True
            (taken.slept if result is SleepOutcome.SLEPT else taken.stopped).append(backend.name)
            if backend.last_drain_timed_out:
                taken.drain_timeouts.append(backend.name)
        return took

    async def _settle(
        self, request: YieldRequest, before: int, expected_mib: int | None
    ) -> GpuSnapshot | None:
        """Poll the probe until the memory a stop or sleep freed shows (bounded)."""
        began = time.monotonic()
        deadline = began + self._settle_timeout_s
        previous: int | None = None
        while True:
            reading = await self._arbiter.read_gpus()
            if reading is None:
                return None
            free = free_mib(reading, request.gpu)
            if request.min_free_mib is not None and free >= request.min_free_mib:
                return reading
            if expected_mib is not None and free - before >= expected_mib * 0.9:
                return reading
            quiet = time.monotonic() - began >= SETTLE_QUIET_S
            if free == previous and (free > before or quiet):
                return reading
            if time.monotonic() >= deadline:
                logger.warning("freed memory still not visible gpu=%d free_mib=%d before_mib=%d "
                               "waited_s=%g", request.gpu, free, before,
                               self._settle_timeout_s)  # fmt: skip
                return reading
            previous = free
            await asyncio.sleep(SETTLE_POLL_S)

    # -- restore -----------------------------------------------------------------------

    async def restore(
        self, why: str = "restored", *, holder: str | None = None
    ) -> RestoreReport | HoldReleased | None:
        """End `holder`'s hold; without one, every hold. When no hold remains, give the
        memory back: unblock, wake or start pinned backends now (waiting up to
        `RESTORE_WAIT_S`), leave lazy ones for their next request. `HoldReleased`: others
        hold on (or `holder` held nothing while they do). None: no yield."""
        async with self._lock:
            current = self.current
            if current is None or holder is None:
                return await self._restore(why)
            others = tuple(h for h in current.holds if h.holder != holder)
            if len(others) == len(current.holds):
                return HoldReleased(holder, released=False, zone=current)
            if not others:
                return await self._restore(why)
            return HoldReleased(holder, released=True, zone=self._let_go(current, others, why))

    def _let_go(self, current: Zone, remaining: tuple[Hold, ...], why: str) -> Zone:
        """End the holds not in `remaining` (some remain): the yield holds on for them."""
        ended = [h.holder for h in current.holds if h not in remaining]
        zone = current.with_holds(remaining)
        self._arbiter.book.keep_zone(zone)
        self._block(zone)
        logger.info("vram yield hold ended host=%s why=%s ended=%s holders=%s", self.host, why,
                    ",".join(ended), ",".join(zone.holders))  # fmt: skip
        self._events.record("vram_yield_hold_ended", host=self.host, why=why, ended=ended,
                            holders=list(zone.holders))  # fmt: skip
        return zone

    async def _restore(self, why: str) -> RestoreReport | None:
        """`restore()` under the lock (a yield that is not met is undone by it too)."""
        zone = self._arbiter.book.drop_zone(YIELD_ZONE, why)
        if zone is None:
            return None
        if why != NOT_MET:  # an undone yield counts as failed, not as restored
            self._metrics.yields.labels(self.host, why if why == "expired" else "restored").inc()
        self.sync_metrics()
        pinned: list[Tenant] = []
        on_demand: list[Tenant] = []
        for name in zone.blocks:
            backend = self._backends.get(name)
            if backend is None:
                continue
            (on_demand if backend.lazy else pinned).append(backend)
        order = wake_order(pinned)
        ended: list[str] = []  # the starts of the sequence that ended, in order
        if order:
            self._waking = self._tasks.spawn(self._wake(order, ended), f"restore:{self.host}")
            await asyncio.wait({self._waking}, timeout=self._restore_wait_s)
        back = [n for n in ended if _ready(self._backends[n])]
        names = [b.name for b in order]
        answer = RestoreReport(
            reason=zone.holder,
            why=why,
            back=tuple(back),
            starting=tuple(n for n in names if n not in ended),
            failed={n: self._backends[n].reason for n in ended if n not in back},
            on_demand=tuple(b.name for b in on_demand),
            yielded_for_s=round(time.time() - zone.granted_at, 1),
            ended=zone.holders,
            order=tuple(names),
        )
        lazy = [b.name for b in on_demand]
        shown = [",".join(names) or "-", ",".join(back) or "-", ",".join(lazy) or "-"]
        logger.info("vram restored host=%s why=%s order=%s back=%s on_demand=%s",
                    self.host, why, *shown)  # fmt: skip
        self._events.record(
            "vram_restore", host=self.host, why=why, order=names, back=back, on_demand=lazy
        )
        return answer

    async def _wake(self, order: list[Tenant], ended: list[str]) -> None:
        """Start (or wake) `order` one after the other, each once the one before is ready
        or failed; `ended` gets each name as its start ends."""
        for backend in order:
            await backend.start_logged("restore")
            ended.append(backend.name)

    async def expire(self, now: float) -> RestoreReport | None:
        """End the holds whose `ttl_s` ran out; the yield ends when none remains."""
        zone = self.current
        if zone is None or not any(h.expired(now) for h in zone.holds):
            return None  # checked first: the reaper must not wait for a yield under way
        async with self._lock:
            zone = self.current
            if zone is None:
                return None
            remaining = tuple(h for h in zone.holds if not h.expired(now))
            if len(remaining) == len(zone.holds):
                return None
            if remaining:
                self._let_go(zone, remaining, "expired")
                return None
            return await self._restore("expired")

    async def close(self) -> None:
        await self._tasks.close()


@dataclass(slots=True)
class _Taken:
    """What one yield took so far, by how (and what it could not take)."""

    stopped: list[str] = field(default_factory=list)
    slept: list[str] = field(default_factory=list)
    already_asleep: list[str] = field(default_factory=list)  # asleep before: taken as they are
    failed: dict[str, str] = field(default_factory=dict)
    drain_timeouts: list[str] = field(default_factory=list)


def _keep_blocked(scope: list[Tenant], taken: _Taken, block_key: str) -> list[str]:
    """Of what the yield did not take, the stopped ones stay blocked (their names); the
    others are unblocked and keep serving."""
    blocked = []
    for backend in scope:
        if backend.name in (*taken.stopped, *taken.slept, *taken.already_asleep):
            continue
        if backend.state is BackendState.STOPPED:
            blocked.append(backend.name)
        else:
            backend.unblock(block_key)
    return blocked


def _held_zone(
    draft: Zone, request: YieldRequest, taken: _Taken, blocked: list[str], report: YieldReport
) -> Zone:
    """The yield zone: the memory free after it (at most `min_free_mib`), what it stopped
    or keeps blocked, what it put to sleep, and its report."""
    held = report.free_mib or 0
    if request.min_free_mib is not None:
        held = min(held, request.min_free_mib)
    return Zone(
        YIELD_ZONE,
        holder=request.reason,
        gpu=request.gpu,
        mib=max(0, held),
        granted_at=draft.granted_at,
        expires_at=draft.expires_at,
        stopped=tuple(taken.stopped + blocked),
        kind="yield",
        slept=tuple(taken.slept + taken.already_asleep),  # both blocked while it holds
        report=report,
        host=draft.host,
        holds=draft.holds,
    )


def _yield_order(scope: list[Tenant]) -> list[Tenant]:
    """Lowest priority first; at equal priority lazy before pinned, longest idle first."""
    now = time.monotonic()
    return sorted(scope, key=lambda b: (b.config.priority, not b.lazy, -b.requests.idle_s(now)))


def wake_order(backends: list[Tenant]) -> list[Tenant]:
    """The order a restore brings `backends` back in: the most recently used first
    (`requests.last_used`: when a request last began or ended; a backend never used
    counts from the gateway's start), ties in the order given."""
    return sorted(backends, key=lambda b: -b.requests.last_used)


def _ready(backend: Tenant) -> bool:
    return backend.state is BackendState.READY


def _holds_memory(backend: Tenant) -> bool:
    return backend.memory.holds_vram or backend.state in (BackendState.READY, BackendState.STOPPING)


def _report(
    request: YieldRequest,
    taken: _Taken,
    *,
    probe_name: str,
    free_before: int | None,
    free_after: int | None,
    blocked: list[str],
    duration_s: float,
) -> YieldReport:
    freed = None if free_before is None or free_after is None else free_after - free_before
    return YieldReport(
        reason=request.reason,
        gpu=request.gpu,
        min_free_mib=request.min_free_mib,
        include_pinned=request.include_pinned,
        freed_mib=freed,
        free_mib=free_after,
        free_mib_before=free_before,
        met=(
            None
            if request.min_free_mib is None or free_after is None
            else free_after >= request.min_free_mib
        ),
        measured_by=probe_name if freed is not None else f"{probe_name}: no reading, not measured",
        stopped=tuple(taken.stopped),
        slept=tuple(taken.slept),
        already_asleep=tuple(taken.already_asleep),
        blocked=tuple(blocked),
        failed=dict(taken.failed),
        drain_timeouts=tuple(taken.drain_timeouts),
        duration_s=round(duration_s, 3),
    )


def not_met_message(host: str, report: YieldReport, holding: list[str]) -> str:
    """Why a yield was refused after it was tried: what was free against what was asked,
    that it is undone, what it had taken and what still holds the memory."""
    free = "unknown memory" if report.free_mib is None else f"{report.free_mib:,} MiB"
    took = [
        f"stopped {', '.join(report.stopped)}" if report.stopped else "",
        f"put {', '.join(report.slept)} to sleep" if report.slept else "",
    ]
    did = " and ".join(t for t in took if t) or "took nothing"
    if report.already_asleep:  # kept asleep: what they keep is in the count already
        did += f", {', '.join(report.already_asleep)} already asleep"
    if report.freed_mib is not None and (report.stopped or report.slept):
        did += f" (freeing {report.freed_mib:,} MiB)"
    still = (
        f"still holding memory: {', '.join(holding)}"
        if holding
        else "the rest is held by processes the gateway does not run"
    )
    return (
        f"only {free} free on {gpu_name(host, report.gpu)} after the yield, not the "
        f"{report.min_free_mib or 0:,} MiB asked for (min_free_mib): the yield is undone and "
        f"the models may use the GPU again. It {did}; {still}"
    )
