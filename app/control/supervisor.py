"""The control plane's background work, owned in one place: bringing backends up when the
gateway starts, the loops that keep them honest, and stopping what the gateway runs when
it stops.

- Bring-up (`start`): zones and the yields saved by an earlier run (every host's) are
  re-applied first,
  then the saved GPU profile; footprints are planned from the GPU's size. Processes a
  crashed gateway left running that the configuration no longer wants are stopped first
  (the `sweep`; `app.runtimes.process`). Servers that
  already run (they outlived an earlier gateway) are adopted without an admission check,
  or stopped when a hold or the profile blocks them (a server the yield put to sleep stays
  asleep); pinned ones that do not run are started; lazy ones wait for their first request.
  Standby ones, once the others are up, are loaded one at a time when they fit without
  evicting anything, and put to sleep (level 1) as soon as they are ready (`standby`).
- Loops, each a named task: the health watch (every `health_interval_s`; an external
  server found healthy is asked what it serves, `Backend.learn`), the reaper (idle
  lazy backends, expired zones and yield, every `reaper_interval_s`), the vLLM `/metrics`
  scrape and the GPU poll of each host (every `gpu.poll_interval_s`). The health check
  and the scrape of an idle backend's server come less often, up to every 30 s
  (`app.control.polling`), so they do not fill its access log.
- `close()`: cancels the loops and bring-ups, stops the backends the gateway runs itself
  (containers outlive it and are adopted next time), stops waiting for starts and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from app.control.polling import poll_due, poll_interval_s
from app.errors import BackendUnavailable
from app.gpu.poller import GpuMonitor
from app.lifecycle import admission as rules
from app.lifecycle.backend import Backend
from app.lifecycle.blocks import BlockKind
from app.lifecycle.profile_switch import ProfileSwitch
from app.lifecycle.state import BackendState, StopReason
from app.planner.footprint import planned_footprint_mib
from app.settings import Settings
from app.tasks import cancel_and_wait, spawn
from app.upstreams.vllm_load import ScrapeError, VllmLoadMetrics
from app.vram.auto_yield import AutoYield
from app.vram.hosts import Hosts
from app.vram.zone_book import section_host

logger = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S: Final = 2.0  # one backend's /metrics
LOOP_STOP_S: Final = 3.0  # at shutdown, how long the loops may finish their current step


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        backends: Mapping[str, Backend],
        hosts: Hosts,
        profiles: ProfileSwitch,
        vllm_load: VllmLoadMetrics,
        *,
        sweep: Callable[[], Awaitable[None]] | None = None,
        poll_clock: Callable[[], float] | None = None,
    ) -> None:
        """`sweep`: run once at start before any backend is brought up (stops the
        processes a crashed gateway left that the configuration no longer wants).
        `poll_clock`: the monotonic clock idle backends' polls are spaced by
        (`app.control.polling`; default `time.monotonic`)."""
        self._settings = settings
        self._clock = poll_clock or time.monotonic
        # (loop, backend) -> when the loop last polled the backend's server.
        self._polled: dict[tuple[str, str], float] = {}
        self._sweep = sweep
        self._backends = backends
        self._hosts = hosts
        self._profiles = profiles
        self._vllm_load = vllm_load
        self._start_tasks: list[asyncio.Task[None]] = []
        self._loops: list[asyncio.Task[None]] = []
        # Set at shutdown: the loops end after the step in progress instead of being
        # cancelled in the middle of a request (asyncio leaks a socket whose connect is
        # cancelled), within LOOP_STOP_S; stragglers are cancelled.
        self._stopping = asyncio.Event()
        self._gpu_polls: list[asyncio.Task[None]] = []
        # Set when the first round of the health watch is done: external servers that
        # answered have said what they serve (`Backend.learn`) by then.
        self.watched = asyncio.Event()

    # -- footprints ---------------------------------------------------------------------

    def plan_footprints(self) -> None:
        """Each backend's admission footprint: `vram_mib`, else the active profile's share
        of its GPU, else the planner's estimate from its model description. Re-planned when
        the profile changes; the GPU's size comes from the last snapshot of its host."""
        profile = self._profiles.profile
        for name, backend in self._backends.items():
            host = self._hosts.get(backend.config.host_name)
            monitor = None if host is None else host.monitor
            snapshot = None if monitor is None else monitor.snapshot
            stats = None if snapshot is None else snapshot.gpu(backend.memory.gpus[0])
            total = None if stats is None else stats.total_mib
            chosen = None if profile is None else profile.models.get(name)
            backend.memory.plan(
                planned_footprint_mib(
                    backend.config,
                    gpu_total_mib=total,
                    profile_planned_mib=None
                    if profile is None
                    else profile.planned_mib(name, total),
                    cuda_graphs=None if chosen is None else chosen.cuda_graphs,
                )
            )
            # A lazy one, or one that names its host only to be counted there.
            named = backend.lazy or backend.config.host is not None
            if backend.memory.footprint is None and named and backend.config.gpus_accounted:
                logger.warning("no VRAM footprint known, admission will not check it "
                               "backend=%s host=%s", name, backend.config.host_name)  # fmt: skip

    # -- bring-up -----------------------------------------------------------------------

    async def start(self) -> None:
        """Re-apply what was saved, plan, then bring backends up in the background (the
        gateway serves while they load) and start the loops."""
        self._forgotten_hosts()
        for host in self._hosts.values():
            for zone in host.arbiter.book.restore():
                logger.info("zone restored host=%s zone=%s holder=%s blocks=%s", host.name,
                            zone.name, zone.holder, ",".join(zone.blocks) or "-")  # fmt: skip
        self._profiles.restore()
        monitors = [h.monitor for h in self._hosts.values() if h.monitor is not None]
        # The GPUs' sizes, for planned footprints.
        await asyncio.gather(*(monitor.poll_once() for monitor in monitors))
        self.plan_footprints()
        for host in self._hosts.values():
            host.vram_yield.sync_metrics()
        self._start_tasks.append(spawn(self._bring_up_all(), name="startup"))
        self._loops = [
            spawn(self._watch_loop(), name="backend-watch"),
            spawn(self._reaper_loop(), name="reaper"),
            spawn(self._scrape_loop(), name="vllm-scrape"),
        ]
        for host in self._hosts.values():
            if host.ram.monitor is not None:  # its RAM for /status and the metrics
                poll = host.ram.monitor.run()
                self._gpu_polls.append(spawn(poll, name=f"host-ram-poll:{host.name}"))
            if host.monitor is None:
                continue
            # A sample's socket (Prometheus) is the source's own: the poll is cancelled at
            # shutdown and the source closed after it.
            self._gpu_polls.append(spawn(host.monitor.run(), name=f"gpu-poll:{host.name}"))
            if host.auto_yield is not None:
                loop = self._auto_yield_loop(
                    host.monitor, host.auto_yield, host.gpu.poll_interval_s
                )
                self._loops.append(spawn(loop, name=f"auto-yield:{host.name}"))

    def _forgotten_hosts(self) -> None:
        """Zones saved for a host no longer configured are left in the state file (they
        come back if the host does), and said at start rather than dropped silently."""
        store = self._hosts.local.arbiter.book.store
        for section in store.names():
            host = section_host(section)
            if host is not None and host not in self._hosts and store.section(section):
                logger.warning("saved zones of a host not in hosts: left as they are "
                               "host=%s zones=%d", host, len(store.section(section)))  # fmt: skip

    async def _bring_up_all(self) -> None:
        """What a crashed gateway left behind is dealt with first (its memory must be free
        before a start counts on it), then every backend is brought up, each in its task."""
        if self._sweep is not None:
            await self._sweep()
        first = []
        for name, backend in self._backends.items():
            first.append(spawn(self._bring_up(backend), name=f"startup:{name}"))
        self._start_tasks += first
        standby = [b for b in self._backends.values() if b.standby]
        if standby:
            if first:
                await asyncio.wait(first)  # pinned ones first: they must run
            for backend in standby:  # one at a time (two vLLM loads at once break each other)
                await self._standby(backend)

    async def _standby(self, backend: Backend) -> None:
        """Load a standby backend and put it to sleep; left as it is when blocked, already
        asleep or busy, and left stopped (its first request cold-starts it) when it does
        not fit without evicting something."""
        if backend.blocks or backend.state not in (BackendState.STOPPED, BackendState.READY):
            return
        if backend.state is BackendState.STOPPED:
            if backend.admission.fits_now(backend) is False:
                logger.warning("standby backend not loaded: it does not fit without evicting "
                               "backend=%s", backend.name)  # fmt: skip
                return
            await backend.start_logged("standby")
        if backend.state is not BackendState.READY or backend.requests.in_flight:
            return  # failed, refused, or a request got to it first: it stays as it is
        try:  # level 1 as the host RAM budget allows (`Backend.give_back`)
            await backend.give_back(StopReason.STANDBY, rules.STANDBY_RELEASE)
        except BackendUnavailable as exc:
            logger.error("standby sleep failed backend=%s error=%s", backend.name, exc.message)

    async def _bring_up(self, backend: Backend) -> None:
        if not backend.runtime.managed:
            if not backend.blocks:
                await backend.start()  # no I/O: marks it ready, health is watched below
            return
        await backend.adopt()
        blocked = backend.blocks.kind
        if blocked is not None:
            # A server asleep for a yield stays asleep; a disabled one is stopped.
            keep_asleep = (
                backend.state is BackendState.SLEEPING and blocked is not BlockKind.DISABLED
            )
            if backend.state is not BackendState.STOPPED and not keep_asleep:
                # Running although a hold or the profile keeps it down (started by hand,
                # or the gateway died before stopping it): adopted only to be stopped.
                await backend.stop(blocked.stop_reason, drain_timeout_s=0)
            return
        if not backend.lazy and backend.state is BackendState.STOPPED:
            await backend.start_logged("startup")  # standby ones: `_standby`, after these

    # -- loops --------------------------------------------------------------------------

    async def _pause(self, seconds: float) -> bool:
        """Wait `seconds`; False once shutdown began (the loop should end)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return not self._stopping.is_set()

    def _due(self, loop: str, backend: Backend, round_s: float, *, failing: bool) -> bool:
        """Whether this round of `loop` polls `backend`'s server: every round while it is
        in use or `failing`, less often the longer it is idle (`app.control.polling`)."""
        now = self._clock()
        key = (loop, backend.name)
        last = self._polled.get(key)
        interval = poll_interval_s(round_s, backend.requests.idle_s(now), failing=failing)
        if not poll_due(None if last is None else now - last, interval, round_s):
            return False
        self._polled[key] = now
        return True

    async def _watch_loop(self) -> None:
        while True:
            round_s = self._settings.health_interval_s
            await asyncio.gather(
                *(
                    b.watcher.watch(
                        health=self._due("health", b, round_s, failing=b.server.healthy is not True)
                    )
                    for b in self._backends.values()
                )
            )
            self.watched.set()
            if not await self._pause(round_s):
                return

    async def _scrape_loop(self) -> None:
        """Each backend's vLLM `/metrics` (KV cache usage, running and waiting) per poll;
        an idle backend's less often (`app.control.polling`)."""
        while True:
            round_s = self._settings.gpu.poll_interval_s
            await asyncio.gather(*(self._scrape(b, round_s) for b in self._backends.values()))
            if not await self._pause(round_s):
                return

    async def _scrape(self, backend: Backend, round_s: float) -> None:
        if backend.state is not BackendState.READY:
            self._vllm_load.update(backend.name, None)
            return
        if not self._due("metrics", backend, round_s, failing=False):
            return  # idle: its last reading stands
        try:
            load = await backend.server.vllm.load(timeout_s=SCRAPE_TIMEOUT_S)
        except ScrapeError as exc:
            logger.debug("vllm metrics scrape failed backend=%s error=%s", backend.name, exc)
            self._vllm_load.update(backend.name, None)
            return
        self._vllm_load.update(backend.name, load)

    async def _reaper_loop(self) -> None:
        """Stops (or puts to sleep, per `idle.method`) lazy backends idle past
        `idle_ttl_s`, releases expired zones and ends an expired yield."""
        while await self._pause(self._settings.reaper_interval_s):
            for host in self._hosts.values():
                host.arbiter.book.expire_zones(time.time())
                await host.vram_yield.expire(time.time())
            now = time.monotonic()
            idle = [b for b in self._backends.values() if b.lazy and b.config.idle_ttl_s > 0]
            if idle:
                await asyncio.gather(*(b.stop_if_idle(now) for b in idle), return_exceptions=True)

    async def _auto_yield_loop(
        self, monitor: GpuMonitor, auto: AutoYield, interval_s: float
    ) -> None:
        """Reads the GPU monitor's last snapshot at its poll rate (no extra samples)."""
        while await self._pause(interval_s):
            await auto.step(monitor.snapshot, time.monotonic())

    # -- shutdown -----------------------------------------------------------------------

    async def close(self) -> None:
        """Stop what the gateway runs itself; containers outlive it and are adopted later."""
        self._stopping.set()
        if self._loops:
            await asyncio.wait(self._loops, timeout=LOOP_STOP_S)
        for loop in self._loops:
            await cancel_and_wait(loop)
        for poll in self._gpu_polls:
            await cancel_and_wait(poll)
        for task in self._start_tasks:
            await cancel_and_wait(task)
        for host in self._hosts.values():
            await host.vram_yield.close()
        await self._profiles.close()
        owned = [b for b in self._backends.values() if b.runtime.stop_on_shutdown]
        results = await asyncio.gather(
            *(b.stop(StopReason.SHUTDOWN, drain_timeout_s=0) for b in owned),
            return_exceptions=True,
        )
        for backend, result in zip(owned, results, strict=True):
            if isinstance(result, BaseException):
                logger.error("backend stop failed backend=%s", backend.name, exc_info=result)
        for backend in self._backends.values():
            await backend.abandon()
