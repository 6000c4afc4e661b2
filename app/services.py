"""Services: the object graph, built once per app in the lifespan. No globals.

Owns every long-lived resource (backends and their runtimes, connection pools, the
health client, background tasks) and closes them in `close()`, in reverse order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import httpx

from app.auth import Authenticator
from app.events import EventLog
from app.gpu.collector import GpuCollector, VllmLoadMetrics
from app.gpu.ledger import read_ledger
from app.gpu.nvml import NvmlSource
from app.gpu.poller import GpuMonitor
from app.gpu.probe import GpuProbe, NoProbe
from app.gpu.sim import SimSource
from app.gpu.telemetry import GpuSource
from app.lifecycle.arbiter import VramArbiter
from app.lifecycle.backend import Backend
from app.lifecycle.profile_switch import ProfileSwitch
from app.lifecycle.state import BackendState
from app.lifecycle.store import StateStore
from app.lifecycle.vram_yield import VramYield
from app.metrics import Metrics
from app.planner.footprint import planned_footprint_mib
from app.routing.chains import build_cloud
from app.routing.dispatcher import Dispatcher
from app.routing.registry import Registry
from app.runtimes.base import Runtime
from app.runtimes.docker import DockerRuntime
from app.runtimes.docker_api import DockerApi
from app.runtimes.external import ExternalRuntime
from app.runtimes.process import ProcessRuntime
from app.settings import BackendConfig, DockerRuntimeConfig, ProcessRuntimeConfig, Settings
from app.tasks import cancel_and_wait, spawn
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm import VllmControl
from app.upstreams.vllm_load import ScrapeError, scrape_load

logger = logging.getLogger(__name__)

RuntimeFactory = Callable[[str, BackendConfig], Runtime]
GpuSourceFactory = Callable[[Callable[[], dict[int, int]]], GpuSource]
SCRAPE_TIMEOUT_S = 2.0  # one backend's /metrics


@dataclass(frozen=True)
class Seams:
    """What tests (and later features) may replace: transports, runtimes, the GPU source.

    `runtime_factory=None` builds the runtime each backend's config names;
    `gpu_source_factory=None` builds the source `gpu.probe` names (it receives the
    gateway's placed-memory callback, which the simulated GPU without a ledger reports
    as used).
    """

    health_transport: httpx.AsyncBaseTransport | None = None
    docker_transport: httpx.AsyncBaseTransport | None = None
    runtime_factory: RuntimeFactory | None = None
    gpu_source_factory: GpuSourceFactory | None = None


class Services:
    def __init__(self, settings: Settings, metrics: Metrics, seams: Seams) -> None:
        self.settings = settings
        self.metrics = metrics
        self.started_at = time.time()
        self.registry = Registry.from_backends(settings.backends)
        self.auth = Authenticator(settings.api_keys, settings.admin_key)
        self.health_client = httpx.AsyncClient(transport=seams.health_transport)
        self.events = EventLog()
        self.docker: DockerApi | None = None
        if any(isinstance(cfg.runtime, DockerRuntimeConfig) for cfg in settings.backends.values()):
            self.docker = DockerApi(settings.docker, transport=seams.docker_transport)
        self.gpu_monitor = self._build_monitor(seams)
        if self.gpu_monitor is not None:
            metrics.registry.register(GpuCollector(self.gpu_monitor))
        self.vllm_load = VllmLoadMetrics(metrics.registry)
        store = StateStore(settings.state_dir)
        self.arbiter = VramArbiter(
            self.gpu_monitor or NoProbe(),
            store,
            reclaim_timeout_s=settings.gpu.reclaim_timeout_s,
        )
        runtime_factory = seams.runtime_factory or self._build_runtime
        self._upstream_headers = {
            name: _upstream_auth(name, cfg) for name, cfg in settings.backends.items()
        }
        self.backends = {
            name: Backend(
                name,
                cfg,
                runtime_factory(name, cfg),
                HttpUpstream(
                    name,
                    cfg.url,
                    settings.backend_timeouts(name),
                    max_connections=cfg.max_connections,
                    extra_headers=self._upstream_headers[name],
                ),
                self.health_client,
                metrics,
                admission=self.arbiter,
                wake_notice_s=settings.wake_notice_s,
                control=VllmControl(
                    self.health_client, cfg.url, headers=self._upstream_headers[name]
                ),
                events=self.events,
            )
            for name, cfg in settings.backends.items()
        }
        for name in self.backends:
            self.vllm_load.declare(name)
        self.arbiter.attach(self.backends)
        self.vram_yield = VramYield(
            self.arbiter,
            self.backends,
            metrics,
            self.events,
            settle_timeout_s=settings.gpu.reclaim_timeout_s,
        )
        self.profiles = ProfileSwitch(
            settings.gpu_profiles,
            self.backends,
            store,
            metrics,
            self.events,
            on_switch=self.plan_footprints,
        )
        self.cloud = build_cloud(
            settings, self.registry, self.backends, metrics, on_event=self.events.record
        )
        self.dispatcher = Dispatcher(self.registry, self.backends, metrics, self.cloud)
        self.model_list = self._render_model_list()
        self._start_tasks: list[asyncio.Task[None]] = []
        self._loops: list[asyncio.Task[None]] = []

    def _build_monitor(self, seams: Seams) -> GpuMonitor | None:
        gpu = self.settings.gpu

        # The source is built before the arbiter it reports for: read it when asked.
        def placed() -> dict[int, int]:
            return self.arbiter.placed_mib()

        source: GpuSource
        if seams.gpu_source_factory is not None:
            source = seams.gpu_source_factory(placed)
        elif gpu.probe == "nvml":
            source = NvmlSource(timeout_s=gpu.sample_timeout_s)
        elif gpu.probe == "sim":
            ledger = gpu.sim.ledger_dir
            used: Callable[[], dict[int, int]] = placed
            if ledger is not None:
                used = lambda: read_ledger(ledger, now=time.time())  # noqa: E731
            source = SimSource(gpu.sim.total_mib, gpu.sim.count, used)
        else:
            return None
        return GpuMonitor(
            source, poll_interval_s=gpu.poll_interval_s, stale_after_s=gpu.stale_after_s
        )

    def plan_footprints(self) -> None:
        """Each backend's admission footprint: `vram_mib`, else the active profile's share
        of its GPU, else the planner's estimate from its model description. Re-planned when
        the profile changes; the GPU's size comes from the last snapshot."""
        profile = self.profiles.profile
        snapshot = None if self.gpu_monitor is None else self.gpu_monitor.snapshot
        for name, backend in self.backends.items():
            stats = None if snapshot is None else snapshot.gpu(backend.config.gpus[0])
            total = None if stats is None else stats.total_mib
            chosen = None if profile is None else profile.models.get(name)
            backend.footprint = planned_footprint_mib(
                backend.config,
                gpu_total_mib=total,
                profile_planned_mib=None if profile is None else profile.planned_mib(name, total),
                cuda_graphs=None if chosen is None else chosen.cuda_graphs,
            )
            if backend.footprint is None and backend.lazy:
                logger.warning("no VRAM footprint known, admission will not check it "
                               "backend=%s", name)  # fmt: skip

    @property
    def probe(self) -> GpuProbe:
        return self.arbiter.probe

    def gpu_status(self) -> dict[str, Any]:
        if self.gpu_monitor is None:
            return {
                "source": "none",
                "up": False,
                "error": "gpu.probe is none: no GPU telemetry, VRAM admission is off",
                "gpus": [],
            }
        return self.gpu_monitor.describe()

    def fallback_status(self) -> dict[str, Any] | None:
        return self.cloud.describe()

    def _build_runtime(self, name: str, config: BackendConfig) -> Runtime:
        if isinstance(config.runtime, ProcessRuntimeConfig):
            return ProcessRuntime(name, config.runtime)
        if isinstance(config.runtime, DockerRuntimeConfig):
            assert self.docker is not None
            return DockerRuntime(name, config.runtime, self.docker)
        return ExternalRuntime(config.url)

    def _render_model_list(self) -> bytes:
        """`GET /v1/models` in OpenAI's list shape; static, so rendered once."""
        created = int(self.started_at)
        data = [
            {
                "id": entry.id,
                "object": "model",
                "created": created,
                "owned_by": entry.backend,
                "root": entry.root,
                "parent": None,
            }
            for entry in self.registry.entries
        ]
        return json.dumps({"object": "list", "data": data}).encode()

    async def start(self) -> None:
        """Bring backends up in the background; the gateway serves while they load.

        Zones and the yield saved by an earlier run are re-applied first, then the saved
        GPU profile. Servers that already run (they outlived an earlier gateway) are
        adopted without an admission check, or stopped when a hold or the profile blocks
        them (a server the yield put to sleep stays asleep); pinned ones that do not run
        are started; lazy ones wait for their first request.
        """
        for zone in self.arbiter.restore():
            logger.info("zone restored zone=%s holder=%s blocks=%s",
                        zone.name, zone.holder, ",".join(zone.blocks) or "-")  # fmt: skip
        self.profiles.restore()
        if self.gpu_monitor is not None:
            await self.gpu_monitor.poll_once()  # the GPU's size, for planned footprints
        self.plan_footprints()
        self.vram_yield.sync_metrics()
        for name, backend in self.backends.items():
            self._start_tasks.append(spawn(self._bring_up(backend), name=f"startup:{name}"))
        self._loops = [
            spawn(self._watch_loop(), name="backend-watch"),
            spawn(self._reaper_loop(), name="reaper"),
            spawn(self._scrape_loop(), name="vllm-scrape"),
        ]
        if self.gpu_monitor is not None:
            self._loops.append(spawn(self.gpu_monitor.run(), name="gpu-poll"))

    async def _bring_up(self, backend: Backend) -> None:
        if not backend.runtime.managed:
            if not backend.blocks:
                await backend.start()  # no I/O: marks it ready, health is watched below
            return
        await backend.adopt()
        blocked = backend.blocked_as
        if blocked is not None:
            # A server asleep for a yield stays asleep; a disabled one is stopped.
            keep_asleep = backend.state is BackendState.SLEEPING and blocked != "disabled"
            if backend.state is not BackendState.STOPPED and not keep_asleep:
                # Running although a hold or the profile keeps it down (started by hand,
                # or the gateway died before stopping it): adopted only to be stopped.
                await backend.stop(_STOP_REASONS[blocked], drain_timeout_s=0)
            return
        if not backend.lazy and backend.state is BackendState.STOPPED:
            await backend.start_logged("startup")

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.gather(*(b.watch() for b in self.backends.values()))
            await asyncio.sleep(self.settings.health_interval_s)

    async def _scrape_loop(self) -> None:
        """Each backend's vLLM `/metrics` (KV cache usage, running and waiting) per poll."""
        while True:
            await asyncio.gather(*(self._scrape(b) for b in self.backends.values()))
            await asyncio.sleep(self.settings.gpu.poll_interval_s)

    async def _scrape(self, backend: Backend) -> None:
        if backend.state is not BackendState.READY:
            self.vllm_load.update(backend.name, None)
            return
        try:
            load = await scrape_load(
                self.health_client,
                backend.config.url,
                headers=self._upstream_headers[backend.name],
                timeout_s=SCRAPE_TIMEOUT_S,
            )
        except ScrapeError as exc:
            logger.debug("vllm metrics scrape failed backend=%s error=%s", backend.name, exc)
            self.vllm_load.update(backend.name, None)
            return
        self.vllm_load.update(backend.name, load)

    async def _reaper_loop(self) -> None:
        """Stops lazy backends idle past `idle_ttl_s`, releases expired zones and ends an
        expired yield."""
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            self.arbiter.expire_zones(time.time())
            await self.vram_yield.expire(time.time())
            now = time.monotonic()
            idle = [b for b in self.backends.values() if b.lazy and b.config.idle_ttl_s > 0]
            if idle:
                await asyncio.gather(*(b.stop_if_idle(now) for b in idle), return_exceptions=True)

    async def close(self) -> None:
        """Stop what the gateway runs itself; containers outlive it and are adopted later."""
        for loop in self._loops:
            await cancel_and_wait(loop)
        for task in self._start_tasks:
            await cancel_and_wait(task)
        await self.vram_yield.close()
        await self.profiles.close()
        owned = [b for b in self.backends.values() if b.runtime.stop_on_shutdown]
        results = await asyncio.gather(
            *(b.stop("shutdown", drain_timeout_s=0) for b in owned), return_exceptions=True
        )
        for backend, result in zip(owned, results, strict=True):
            if isinstance(result, BaseException):
                logger.error("backend stop failed backend=%s", backend.name, exc_info=result)
        for backend in self.backends.values():
            await backend.abandon()
            await backend.upstream.close()
        await self.cloud.close()
        await self.health_client.aclose()
        if self.docker is not None:
            await self.docker.aclose()
        if self.gpu_monitor is not None:
            await self.gpu_monitor.close()


# The stop reason (a metric label) for a backend kept down, by what blocks it.
_STOP_REASONS: Final = {"disabled": "profile", "yielded": "yield", "blocked": "zone"}


def _upstream_auth(name: str, config: BackendConfig) -> dict[str, str] | None:
    """The upstream's own key (vLLM `--api-key`), read from the variable the config names."""
    if config.api_key_env is None:
        return None
    key = os.environ.get(config.api_key_env)
    if not key:
        logger.warning(
            "upstream key variable is unset, sending no key backend=%s variable=%s",
            name,
            config.api_key_env,
        )
        return None
    return {"authorization": f"Bearer {key}"}
