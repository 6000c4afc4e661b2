"""VramArbiter: the owner of the GPUs' memory on the gateway's side.

- Admission: a start runs inside `admit(backend)`, which holds the locks of the backend's
  GPUs for the whole start (two vLLM instances profiling memory at once break each
  other), checks free VRAM against its footprint (`Memory.vram_mib`: `vram_mib`, the
  profile's share or the planner's estimate), evicts lower-priority lazy backends when
  needed and waits until the probe shows the memory back. A start evicts lazy backends of
  its own priority too when they are idle (equals take turns: "Swap in seconds"), and busy
  ones after their `max_hold_s`. A lazy backend inside its `min_resident_s` (or a busy
  equal inside its hold) is not evicted for a start: the start waits for the protection to
  end or the equal to go idle (out of the GPUs' locks, up to its own `start_timeout_s`),
  then evicts it. A backend still starting (ready only after it has learned what it
  serves, out of the locks) is waited for the same way, then planned for again.
- Placement: a `gpus: auto` start goes to the GPU set `app.vram.choose` picks (pack or
  spread, else where eviction frees most) and holds only those GPUs' turns.
- A lazy start whose requests all left (`Claimant.want`) evicts nobody: it ends instead
  (`StartUnwanted`), whatever it would have evicted.
- A start waiting for its turn on a GPU (another model's start, a zone grant or the yield
  holds the GPU's lock) says so: `waiting for turn-b's start on GPU 0`, load phase
  `waiting_for_turn`.
- Zones: `acquire_zone()` makes room for an outside workload the same way and blocks
  what it stopped until `release_zone()` or expiry. Zones are saved in the state file
  and re-applied when the gateway starts again (`app.vram.zone_book`, its base).
- One arbiter per host (`app.vram.hosts`): it sees only that host's backends and
  GPUs, and its refusals name the host's GPUs (`node-c GPU 0`).

Free memory for admission is `total - max(measured used, placed)`, where *placed* is
what the gateway put there (the `vram_mib` of admitted backends plus zone holds). With
the simulated probe both are the same; with a real probe the larger one wins, so a zone
granted but not yet filled by its workload is still counted.

A backend asleep counts only what it still holds (`app.lifecycle.admission`), is an
eviction candidate for that much (evicting it stops it), and its wake is admitted for
what it takes back. Eviction puts a backend with `eviction.method: sleep` (or `auto`,
with sleep mode) to sleep instead of stopping it, at the level its host RAM budget
allows (`app.lifecycle.release`), and stops it after all when the sleep did not free
enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Final

from app.errors import Conflict, InvalidRequest
from app.events import EventLog
from app.gpu.poller import GpuMonitor
from app.gpu.telemetry import GpuSnapshot, free_mib
from app.lifecycle.admission import AdmissionRefused, Claimant, Freed, StartUnwanted, wake_mib
from app.lifecycle.blocks import BlockKind
from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.state import BackendState, SleepOutcome, StopReason
from app.lifecycle.store import StateStore
from app.settings.base import LOCAL_HOST
from app.vram.choose import Policy, choose, gpu_sets
from app.vram.gpu_locks import GpuLocks
from app.vram.holders import holders, residents
from app.vram.placement import Holder, Placement, Resident, describe_holders, plan_eviction
from app.vram.residency import IdleSignal, may_evict, turn_text, wait_for_starts, wait_out
from app.vram.sleep_meter import SleepMeter
from app.vram.tenant import Tenant
from app.vram.zone_book import ZoneBook
from app.vram.zones import Zone, gpu_name

logger = logging.getLogger(__name__)

RECLAIM_POLL_S: Final = 0.25


@dataclass(frozen=True, slots=True)
class ZoneGrant:
    zone: Zone
    freed_mib: int
    renewed: bool


class VramArbiter:
    def __init__(
        self,
        gpus: GpuMonitor | None,
        store: StateStore,
        *,
        reclaim_timeout_s: float,
        events: EventLog | None = None,
        metrics: LifecycleMetrics | None = None,
        host: str = LOCAL_HOST,
        policy: Policy = "pack",
    ) -> None:
        """`gpus` None: no GPU telemetry, so admission is off (every start is allowed).
        `host`: the machine whose GPUs these are (its zones are saved in their own section
        of the state file, and refusals name it)."""
        self.host = host
        self.policy: Policy = policy  # where `gpus: auto` starts go (app.vram.choose)
        self._events = events
        self.book = ZoneBook(store, host=host, events=events)  # its zones, kept and saved
        self._backends: Mapping[str, Tenant] = {}  # this host's (`attach`)
        self.monitor = gpus
        self._metrics = metrics
        self.probe_name = "none" if gpus is None else gpus.name
        self._reclaim_timeout_s = reclaim_timeout_s
        self._locks = GpuLocks(self._gpu)  # the turns on its GPUs
        self._sleeps = SleepMeter(self.read_gpus, self._gpu)  # what sleeps free
        # A backend went idle: a start waiting for an equal's turn plans again at once.
        self._idle = IdleSignal()
        # The backends whose admission is under way (not yet admitted): their start is
        # not waited for by another (`holders.residents`).
        self._admitting: set[str] = set()

    def _gpu(self, gpu: int) -> str:
        return gpu_name(self.host, gpu)

    def attach(self, backends: Mapping[str, Tenant]) -> None:
        self._backends = backends
        self.book.attach(backends)
        if self._metrics is not None:  # every swap the configuration allows, at zero
            for starter in backends.values():
                for victim in backends.values():
                    if may_evict(starter, victim):
                        self._metrics.swaps.labels(starter.name, victim.name)

    async def read_gpus(self) -> GpuSnapshot | None:
        """A fresh GPU sample (else the last good one); None: no telemetry, admission off."""
        return None if self.monitor is None else await self.monitor.read()

    # -- accounting -------------------------------------------------------------------

    def held_mib(self, *, measured: bool = False) -> dict[int, int]:
        """MiB per GPU the backends holding memory take: as admitted, or (`measured`) as
        they hold it now (`Memory.held_mib`: their last start measured, admitted where it
        measured nothing); asleep, what they still hold."""
        held: dict[int, int] = defaultdict(int)
        for backend in self._backends.values():
            mib = backend.memory.held_mib if measured else backend.memory.counted_mib
            if backend.memory.holds_vram and mib:
                for gpu in backend.memory.gpus:
                    held[gpu] += mib
        return dict(held)

    def placed_mib(self) -> dict[int, int]:
        """MiB per GPU the gateway placed: admitted backends and zone holds."""
        placed = defaultdict(int, self.held_mib())
        for zone in self.book.zones.values():
            placed[zone.gpu] += zone.mib
        return dict(placed)

    def _admissible_free(self, reading: GpuSnapshot) -> dict[int, int]:
        placed = self.placed_mib()
        return {
            gpu.index: max(0, gpu.total_mib - max(gpu.used_mib, placed.get(gpu.index, 0)))
            for gpu in reading.gpus
            if not gpu.lost
        }

    def _residents(self, exclude: str | None = None) -> list[Resident]:
        return residents(self._backends.values(), exclude, self._admitting)

    def _holders(self, gpu: int, below_priority: int | None, force: bool) -> list[Holder]:
        return holders(self._backends, self.book.zones.values(), gpu, below_priority, force)

    # -- admission ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admit(self, backend: Claimant, *, wake: bool = False) -> AsyncIterator[None]:
        """Hold the backend's GPUs for its start, first making room for its `vram_mib`
        (a `wake` from sleep: for what it takes back, its residue being counted already)
        and afterwards record what a start used (`measured_mib`)."""
        whose = f"{backend.name}'s {'wake' if wake else 'start'}"
        self._admitting.add(backend.name)
        try:
            async with self._room(backend, whose, wake=wake):
                self._admitting.discard(backend.name)
                yield
        finally:
            self._admitting.discard(backend.name)

    @contextlib.asynccontextmanager
    async def _room(self, backend: Claimant, whose: str, *, wake: bool) -> AsyncIterator[None]:
        """`admit` but its bookkeeping: placed, room made, GPUs held, what it used measured."""
        # Waiting out others' min_resident_s is bounded like the rest of a start.
        deadline = time.monotonic() + backend.config.start_timeout_s
        short_since: float | None = None  # when it first found its memory held by others
        memory = backend.memory

        def needed() -> int | None:  # read again after each wait: a plan may change it
            return wake_mib(memory.vram_mib, memory.asleep_mib) if wake else memory.vram_mib

        while True:
            # Where it goes (`gpus: auto`: chosen by what is known now, then again once it
            # holds those GPUs' turn: a start that went first may have changed the choice).
            gpus, _ = await self._where(backend, wake, needed(), None)
            async with self._locks.hold(gpus, whose, waiter=backend):
                need = needed()
                before = await self.read_gpus()
                again, why = await self._where(backend, wake, need, before)
                if again != gpus:
                    continue  # its GPUs' turn came, but another set is better now
                if not wake:
                    if backend.config.fixed_gpus is None or tuple(gpus) != memory.gpus:
                        logger.info("placed host=%s backend=%s gpus=%s why=%s", self.host,
                                    backend.name, ",".join(map(str, gpus)), why)  # fmt: skip
                    memory.place(tuple(gpus), why)
                wait: _Protected | None = None
                if need is not None and before is not None:
                    room = dict.fromkeys(gpus, need)
                    fits = self._fits(room, before)
                    if not fits and not backend.want.wanted:
                        # Its requests left: evict nobody for it (the start ends).
                        raise StartUnwanted(f"nobody waits for {whose} any more")
                    if short_since is None and not fits:
                        short_since = time.monotonic()
                    try:
                        evicted, before = await self._make_room(
                            room,
                            before,
                            below_priority=backend.config.priority,
                            equal_priority=backend.config.priority,
                            stop_reason=StopReason.EVICTION,
                            requester=backend.name,
                        )
                    except _NoRoom as exc:
                        raise AdmissionRefused(str(exc)) from None
                    except _Protected as protected:
                        wait = protected
                    else:
                        self._count_swap(backend.name, evicted, short_since)
                if wait is None:
                    yield
                    if wake:
                        return  # what a wake took back is not what a start uses
                    after = await self.read_gpus()
                    first_before = None if before is None else before.usable(gpus[0])
                    first_after = None if after is None else after.usable(gpus[0])
                    if first_before is not None and first_after is not None:
                        used = first_after.used_mib - first_before.used_mib
                        backend.memory.record_measured(max(0, used))
                    return
            # Out of the GPUs' locks: nothing is launched meanwhile, so other starts that
            # fit, zones and the yield need not wait for this one.
            if wait.plan.starting:
                starting = [self._backends[name] for name in wait.plan.starting]
                text = self._turn_text(gpus, starting)
                await wait_for_starts(backend, starting, text, str(wait), deadline)
            else:
                await wait_out(backend, wait.plan, str(wait), deadline, self._idle)

    async def _where(
        self, backend: Claimant, wake: bool, need: int | None, reading: GpuSnapshot | None
    ) -> tuple[list[int], str]:
        """The GPUs its start goes to, and why: where it is (a fixed `gpus:`, or a wake,
        which stays where it sleeps), else the set of its size on this host (or of its
        Docker placements) that `app.vram.choose` picks by `reading` (None: a new one)."""
        config = backend.config
        if wake:
            return sorted(backend.memory.gpus), backend.memory.placed_why
        if config.fixed_gpus is not None:
            return list(config.fixed_gpus), "gpus: in its config"  # in its order: CUDA's
        if self.monitor is None:
            return list(config.first_gpus), "its first GPUs (no GPU probe to choose by)"
        reading = reading or await self.read_gpus()
        sets = gpu_sets(config, None if reading is None else reading.usable_indices)
        if not sets or need is None or reading is None:
            why = "the first GPUs (no footprint or GPU reading to choose by)"
            return list(sets[0] if sets else config.first_gpus), why
        priority = backend.config.priority
        choice = choose(
            sets,
            need,
            self._admissible_free(reading),
            self._residents(exclude=backend.name),
            policy=self.policy,
            below_priority=priority,
            equal_priority=priority,
        )
        assert choice is not None  # `sets` is not empty
        return list(choice.gpus), choice.why

    def _turn_text(self, gpus: list[int], starting: list[Tenant]) -> str:
        """`waiting for b's start on GPU 0`: the starts under way on `gpus`."""
        return turn_text(
            [
                (f"{b.name}'s start", [self._gpu(g) for g in b.memory.gpus if g in gpus])
                for b in starting
            ]
        )

    def went_idle(self) -> None:
        """A backend's last request ended: wake the starts waiting for its turn."""
        self._idle.pulse()

    def fits_now(self, backend: Claimant) -> bool | None:
        """Whether its start would fit without evicting, by the monitor's last snapshot
        (no sample taken); None: no telemetry, no snapshot yet or no footprint."""
        snapshot = None if self.monitor is None else self.monitor.snapshot
        need = backend.memory.vram_mib
        if snapshot is None or need is None:
            return None
        if backend.config.fixed_gpus is not None:
            return self._fits(dict.fromkeys(backend.config.fixed_gpus, need), snapshot)
        return any(
            self._fits(dict.fromkeys(s, need), snapshot)
            for s in gpu_sets(backend.config, snapshot.usable_indices)
        )

    def _fits(self, need: dict[int, int], reading: GpuSnapshot) -> bool:
        """Whether `need` is free now, without evicting or waiting for anything."""
        free = self._admissible_free(reading)
        return all(free.get(gpu, 0) >= mib for gpu, mib in need.items())

    def _count_swap(self, name: str, evicted: tuple[str, ...], short_since: float | None) -> None:
        if self._metrics is None:
            return
        for victim in evicted:
            self._metrics.swaps.labels(name, victim).inc()
        if short_since is not None:
            self._metrics.swap_wait.labels(name).observe(time.monotonic() - short_since)

    def measure_sleep(self, backend: Claimant) -> AbstractAsyncContextManager[Freed]:
        """Around `POST /sleep`: what its GPU showed freed (`app.vram.sleep_meter`)."""
        return self._sleeps.measure(backend)

    @contextlib.asynccontextmanager
    async def locked(self, gpus: Iterable[int], whose: str) -> AsyncIterator[None]:
        """Hold the locks of `gpus`: no start, eviction or zone grant on them meanwhile.
        `whose`: what holds them, for the starts that wait (`the VRAM yield`)."""
        async with self._locks.hold(gpus, whose):
            yield

    async def _make_room(
        self,
        need: dict[int, int],
        reading: GpuSnapshot | None,
        *,
        below_priority: int | None,
        stop_reason: StopReason,
        requester: str,
        block: tuple[str, str, BlockKind, float | None] | None = None,
        force: bool = False,
        equal_priority: int | None = None,
    ) -> tuple[tuple[str, ...], GpuSnapshot | None]:
        """Evict what `plan_eviction` picks and wait for the memory; return who was stopped
        and the last reading (the one that showed the room). `reading` is the probe's
        reading the caller just took. Raises `_Protected` when only residents inside
        their min_resident_s are in the way (never with `force`: zones, the yield).

        `block` (key, description) blocks the evicted backends before they are stopped,
        so requests arriving during their drain do not wake them again.
        """
        if reading is None:
            return (), None  # no probe: admission is off
        unknown = [g for g in need if reading.usable(g) is None]
        if unknown:
            raise _NoRoom(
                f"{self._gpu(unknown[0])} is not present (the probe sees {reading.usable_indices})"
            )
        plan = self._plan(need, reading, requester, below_priority, force, equal_priority)
        if not plan.fits:
            stopping = self._stopping_on(need, requester)
            if stopping:
                # Memory already on its way back (an idle stop, say): wait for it, then
                # decide again. `stop()` joins a stop in progress.
                await asyncio.gather(*(b.stop(stop_reason) for b in stopping))
                reading = await self.read_gpus()
                if reading is None:
                    return (), None
                plan = self._plan(need, reading, requester, below_priority, force, equal_priority)
        if not plan.fits:
            refusal = self._refusal(need, reading, plan, below_priority, force)
            if plan.wait_s is None and not plan.starting:
                raise _NoRoom(refusal)
            raise _Protected(refusal, plan)
        if plan.evict:
            reading = await self._evict(plan.evict, need, stop_reason, requester, block)
        return plan.evict, reading

    def _plan(
        self,
        need: dict[int, int],
        reading: GpuSnapshot,
        requester: str,
        below: int | None,
        force: bool = False,
        equal: int | None = None,
    ) -> Placement:
        return plan_eviction(
            need,
            self._admissible_free(reading),
            self._residents(exclude=requester),
            below_priority=below,
            equal_priority=equal,
            force=force,
        )

    def _stopping_on(self, need: dict[int, int], requester: str) -> list[Tenant]:
        return [
            b
            for b in self._backends.values()
            if b.state is BackendState.STOPPING
            and b.memory.holds_vram
            and b.name != requester
            and any(g in need for g in b.memory.gpus)
        ]

    async def _evict(
        self,
        names: tuple[str, ...],
        need: dict[int, int],
        stop_reason: StopReason,
        requester: str,
        block: tuple[str, str, BlockKind, float | None] | None,
    ) -> GpuSnapshot | None:
        logger.info(
            "evicting for room requester=%s need_mib=%s evict=%s",
            requester,
            need,
            ",".join(names),
        )
        victims = [self._backends[name] for name in names]
        if block is not None:
            for victim in victims:
                victim.block(*block)
        try:
            slept = await self._release(victims, stop_reason)
            if slept:
                await self._stop_what_slept_too_little(need, slept, requester, stop_reason)
            return await self._await_reclaimed(need, names)
        except BaseException:  # refused, cancelled or failed: no zone will hold them
            if block is not None:
                for victim in victims:
                    victim.unblock(block[0])
            raise

    async def _release(self, victims: list[Tenant], reason: StopReason) -> list[Tenant]:
        """Stop the victims, or put to sleep those an eviction may (`eviction.method:
        auto` or `sleep`, ready); return those asleep now."""

        async def one(victim: Tenant) -> bool:
            # Zones and yields always stop; an eviction gives back as `eviction:` says,
            # the sleep level chosen against the host RAM budget (`Backend.give_back`).
            if reason is StopReason.EVICTION and victim.state is BackendState.READY:
                outcome = await victim.give_back(reason, victim.config.eviction)
                return outcome is SleepOutcome.SLEPT
            await victim.stop(reason)
            return False

        results = await asyncio.gather(*(one(v) for v in victims), return_exceptions=True)
        for victim, result in zip(victims, results, strict=True):
            if isinstance(result, BaseException):
                logger.error("eviction stop failed backend=%s", victim.name, exc_info=result)
        return [v for v, slept in zip(victims, results, strict=True) if slept is True]

    async def _stop_what_slept_too_little(
        self, need: dict[int, int], slept: list[Tenant], requester: str, reason: StopReason
    ) -> None:
        """The plan counted each victim's whole footprint; asleep they keep a residue.
        When the need is not met now, stop as many of them as it takes after all."""
        reading = await self.read_gpus()
        if reading is None:
            return
        names = {b.name for b in slept}
        residents = [r for r in self._residents(exclude=requester) if r.name in names]
        plan = plan_eviction(need, self._admissible_free(reading), residents)
        stop = plan.evict if plan.fits else tuple(r.name for r in residents)
        if not stop:
            return
        logger.info("sleep freed too little, stopping requester=%s stop=%s",
                    requester, ",".join(stop))  # fmt: skip
        results = await asyncio.gather(
            *(self._backends[name].stop(reason) for name in stop), return_exceptions=True
        )
        for name, result in zip(stop, results, strict=True):
            if isinstance(result, BaseException):
                logger.error("eviction stop failed backend=%s", name, exc_info=result)

    async def _await_reclaimed(
        self, need: dict[int, int], evicted: tuple[str, ...]
    ) -> GpuSnapshot | None:
        deadline = time.monotonic() + self._reclaim_timeout_s
        while True:
            reading = await self.read_gpus()
            if reading is None:
                return None
            free = self._admissible_free(reading)
            if all(free.get(g, 0) >= mib for g, mib in need.items()):
                return reading
            if time.monotonic() >= deadline:
                short = ", ".join(
                    f"{self._gpu(g)}: {free.get(g, 0)} of {mib} MiB free" for g, mib in need.items()
                )
                raise _NoRoom(
                    f"stopped {', '.join(evicted)} but the memory did not come back within "
                    f"{self._reclaim_timeout_s:g}s (gpu.reclaim_timeout_s): {short}"
                )
            await asyncio.sleep(RECLAIM_POLL_S)

    def _refusal(
        self,
        need: dict[int, int],
        reading: GpuSnapshot,
        plan: Placement,
        below_priority: int | None,
        force: bool,
    ) -> str:
        lines = []
        for gpu, short in sorted(plan.short_mib.items()):
            mem = reading.usable(gpu)
            assert mem is not None  # `_make_room` refused GPUs that are not present
            used = max(mem.used_mib, self.placed_mib().get(gpu, 0))
            lines.append(
                f"needs {need[gpu]} MiB on {self._gpu(gpu)}, {short} MiB more than eviction "
                "can free; "
                + describe_holders(
                    self._gpu(gpu), mem.total_mib, used, self._holders(gpu, below_priority, force)
                )
            )
        return "; ".join(lines)

    # -- zones --------------------------------------------------------------------------

    async def acquire_zone(
        self,
        name: str,
        *,
        holder: str,
        mib: int,
        gpu: int,
        ttl_s: float | None,
        below_priority: int | None,
    ) -> ZoneGrant:
        async with self._locks.hold([gpu], f"zone {name}"):
            now = time.time()
            expires = now + ttl_s if ttl_s is not None else None
            current = self.book.zones.get(name)
            if current is not None:
                if current.holder != holder or current.gpu != gpu or current.mib != mib:
                    raise Conflict(
                        f"{current.describe()} is already held; release it first "
                        f"(asked: {mib} MiB on {self._gpu(gpu)} for {holder!r})"
                    )
                renewed = replace(current, expires_at=expires)
                await self.book.hold_zone(renewed)  # saved off the loop, then held
                return ZoneGrant(renewed, 0, renewed=True)
            reading = await self.read_gpus()
            if reading is not None and reading.usable(gpu) is None:
                raise InvalidRequest(
                    f"{self._gpu(gpu)} is not present (the probe sees {reading.usable_indices})",
                    param="gpu",
                )
            before = free_mib(reading, gpu)
            draft = Zone(name, holder, gpu, mib, now, expires, (), host=self.host)
            # A zone that cannot be saved is refused before anything is stopped for it.
            await self.book.ensure_state_writable()
            try:
                stopped, last = await self._make_room(
                    {gpu: mib},
                    reading,
                    below_priority=below_priority,
                    stop_reason=StopReason.ZONE,
                    requester=f"zone:{name}",
                    block=(draft.block_key, draft.describe(), draft.block_kind, draft.expires_at),
                    force=True,  # an outside workload does not wait for min_resident_s
                )
            except _NoRoom as exc:
                raise Conflict(f"cannot grant {draft.describe()}: {exc}") from None
            zone = replace(draft, stopped=stopped)
            try:
                # Saved off the loop, then held; meanwhile the victims stay blocked by the
                # draft's key (the same as the zone's), so nothing wakes them.
                await self.book.hold_zone(zone)
            except BaseException:
                for backend in self._backends.values():
                    backend.unblock(draft.block_key)  # what it stopped wakes on demand
                raise
            after = free_mib(last, gpu) if stopped else before
            logger.info("zone granted host=%s zone=%s holder=%s mib=%d gpu=%d stopped=%s",
                        self.host, name, holder, mib, gpu, ",".join(stopped) or "-")  # fmt: skip
            if self._events is not None:
                self._events.record("zone_granted", host=self.host, zone=name, holder=holder,
                                    mib=mib, gpu=gpu, stopped=stopped)  # fmt: skip
            return ZoneGrant(zone, after - before, renewed=False)


class _NoRoom(Exception):
    pass


class _Protected(Exception):
    """No room now, but there will be once residents' min_resident_s (or an equal's
    `max_hold_s`) ends, or may be once the starts under way of others end (`plan`)."""

    def __init__(self, message: str, plan: Placement) -> None:
        super().__init__(message)
        self.plan = plan
