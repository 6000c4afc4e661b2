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

import httpx

from app.auth import Authenticator
from app.gpu.probe import GpuProbe, NoProbe, SimProbe
from app.lifecycle.arbiter import VramArbiter
from app.lifecycle.backend import Backend
from app.lifecycle.state import BackendState
from app.metrics import Metrics
from app.routing.dispatcher import Dispatcher
from app.routing.registry import Registry
from app.runtimes.base import Runtime
from app.runtimes.docker import DockerRuntime
from app.runtimes.docker_api import DockerApi
from app.runtimes.external import ExternalRuntime
from app.runtimes.process import ProcessRuntime
from app.settings import BackendConfig, Settings
from app.settings import DockerRuntime as DockerConfig
from app.settings import ProcessRuntime as ProcessConfig
from app.state_store import StateStore
from app.tasks import cancel_and_wait, spawn
from app.upstreams.http import HttpUpstream

logger = logging.getLogger(__name__)

RuntimeFactory = Callable[[str, BackendConfig], Runtime]
ProbeFactory = Callable[[Callable[[], dict[int, int]]], GpuProbe]


@dataclass(frozen=True)
class Seams:
    """What tests (and later features) may replace: transports, runtimes, the GPU probe.

    `runtime_factory=None` builds the runtime each backend's config names;
    `probe_factory=None` builds the probe `gpu.probe` names (it receives the gateway's
    placed-memory callback, which the simulated probe reports as used).
    """

    health_transport: httpx.AsyncBaseTransport | None = None
    docker_transport: httpx.AsyncBaseTransport | None = None
    runtime_factory: RuntimeFactory | None = None
    probe_factory: ProbeFactory | None = None


class Services:
    def __init__(self, settings: Settings, metrics: Metrics, seams: Seams) -> None:
        self.settings = settings
        self.metrics = metrics
        self.started_at = time.time()
        self.registry = Registry.from_backends(settings.backends)
        self.auth = Authenticator(settings.api_keys, settings.admin_key)
        self.health_client = httpx.AsyncClient(transport=seams.health_transport)
        self.docker: DockerApi | None = None
        if any(isinstance(cfg.runtime, DockerConfig) for cfg in settings.backends.values()):
            self.docker = DockerApi(settings.docker, transport=seams.docker_transport)
        self.arbiter = VramArbiter(
            self._build_probe(seams),
            StateStore(settings.state_dir),
            reclaim_timeout_s=settings.gpu.reclaim_timeout_s,
        )
        runtime_factory = seams.runtime_factory or self._build_runtime
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
                    extra_headers=_upstream_auth(name, cfg),
                ),
                self.health_client,
                metrics,
                admission=self.arbiter,
                wake_notice_s=settings.wake_notice_s,
            )
            for name, cfg in settings.backends.items()
        }
        self.arbiter.attach(self.backends)
        self.dispatcher = Dispatcher(self.registry, self.backends, metrics)
        self.model_list = self._render_model_list()
        self._start_tasks: list[asyncio.Task[None]] = []
        self._watch_task: asyncio.Task[None] | None = None
        self._reaper_task: asyncio.Task[None] | None = None

    def _build_probe(self, seams: Seams) -> GpuProbe:
        # The probe is built before the arbiter it reports for: read it when asked.
        def placed() -> dict[int, int]:
            return self.arbiter.placed_mib()

        if seams.probe_factory is not None:
            return seams.probe_factory(placed)
        gpu = self.settings.gpu
        if gpu.probe == "sim":
            return SimProbe(gpu.sim.total_mib, gpu.sim.count, placed)
        return NoProbe()

    def _build_runtime(self, name: str, config: BackendConfig) -> Runtime:
        if isinstance(config.runtime, ProcessConfig):
            return ProcessRuntime(name, config.runtime)
        if isinstance(config.runtime, DockerConfig):
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

        Zones saved by an earlier run are re-applied first. Pinned backends are started;
        lazy ones that already run (they outlived an earlier gateway) are adopted, or
        stopped when a zone blocks them; other lazy ones wait for their first request.
        """
        for zone in self.arbiter.restore():
            logger.info("zone restored zone=%s holder=%s blocks=%s",
                        zone.name, zone.holder, ",".join(zone.stopped) or "-")  # fmt: skip
        for name, backend in self.backends.items():
            if not backend.runtime.managed:
                await backend.start()  # no I/O: marks it ready, health is watched below
            elif backend.lazy:
                self._start_tasks.append(spawn(self._adopt(backend), name=f"adopt:{name}"))
            else:
                self._start_tasks.append(spawn(backend.start(), name=f"startup:{name}"))
        self._watch_task = spawn(self._watch_loop(), name="backend-watch")
        self._reaper_task = spawn(self._reaper_loop(), name="reaper")

    async def _adopt(self, backend: Backend) -> None:
        await backend.adopt()
        if backend.blocks and backend.state is not BackendState.STOPPED:
            # Running although a zone holds its memory (started by hand, or the gateway
            # died before stopping it): it was adopted only to be stopped now.
            await backend.stop("zone", drain_timeout_s=0)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.gather(*(b.watch() for b in self.backends.values()))
            await asyncio.sleep(self.settings.health_interval_s)

    async def _reaper_loop(self) -> None:
        """Stops lazy backends idle past `idle_ttl_s` and releases expired zones."""
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            self.arbiter.expire_zones(time.time())
            now = time.monotonic()
            idle = [b for b in self.backends.values() if b.lazy and b.config.idle_ttl_s > 0]
            if idle:
                await asyncio.gather(*(b.stop_if_idle(now) for b in idle), return_exceptions=True)

    async def close(self) -> None:
        """Stop what the gateway runs itself; containers outlive it and are adopted later."""
        await cancel_and_wait(self._reaper_task)
        await cancel_and_wait(self._watch_task)
        for task in self._start_tasks:
            await cancel_and_wait(task)
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
        await self.health_client.aclose()
        if self.docker is not None:
            await self.docker.aclose()


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
