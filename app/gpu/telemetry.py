"""What the gateway knows about its GPUs: immutable samples, no I/O.

A `GpuSource` (NVML, or the simulated GPU of the demo and the tests) takes one sample of
every GPU: it is the one seam between the gateway and its GPUs, and the one thing tests
replace. The poller (`app/gpu/poller.py`) keeps the last good sample as a `GpuSnapshot`
with its age, and everything else (admission, yield, `/status`, the GPU metrics) reads
snapshots. Sizes are bytes, as NVML reports them; `total_mib` rounds down and `used_mib`
up, so free memory is never overstated.

Fields a GPU or driver does not support (power on some boards, utilization in some
containers) are `None`, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

MIB: Final = 1024 * 1024


class ProbeError(Exception):
    """A sample could not be taken (driver gone, call timed out, library missing).

    The message says why in words a user can act on; `reason` is a short stable token
    (`library_not_found`, `driver_not_loaded`, `no_permission`, `timeout`, `lost`, `error`)."""

    def __init__(self, message: str, *, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int  # as the driver reports it (host PID namespace; opaque in containers)
    used_bytes: int | None  # None: the driver does not say


@dataclass(frozen=True, slots=True)
class GpuStats:
    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None = None  # NVML v2 memory info only
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    # The GPU fell off the bus or cannot be read any more: its numbers are the last seen.
    lost: bool = False
    error: str | None = None

    @property
    def total_mib(self) -> int:
        return self.total_bytes // MIB

    @property
    def used_mib(self) -> int:
        return -(-self.used_bytes // MIB)  # round up: never overstate free memory

    @property
    def free_mib(self) -> int:
        return max(0, self.total_mib - self.used_mib)


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One sample of every GPU. `taken_at` is `time.monotonic()`, `taken_at_wall` is
    `time.time()` (for `/status`)."""

    source: str  # "nvml", "sim"
    gpus: tuple[GpuStats, ...]
    taken_at: float
    taken_at_wall: float
    driver_version: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def gpu(self, index: int) -> GpuStats | None:
        for stats in self.gpus:
            if stats.index == index:
                return stats
        return None

    def usable(self, index: int) -> GpuStats | None:
        """GPU `index` unless it is absent or lost: what admission may place memory on."""
        stats = self.gpu(index)
        return None if stats is None or stats.lost else stats

    @property
    def usable_indices(self) -> list[int]:
        return sorted(g.index for g in self.gpus if not g.lost)

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.taken_at)


def free_mib(snapshot: GpuSnapshot | None, gpu: int) -> int:
    """Free MiB on `gpu` (0 without a snapshot, or when the GPU is absent or lost)."""
    stats = None if snapshot is None else snapshot.usable(gpu)
    return 0 if stats is None else stats.free_mib


class GpuSource(Protocol):
    """Takes samples. Implementations bound every call by a timeout and raise
    `ProbeError` (never anything else) when a sample cannot be taken."""

    name: str

    async def sample(self) -> GpuSnapshot: ...

    async def close(self) -> None: ...
