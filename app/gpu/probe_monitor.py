"""ProbeMonitor: the last good sample of a probe and the probe's health, for the GPUs
(`GpuMonitor`) and a host's RAM (`HostRamMonitor`) alike.

- `run()` samples every `poll_interval_s` (the owner runs it as a task and cancels it); it
  never raises and logs transitions once (probe down, a new reason it is down, probe up),
  not every poll.
- `read()` takes a fresh sample (a decision measures with it) and falls back to the last
  good one when the sample fails, or to None when there never was one.
- `last` is the last good sample; readers (`/status`, the metrics at scrape time) use it
  and never call the source. Concurrent samples may finish out of order: an older one
  never replaces a newer one.

A source raises `ProbeError` only; anything else is logged with its traceback and kept
as the error, and the monitor goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from app.gpu.telemetry import ProbeError
from app.settings.base import LOCAL_HOST


class Sample(Protocol):
    @property
    def taken_at(self) -> float: ...  # monotonic


S = TypeVar("S", bound=Sample)
S_co = TypeVar("S_co", bound=Sample, covariant=True)


class Source(Protocol[S_co]):
    @property
    def name(self) -> str: ...

    async def sample(self) -> S_co: ...


class ProbeMonitor(Generic[S]):
    """The last good sample of a `Source` and the health of that source. `kind` names the
    probe in log lines (`gpu probe down host=... source=...`); `logger` is the subclass's."""

    kind = "probe"
    logger = logging.getLogger(__name__)

    def __init__(
        self,
        source: Source[S],
        *,
        poll_interval_s: float,
        on_sample: Callable[[], None] | None = None,
        host: str = LOCAL_HOST,
    ) -> None:
        self.source = source
        self.host = host  # whose probe (named in its log lines)
        self._poll_interval_s = poll_interval_s
        self._on_sample = on_sample  # after each poll of `run` (a success or a failure)
        self.last: S | None = None  # the last good sample (immutable)
        self.up = False  # the last sample succeeded
        self.error: str | None = None  # of the last failure (cleared by a success)
        self.reason: str | None = None
        self.consecutive_failures = 0
        self._sampled = False  # at least one attempt finished (for transition logs)

    @property
    def name(self) -> str:
        return self.source.name

    def age_s(self) -> float | None:
        """Seconds since the last good sample was taken; None when there is none."""
        return None if self.last is None else max(0.0, time.monotonic() - self.last.taken_at)

    async def read(self) -> S | None:
        """A fresh sample, else the last good one, else None (there never was one)."""
        sample = await self.poll_once()
        return self.last if sample is None else sample

    async def poll_once(self) -> S | None:
        """Take one sample and record it; None when it failed. Never raises (except
        cancellation)."""
        try:
            sample = await self.source.sample()
        except ProbeError as exc:
            self._failed(str(exc), exc.reason)
            return None
        except Exception as exc:  # a source must raise ProbeError only: do not die of it
            self.logger.exception(
                "%s source raised unexpectedly host=%s source=%s", self.kind, self.host, self.name
            )
            self._failed(f"unexpected error from the {self.name} source: {exc!r}", "error")
            return None
        self._succeeded(sample)
        return sample

    async def run(self) -> None:
        """The poll loop; runs until cancelled."""
        while True:
            await self.poll_once()
            if self._on_sample is not None:
                self._on_sample()
            await asyncio.sleep(self._poll_interval_s)

    def describe(self, sample: S) -> str:
        """What the first "probe up" line says of the first sample (`key=value ...`)."""
        return ""

    def _succeeded(self, sample: S) -> None:
        if self.last is None or sample.taken_at >= self.last.taken_at:
            self.last = sample
        if not self.up:
            if self._sampled:
                self.logger.info("%s probe up host=%s source=%s after_failures=%d", self.kind,
                                 self.host, self.name, self.consecutive_failures)  # fmt: skip
            else:
                self.logger.info("%s probe up host=%s source=%s %s", self.kind, self.host,
                                 self.name, self.describe(sample))  # fmt: skip
        self.up = True
        self._sampled = True
        self.error = None
        self.reason = None
        self.consecutive_failures = 0

    def _failed(self, error: str, reason: str) -> None:
        if self.up or not self._sampled or reason != self.reason:
            self.logger.warning("%s probe down host=%s source=%s reason=%s error=%s",
                                self.kind, self.host, self.name, reason, error)  # fmt: skip
        self.up = False
        self._sampled = True
        self.error = error
        self.reason = reason
        self.consecutive_failures += 1
