"""The event loop's lag: how much later than asked the loop runs a task that sleeps.

Everything the gateway does runs on one event loop; anything that holds it (a blocking
call, a long computation, a full GC pass) delays every request and every stream by as
much. A task the app's lifespan owns sleeps `interval_s` (0.1 s) at a time and records how
late it woke, on `time.monotonic()`. Not on `loop.time()`: under uvloop (which
`uvicorn[standard]` brings, and uvicorn then runs) that is libuv's clock, in whole
milliseconds, which would read a 3.4 ms stall as 3 ms and most samples as 0 or 1 ms.

- `microscheduler_event_loop_lag_seconds`: a histogram of every sample, buckets from
  1 ms to 1 s (`LAG_BUCKETS`);
- `microscheduler_event_loop_lag_max_seconds`: the largest sample of the last minute, so a
  single stall between two scrapes is seen as its own size, not only as a bucket;
- `microscheduler_event_loop_held_seconds` and `..._held_max_seconds`: the same samples
  less the time the loop's thread waited for a CPU meanwhile (its run-queue time,
  `/proc/thread-self/schedstat`): the part of the lag the gateway's own work held the loop,
  where the first also counts a machine too busy to run it. On a machine without
  schedstat these two stay empty.

`lateness`, `held` and `WindowMax` are the pure part (tested without a loop); `LoopLag.run`
is the loop that feeds them.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry

from app.metrics import Declare

INTERVAL_S: Final = 0.1
WINDOW_S: Final = 60.0
# 1-2-5 steps from 1 ms (a loop at rest wakes well under it) to 1 s (a stall).
LAG_BUCKETS: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# The calling thread's scheduler statistics: time on a CPU, time waiting for one (ns), runs.
SCHEDSTAT: Final = Path("/proc/thread-self/schedstat")


def lateness(due: float, woke: float) -> float:
    """How late a wake due at `due` was when it ran at `woke` (seconds, same clock). Never
    negative: asyncio runs a timer up to its clock's resolution early."""
    return max(0.0, woke - due)


def held(lag: float, waited: float) -> float:
    """The part of `lag` not spent waiting for a CPU (`waited`, the loop's thread's
    run-queue time over the same interval): what the loop itself was busy with."""
    return max(0.0, lag - waited)


def cpu_wait_s(schedstat: Path = SCHEDSTAT) -> float | None:
    """Seconds the calling thread has waited for a CPU so far; None where the kernel does
    not say (no schedstat). A read of procfs, answered from the kernel's memory."""
    try:
        return int(schedstat.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class WindowMax:
    """The largest value added in the last `window_s` (a monotonic deque: each value stays
    only while no later one is as large, so an add is amortised O(1))."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._kept: deque[tuple[float, float]] = deque()  # (at, value), values decreasing

    def add(self, at: float, value: float) -> float:
        """Add `value` taken at `at` (non-decreasing); returns the largest of the window."""
        while self._kept and self._kept[-1][1] <= value:
            self._kept.pop()
        self._kept.append((at, value))
        while self._kept[0][0] <= at - self._window_s:
            self._kept.popleft()
        return self._kept[0][1]


class LoopLag:
    """Samples the loop's lag into its two series (declared here, in `registry`)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        interval_s: float = INTERVAL_S,
        window_s: float = WINDOW_S,
        on_sample: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu_wait: Callable[[], float | None] = cpu_wait_s,
    ) -> None:
        new = Declare(registry)
        self.histogram = new.histogram(
            "event_loop_lag_seconds",
            f"How late the event loop woke a task that sleeps {interval_s:g} s at a time: "
            "whatever held the loop that long delayed every request.",
            buckets=LAG_BUCKETS,
        )
        self.peak = new.gauge(
            "event_loop_lag_max_seconds",
            f"The largest event loop lag of the last {window_s:g} s.",
        )
        self.held = new.histogram(
            "event_loop_held_seconds",
            "The event loop's lag less the time its thread waited for a CPU meanwhile: "
            "how long the gateway's own work held the loop (a busy machine not counted).",
            buckets=LAG_BUCKETS,
        )
        self.held_peak = new.gauge(
            "event_loop_held_max_seconds",
            f"The largest event loop lag less its wait for a CPU of the last {window_s:g} s.",
        )
        self._interval_s = interval_s
        self._max = WindowMax(window_s)
        self._held_max = WindowMax(window_s)
        self._on_sample = on_sample  # tests: told each sample
        self._clock = clock
        self._cpu_wait = cpu_wait

    def record(self, due: float, woke: float, waited: float | None = None) -> float:
        """One sample: a wake due at `due` ran at `woke`, its thread having waited `waited`
        seconds for a CPU since the sleep began (None: not known). Returns its lag."""
        lag = lateness(due, woke)
        self.histogram.observe(lag)
        self.peak.set(self._max.add(woke, lag))
        if waited is not None:
            part = held(lag, waited)
            self.held.observe(part)
            self.held_peak.set(self._held_max.add(woke, part))
        if self._on_sample is not None:
            self._on_sample(lag)
        return lag

    async def run(self) -> None:
        """Sample until cancelled (the owner, the app's lifespan, cancels it)."""
        while True:
            due = self._clock() + self._interval_s
            before = self._cpu_wait()
            await asyncio.sleep(self._interval_s)
            woke, after = self._clock(), self._cpu_wait()
            waited = None if before is None or after is None else after - before
            self.record(due, woke, waited)
