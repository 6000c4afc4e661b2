"""The turns on a host's GPUs: one lock per GPU, held by a start for its whole start (two
vLLM instances profiling memory at once break each other), by an eviction, a zone grant or
the yield. Locks are taken in one order everywhere (no deadlock). A start waiting for a
GPU's turn says whose it is (`waiting for b's start on GPU 0`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable

from app.lifecycle.admission import Claimant
from app.lifecycle.load import WAITING_FOR_TURN
from app.vram.residency import turn_text


class GpuLocks:
    def __init__(self, gpu_name: Callable[[int], str]) -> None:
        self._gpu_name = gpu_name
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._holders: dict[int, str] = {}  # GPU -> whose its lock is: "b's start"

    @contextlib.asynccontextmanager
    async def hold(
        self, gpus: Iterable[int], whose: str, *, waiter: Claimant | None = None
    ) -> AsyncIterator[None]:
        """Hold the locks of `gpus` for `whose`; a `waiter` (a start) that waits for one
        says for what meanwhile (`waiting for b's start on GPU 0`)."""
        held: list[int] = []
        try:
            for gpu in sorted(set(gpus)):  # one order everywhere: no deadlock
                lock = self._locks[gpu]
                if waiter is not None and lock.locked():
                    with waiter.server.waiting_for_vram(
                        functools.partial(self._wait_text, gpu), phase=WAITING_FOR_TURN
                    ):
                        await lock.acquire()
                else:
                    await lock.acquire()
                held.append(gpu)
                self._holders[gpu] = whose
            yield
        finally:
            for gpu in reversed(held):
                del self._holders[gpu]
                self._locks[gpu].release()

    def _wait_text(self, gpu: int) -> str:
        whose = self._holders.get(gpu, "another start")  # between two holders
        return turn_text([(whose, [self._gpu_name(gpu)])])
