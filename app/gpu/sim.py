"""SimSource: the simulated GPU of the demo and the tests as a `GpuSource`.

Its used memory is what a callback says (the gateway's placed memory: the `vram_mib` of
running backends plus zone holds), clamped to the total. It has no utilization,
temperature, power or processes: those fields are None, never invented.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from app.gpu.telemetry import MIB, GpuSnapshot, GpuStats


class SimSource:
    name = "sim"

    def __init__(self, total_mib: int, count: int, used_mib: Callable[[], Mapping[int, int]]):
        self._total_mib = total_mib
        self._count = count
        self._used_mib = used_mib

    async def sample(self) -> GpuSnapshot:
        used = self._used_mib()
        total = self._total_mib * MIB
        gpus = []
        for index in range(self._count):
            used_bytes = min(total, max(0, used.get(index, 0)) * MIB)
            gpus.append(
                GpuStats(
                    index=index,
                    uuid=f"GPU-sim-{index}",
                    name="Simulated GPU",
                    total_bytes=total,
                    used_bytes=used_bytes,
                    free_bytes=total - used_bytes,
                )
            )
        return GpuSnapshot(
            source=self.name, gpus=tuple(gpus), taken_at=time.monotonic(), taken_at_wall=time.time()
        )

    async def close(self) -> None:
        return None
