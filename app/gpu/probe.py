"""The GPU probe seam: how much memory each GPU has in use, as last seen.

`SimProbe` is the GPU of the demo and the tests (and of machines without NVML): its
used memory is what the gateway itself placed there, the `vram_mib` of running
backends plus zone holds, read through a callback. The NVML poller (telemetry issue)
implements the same protocol with measured numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuMemory:
    index: int
    total_mib: int
    used_mib: int

    @property
    def free_mib(self) -> int:
        return max(0, self.total_mib - self.used_mib)


@dataclass(frozen=True, slots=True)
class GpuReading:
    gpus: Mapping[int, GpuMemory]
    taken_at: float  # time.monotonic() of the reading


class GpuProbe(Protocol):
    name: str

    async def read(self) -> GpuReading | None:
        """The latest reading, or None when there is no probe (admission is off)."""


class SimProbe:
    name = "sim"

    def __init__(self, total_mib: int, count: int, placed: Callable[[], Mapping[int, int]]):
        self._total = total_mib
        self._count = count
        self._placed = placed

    async def read(self) -> GpuReading:
        placed = self._placed()
        gpus = {
            i: GpuMemory(i, self._total, min(self._total, placed.get(i, 0)))
            for i in range(self._count)
        }
        return GpuReading(gpus, time.monotonic())


class NoProbe:
    name = "none"

    async def read(self) -> None:
        return None


def free_on(reading: GpuReading | None, gpu: int) -> int:
    """Free MiB on `gpu` in `reading` (0 when there is no reading or no such GPU)."""
    if reading is None or gpu not in reading.gpus:
        return 0
    return reading.gpus[gpu].free_mib
