"""The control plane's background work, owned in one place: bringing backends up when the
gateway starts, the loops that keep them honest, and stopping what the gateway runs when
it stops.

- Bring-up (`start`): zones and the yield saved by an earlier run are re-applied first,
  then the saved GPU profile; footprints are planned from the GPU's size. Servers that
  already run (they outlived an earlier gateway) are adopted without an admission check,
  or stopped when a hold or the profile blocks them (a server the yield put to sleep stays
  asleep); pinned ones that do not run are started; lazy ones wait for their first request.
- Loops, each a named task: the health watch (every `health_interval_s`), the reaper (idle
  lazy backends, expired zones and yield, every `reaper_interval_s`), the vLLM `/metrics`
  scrape and the GPU poll (every `gpu.poll_interval_s`).
- `close()`: cancels the loops and bring-ups, stops the backends the gateway runs itself
  (containers outlive it and are adopted next time), stops waiting for starts and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Final

from app.gpu.poller import GpuMonitor
from app.lifecycle.arbiter import VramArbiter
from app.lifecycle.auto_yield import AutoYield
from app.lifecycle.backend import Backend
from app.lifecycle.blocks import BlockKind
from app.lifecycle.profile_switch import ProfileSwitch
from app.lifecycle.state import BackendState, StopReason
from app.lifecycle.vram_yield import VramYield
from app.planner.footprint import planned_footprint_mib
from app.settings import Settings
from app.tasks import cancel_and_wait, spawn
from app.upstreams.vllm_load import ScrapeError, VllmLoadMetrics

logger = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S: Final = 2.0  # one backend's /metrics
LOOP_STOP_S: Final = 3.0  # at shutdown, how long the loops may finish their current step


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        backends: Mapping[str, Backend],
        arbiter: VramArbiter,
        vram_yield: VramYield,
        profiles: ProfileSwitch,
        gpu_monitor: GpuMonitor | None,
        vllm_load: VllmLoadMetrics,
        auto_yield: AutoYield | None = None,
    ) -> None:
        self._settings = settings
        self._backends = backends
        self._arbiter = arbiter
        self._yield = vram_yield
        self._profiles = profiles
        self._gpu_monitor = gpu_monitor
        self._vllm_load = vllm_load
        self._auto_yield = auto_yield
        self._start_tasks: list[asyncio.Task[None]] = []
        self._loops: list[asyncio.Task[None]] = []
        # Set at shutdown: the loops end after the step in progress instead of being
        # cancelled in the middle of a request (asyncio leaks a socket whose connect is
        # cancelled), within LOOP_STOP_S; stragglers are cancelled.
        self._stopping = asyncio.Event()
        self._gpu_poll: asyncio.Task[None] | None = None

    # -- footprints ---------------------------------------------------------------------

    def plan_footprints(self) -> None:
        """Each backend's admission footprint: `vram_mib`, else the active profile's share
        of its GPU, else the planner's estimate from its model description. Re-planned when
        the profile changes; the GPU's size comes from the last snapshot."""
        profile = self._profiles.profile
        snapshot = None if self._gpu_monitor is None else self._gpu_monitor.snapshot
        for name, backend in self._backends.items():
            stats = None if snapshot is None else snapshot.gpu(backend.config.gpus[0])
            total = None if stats is None else stats.total_mib
            chosen = None if profile is None else profile.models.get(name)
            backend.plan(
                planned_footprint_mib(
                    backend.config,
                    gpu_total_mib=total,
                    profile_planned_mib=None
                    if profile is None
                    else profile.planned_mib(name, total),
                    cuda_graphs=None if chosen is None else chosen.cuda_graphs,
                )
            )
            if backend.footprint is None and backend.lazy and backend.config.on_local_gpus:
                logger.warning("no VRAM footprint known, admission will not check it "
                               "backend=%s", name)  # fmt: skip

    # -- bring-up -----------------------------------------------------------------------

    async def start(self) -> None:
        """Re-apply what was saved, plan, then bring backends up in the background (the
        gateway serves while they load) and start the loops."""
        for zone in self._arbiter.restore():
            logger.info("zone restored zone=%s holder=%s blocks=%s",
                        zone.name, zone.holder, ",".join(zone.blocks) or "-")  # fmt: skip
        self._profiles.restore()
        if self._gpu_monitor is not None:
            await self._gpu_monitor.poll_once()  # the GPU's size, for planned footprints
        self.plan_footprints()
        self._yield.sync_metrics()
        for name, backend in self._backends.items():
            self._start_tasks.append(spawn(self._bring_up(backend), name=f"startup:{name}"))
        self._loops = [
            spawn(self._watch_loop(), name="backend-watch"),
            spawn(self._reaper_loop(), name="reaper"),
            spawn(self._scrape_loop(), name="vllm-scrape"),
        ]
        if self._gpu_monitor is not None:
            # No socket in a GPU sample: this one is simply cancelled at shutdown.
            self._gpu_poll = spawn(self._gpu_monitor.run(), name="gpu-poll")
            if self._auto_yield is not None:
                loop = self._auto_yield_loop(self._gpu_monitor, self._auto_yield)
                self._loops.append(spawn(loop, name="auto-yield"))

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
            await backend.start_logged("startup")

    # -- loops --------------------------------------------------------------------------

    async def _pause(self, seconds: float) -> bool:
        """Wait `seconds`; False once shutdown began (the loop should end)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return not self._stopping.is_set()

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.gather(*(b.watch() for b in self._backends.values()))
            if not await self._pause(self._settings.health_interval_s):
                return

    async def _scrape_loop(self) -> None:
        """Each backend's vLLM `/metrics` (KV cache usage, running and waiting) per poll."""
        while True:
            await asyncio.gather(*(self._scrape(b) for b in self._backends.values()))
            if not await self._pause(self._settings.gpu.poll_interval_s):
                return

    async def _scrape(self, backend: Backend) -> None:
        if backend.state is not BackendState.READY:
            self._vllm_load.update(backend.name, None)
            return
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
            self._arbiter.expire_zones(time.time())
            await self._yield.expire(time.time())
            now = time.monotonic()
            idle = [b for b in self._backends.values() if b.lazy and b.config.idle_ttl_s > 0]
            if idle:
                await asyncio.gather(*(b.stop_if_idle(now) for b in idle), return_exceptions=True)

    async def _auto_yield_loop(self, monitor: GpuMonitor, auto: AutoYield) -> None:
        """Reads the GPU monitor's last snapshot at its poll rate (no extra samples)."""
        while await self._pause(self._settings.gpu.poll_interval_s):
            await auto.step(monitor.snapshot, time.monotonic())

    # -- shutdown -----------------------------------------------------------------------

    async def close(self) -> None:
        """Stop what the gateway runs itself; containers outlive it and are adopted later."""
        self._stopping.set()
        if self._loops:
            await asyncio.wait(self._loops, timeout=LOOP_STOP_S)
        for loop in self._loops:
            await cancel_and_wait(loop)
        if self._gpu_poll is not None:
            await cancel_and_wait(self._gpu_poll)
        for task in self._start_tasks:
            await cancel_and_wait(task)
        await self._yield.close()
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
