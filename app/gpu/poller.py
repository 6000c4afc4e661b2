"""GpuMonitor: keeps the last good GPU snapshot and the health of the source behind it
(`app.gpu.probe_monitor.ProbeMonitor`, which the host RAM's monitor shares).

- `run()` samples every `poll_interval_s` (the owner runs it as a task and cancels it);
  it never raises and logs transitions once (probe down, probe up, GPU lost, GPU back),
  not every poll.
- `read()` is what the VRAM arbiter and the yield measure with: it takes a fresh sample
  (the arbiter polls it while waiting for freed memory to show), and falls back to the
  last good snapshot when the sample fails, or to None (admission off) when there never
  was one. Lost GPUs stay in the snapshot, marked; admission skips them
  (`GpuSnapshot.usable`).
- `snapshot` is the last good sample; readers (`/status`, the metrics collector at scrape
  time) use it and never call the source.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from app.gpu.probe_monitor import ProbeMonitor
from app.gpu.telemetry import GpuSnapshot, GpuSource
from app.settings.base import LOCAL_HOST

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """The GPU telemetry as last seen: `snapshot` is None until a sample succeeds."""

    source: str
    up: bool
    error: str | None
    reason: str | None
    consecutive_failures: int
    age_s: float | None
    stale: bool
    snapshot: GpuSnapshot | None


class GpuMonitor(ProbeMonitor[GpuSnapshot]):
    """The last good sample of a `GpuSource` and the health of that source."""

    kind = "gpu"
    logger = logger

    def __init__(
        self,
        source: GpuSource,
        *,
        poll_interval_s: float,
        stale_after_s: float,
        on_sample: Callable[[], None] | None = None,
        host: str = LOCAL_HOST,
    ) -> None:
        super().__init__(source, poll_interval_s=poll_interval_s, on_sample=on_sample, host=host)
        self._gpus = source  # closed with the monitor
        self._stale_after_s = stale_after_s
        self._lost: frozenset[int] = frozenset()

    @property
    def snapshot(self) -> GpuSnapshot | None:
        """The last good sample (immutable)."""
        return self.last

    @property
    def last_success_wall(self) -> float | None:
        """`time.time()` of the last good sample."""
        return None if self.last is None else self.last.taken_at_wall

    @property
    def stale(self) -> bool:
        age = self.age_s()
        return age is None or age > self._stale_after_s

    def status(self) -> GpuStatus:
        """What `/status` shows of the GPUs: the last good snapshot and the source's health."""
        age = self.age_s()
        return GpuStatus(
            source=self.name,
            up=self.up,
            error=self.error,
            reason=self.reason,
            consecutive_failures=self.consecutive_failures,
            age_s=None if age is None else round(age, 3),
            stale=self.stale,
            snapshot=self.last,
        )

    async def close(self) -> None:
        await self._gpus.close()

    def describe(self, sample: GpuSnapshot) -> str:
        return f"gpus={len(sample.gpus)}"

    def _succeeded(self, sample: GpuSnapshot) -> None:
        super()._succeeded(sample)
        lost = frozenset(g.index for g in sample.gpus if g.lost)
        for stats in sample.gpus:
            if stats.index in lost - self._lost:
                logger.error("gpu lost host=%s gpu=%d uuid=%s error=%s",
                             self.host, stats.index, stats.uuid, stats.error)  # fmt: skip
        for index in sorted(self._lost - lost):
            logger.info("gpu back host=%s gpu=%d", self.host, index)
        self._lost = lost
