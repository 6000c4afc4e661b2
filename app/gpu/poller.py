"""GpuMonitor: keeps the last good GPU snapshot and the health of the source behind it.

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

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.gpu.telemetry import GpuSnapshot, GpuSource, ProbeError
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


class GpuMonitor:
    """The last good sample of a `GpuSource` and the health of that source."""

    def __init__(
        self,
        source: GpuSource,
        *,
        poll_interval_s: float,
        stale_after_s: float,
        on_sample: Callable[[], None] | None = None,
        host: str = LOCAL_HOST,
    ) -> None:
        self.source = source
        self.name = source.name
        self.host = host  # whose GPUs (named in its log lines)
        self._poll_interval_s = poll_interval_s
        self._on_sample = on_sample
        self._stale_after_s = stale_after_s
        self.snapshot: GpuSnapshot | None = None  # last good sample (immutable)
        self.up = False  # the last sample succeeded
        self.error: str | None = None  # of the last failure (cleared by a success)
        self.reason: str | None = None
        self.consecutive_failures = 0
        self._sampled = False  # at least one attempt finished (for transition logs)
        self._lost: frozenset[int] = frozenset()

    # -- status ---------------------------------------------------------------------------

    @property
    def last_success_wall(self) -> float | None:
        """`time.time()` of the last good sample."""
        return None if self.snapshot is None else self.snapshot.taken_at_wall

    def age_s(self) -> float | None:
        """Seconds since the last good sample was taken; None when there is none."""
        return None if self.snapshot is None else self.snapshot.age_s(time.monotonic())

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
            snapshot=self.snapshot,
        )

    # -- sampling -------------------------------------------------------------------------

    async def read(self) -> GpuSnapshot | None:
        """A fresh sample, else the last good one, else None (there never was one)."""
        snapshot = await self.poll_once()
        return self.snapshot if snapshot is None else snapshot

    async def poll_once(self) -> GpuSnapshot | None:
        """Take one sample and record it; None when it failed. Never raises (except
        cancellation)."""
        try:
            snapshot = await self.source.sample()
        except ProbeError as exc:
            self._failed(str(exc), exc.reason)
            return None
        except Exception as exc:  # a source must raise ProbeError only: do not die of it
            logger.exception(
                "gpu source raised unexpectedly host=%s source=%s", self.host, self.name
            )
            self._failed(f"unexpected error from the {self.name} source: {exc!r}", "error")
            return None
        self._succeeded(snapshot)
        return snapshot

    async def run(self) -> None:
        """The poll loop; runs until cancelled."""
        while True:
            await self.poll_once()
            if self._on_sample is not None:
                self._on_sample()  # a new sample (or a failure) for the live status
            await asyncio.sleep(self._poll_interval_s)

    async def close(self) -> None:
        await self.source.close()

    def _succeeded(self, snapshot: GpuSnapshot) -> None:
        # Concurrent samples (the loop and the arbiter) may finish out of order.
        if self.snapshot is None or snapshot.taken_at >= self.snapshot.taken_at:
            self.snapshot = snapshot
        if not self.up:
            if self._sampled:
                logger.info(
                    "gpu probe up host=%s source=%s after_failures=%d",
                    self.host,
                    self.name,
                    self.consecutive_failures,
                )
            else:
                logger.info("gpu probe up host=%s source=%s gpus=%d",
                            self.host, self.name, len(snapshot.gpus))  # fmt: skip
        self.up = True
        self._sampled = True
        self.error = None
        self.reason = None
        self.consecutive_failures = 0
        lost = frozenset(g.index for g in snapshot.gpus if g.lost)
        for stats in snapshot.gpus:
            if stats.index in lost - self._lost:
                logger.error("gpu lost host=%s gpu=%d uuid=%s error=%s",
                             self.host, stats.index, stats.uuid, stats.error)  # fmt: skip
        for index in sorted(self._lost - lost):
            logger.info("gpu back host=%s gpu=%d", self.host, index)
        self._lost = lost

    def _failed(self, error: str, reason: str) -> None:
        if self.up or not self._sampled or reason != self.reason:
            logger.warning("gpu probe down host=%s source=%s reason=%s error=%s",
                           self.host, self.name, reason, error)  # fmt: skip
        self.up = False
        self._sampled = True
        self.error = error
        self.reason = reason
        self.consecutive_failures += 1
