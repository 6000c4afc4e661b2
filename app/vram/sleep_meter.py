"""What a backend's sleep freed on its GPU, as the probe saw it: used before minus after,
around `POST /sleep`. Sleeps are measured one at a time, so one's window does not see
another's; not under the GPUs' locks (an eviction sleeps its victims while holding them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from app.gpu.telemetry import GpuSnapshot
from app.lifecycle.admission import Claimant, Freed

logger = logging.getLogger(__name__)

# A GPU with this much free or less is full: its used memory is no measure of a sleep.
FULL_MIB: Final = 256


class SleepMeter:
    def __init__(
        self, read: Callable[[], Awaitable[GpuSnapshot | None]], gpu_name: Callable[[int], str]
    ) -> None:
        """`read`: a fresh GPU sample (None: no telemetry); `gpu_name`: `node-c GPU 0`."""
        self._read = read
        self._gpu_name = gpu_name
        self._measuring = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def measure(self, backend: Claimant) -> AsyncIterator[Freed]:
        """Around `POST /sleep`: GPU used before minus after on its first GPU (unknown
        without readings). Not under the GPU locks: an eviction sleeps its victims while
        holding them.

        Unknown too when the GPU was full before the sleep (`FULL_MIB` free or less): its
        reading stops at the total while more is asked for (a game beside the models), and
        what the sleep frees is taken at once by what waited, so "before minus after"
        would count the neighbour's memory as the sleeper's (issue 32: 7,607 MiB "held"
        by a sleeper that kept 1,375)."""
        freed = Freed()
        gpu = backend.memory.gpus[0]
        async with self._measuring:
            before = await self._read()
            yield freed
            after = await self._read()
        first_before = None if before is None else before.usable(gpu)
        first_after = None if after is None else after.usable(gpu)
        if first_before is None or first_after is None:
            return
        if first_before.free_mib <= FULL_MIB:
            logger.info("sleep not measured: the GPU was full backend=%s gpu=%s used_mib=%d "
                        "total_mib=%d", backend.name, self._gpu_name(gpu), first_before.used_mib,
                        first_before.total_mib)  # fmt: skip
            return
        freed.mib = first_before.used_mib - first_after.used_mib
