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
from app.lifecycle.backend import Backend
from app.metrics import Metrics
from app.routing.dispatcher import Dispatcher
from app.routing.registry import Registry
from app.runtimes.base import Runtime
from app.runtimes.external import ExternalRuntime
from app.runtimes.process import ProcessRuntime
from app.settings import BackendConfig, Settings
from app.settings import ProcessRuntime as ProcessConfig
from app.tasks import cancel_and_wait, spawn
from app.upstreams.http import HttpUpstream

logger = logging.getLogger(__name__)

RuntimeFactory = Callable[[str, BackendConfig], Runtime]


def default_runtime(name: str, config: BackendConfig) -> Runtime:
    if isinstance(config.runtime, ProcessConfig):
        return ProcessRuntime(name, config.runtime)
    return ExternalRuntime(config.url)


@dataclass(frozen=True)
class Seams:
    """What tests (and later features) may replace: transports, runtimes."""

    health_transport: httpx.AsyncBaseTransport | None = None
    runtime_factory: RuntimeFactory = default_runtime


class Services:
    def __init__(self, settings: Settings, metrics: Metrics, seams: Seams) -> None:
        self.settings = settings
        self.metrics = metrics
        self.started_at = time.time()
        self.registry = Registry.from_backends(settings.backends)
        self.auth = Authenticator(settings.api_keys, settings.admin_key)
        self.health_client = httpx.AsyncClient(transport=seams.health_transport)
        self.backends = {
            name: Backend(
                name,
                cfg,
                seams.runtime_factory(name, cfg),
                HttpUpstream(
                    name,
                    cfg.url,
                    settings.backend_timeouts(name),
                    max_connections=cfg.max_connections,
                    extra_headers=_upstream_auth(name, cfg),
                ),
                self.health_client,
                metrics,
            )
            for name, cfg in settings.backends.items()
        }
        self.dispatcher = Dispatcher(self.registry, self.backends, metrics)
        self.model_list = self._render_model_list()
        self._start_tasks: list[asyncio.Task[None]] = []
        self._watch_task: asyncio.Task[None] | None = None

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
        """Launch managed backends in the background; the gateway serves while they load."""
        for name, backend in self.backends.items():
            if backend.runtime.managed:
                self._start_tasks.append(spawn(backend.start(), name=f"startup:{name}"))
            else:
                await backend.start()  # no I/O: marks it ready, health is watched below
        self._watch_task = spawn(self._watch_loop(), name="backend-watch")

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.gather(*(b.watch() for b in self.backends.values()))
            await asyncio.sleep(self.settings.health_interval_s)

    async def close(self) -> None:
        await cancel_and_wait(self._watch_task)
        for task in self._start_tasks:
            await cancel_and_wait(task)
        results = await asyncio.gather(
            *(b.stop() for b in self.backends.values()), return_exceptions=True
        )
        for name, result in zip(self.backends, results, strict=True):
            if isinstance(result, BaseException):
                logger.error("backend stop failed backend=%s", name, exc_info=result)
        for backend in self.backends.values():
            await backend.upstream.close()
        await self.health_client.aclose()


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
