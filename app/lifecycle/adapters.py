"""The LoRA adapters loaded on one backend's vLLM (`adapters:` in models.yaml).

- An adapter is loaded on first use (`POST /v1/load_lora_adapter`), single-flight: the
  first request starts the load, concurrent ones await the same task through
  `asyncio.shield` (a client that goes away never cancels a load others wait on).
- At most `max_loras` stay loaded (vLLM's `--max-loras`, default 1): loading another
  unloads the least recently used first (`POST /v1/unload_lora_adapter`).
- The loaded set belongs to one life of the server: `Backend.adapters_epoch` moves when
  the server loses them (stopped, failed, or asleep at level 2, which discards the weights;
  a level-1 sleep offloads the weights pool, LoRA slots included, and brings it back, so
  it keeps them). A request after that loads its adapter again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Protocol

from app.errors import UpstreamUnavailable
from app.tasks import spawn
from app.upstreams.vllm import LoraError

logger = logging.getLogger(__name__)


class LoraClient(Protocol):
    async def load_lora_adapter(self, name: str, path: str) -> None: ...

    async def unload_lora_adapter(self, name: str) -> None: ...


class LoadedAdapters:
    def __init__(self, backend: str, client: LoraClient, max_loras: int) -> None:
        self._backend = backend
        self._client = client
        self._max = max_loras
        self._loaded: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._epoch = 0

    @property
    def loaded(self) -> list[str]:
        """The adapters loaded now, least recently used first."""
        return list(self._loaded)

    async def ensure(self, name: str, path: str, epoch: int) -> None:
        """Return once adapter `name` is loaded on the server in its life `epoch`; raises
        `UpstreamUnavailable` when it cannot be loaded."""
        if epoch != self._epoch:  # the server lost what it had loaded
            self._loaded.clear()
            self._loading.clear()  # loads of the old life may not count for this one
            self._epoch = epoch
        if name in self._loaded:
            self._loaded.move_to_end(name)
            return
        task = self._loading.get(name)
        if task is None:
            task = spawn(self._load(name, path, epoch), name=f"lora-load:{self._backend}:{name}")
            self._loading[name] = task
        await asyncio.shield(task)

    async def _load(self, name: str, path: str, epoch: int) -> None:
        try:
            while self._loaded and len(self._loaded) + len(self._loading) > self._max:
                oldest = next(iter(self._loaded))
                del self._loaded[oldest]
                try:
                    await self._client.unload_lora_adapter(oldest)
                except LoraError as exc:  # vLLM evicts from its own cache anyway
                    logger.warning(
                        "lora unload failed backend=%s adapter=%s error=%s",
                        self._backend,
                        oldest,
                        exc,
                    )
                else:
                    logger.info("lora unloaded backend=%s adapter=%s", self._backend, oldest)
            try:
                await self._client.load_lora_adapter(name, path)
            except LoraError as exc:
                raise UpstreamUnavailable(
                    f"Backend '{self._backend}' could not load the LoRA adapter '{name}': {exc}",
                    kind="lora_load",
                ) from None
            if epoch == self._epoch:
                self._loaded[name] = None
            logger.info("lora loaded backend=%s adapter=%s", self._backend, name)
        finally:
            if self._loading.get(name) is asyncio.current_task():
                del self._loading[name]
