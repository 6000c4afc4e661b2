"""The sleep guard: a backend's sleep/wake cycles, and when to give up on its sleep.

vLLM's sleep mode has known leaks and bad wakes: memory held asleep growing over sleep/wake
cycles (vLLM #21336), a wake that failed or took the host down (#50011), out of memory on
wake (#48680). So each sleep is recorded (`SleepHistory`): what the probe saw it free and
what the backend counts as held asleep (`app.lifecycle.admission.asleep_mib`). Since its
last cold start the first measured sleep is the baseline; a later one that freed more than
`sleep_leak_mib` less than the baseline did (so holds that much more asleep: the server's
awake footprint is the same from one cycle to the next) trips the guard (`leak_of`), and so
does a wake that fails or times out. Tripped, the backend is stopped rather than left
asleep, and its next request starts it cold, which resets the baseline
(`app.lifecycle.backend`). A sleep the probe could not measure (no readings, a GPU full
before it) is recorded but never trips it.

The rules (`leak_of`, `wake_cause`) and the history are pure; `SleepGuard` records a trip
(the history, `microscheduler_sleep_guard_total`, a `sleep_guard` event, a warning).
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client import Counter

if TYPE_CHECKING:  # the backend's event log, passed in
    from app.events import EventLog

logger = logging.getLogger(__name__)

RECENT_CYCLES: Final = 5  # sleeps kept besides the baseline, newest last


class GuardCause(enum.StrEnum):
    """Why the guard stopped a backend: the `cause` label of
    `microscheduler_sleep_guard_total` and of the `sleep_guard` event."""

    LEAK = "leak"  # held asleep grew past sleep_leak_mib over its first sleep
    WAKE_FAILED = "wake_failed"  # POST /wake_up (or the health after it) failed
    WAKE_TIMEOUT = "wake_timeout"  # the wake did not answer within the control timeout


@dataclass(frozen=True, slots=True)
class SleepCycle:
    """One sleep: its number since the last cold start (1: the first), its level, what the
    probe saw it free (None: not measured) and the MiB counted as held asleep after it
    (None: its whole footprint), and when (wall clock)."""

    cycle: int
    level: int
    freed_mib: int | None
    held_mib: int | None
    at: float

    @property
    def measured(self) -> bool:
        return self.freed_mib is not None and self.freed_mib > 0


@dataclass(frozen=True, slots=True)
class Leak:
    """A sleep that freed `growth_mib` less than the baseline did: held asleep grew that much
    (more than `threshold_mib`)."""

    baseline: SleepCycle
    now: SleepCycle
    growth_mib: int
    threshold_mib: int

    def describe(self) -> str:
        """`held asleep grew 1536 MiB since its first sleep (freed 14000 MiB then, 12464
        now; sleep_leak_mib 512)`."""
        return (
            f"held asleep grew {self.growth_mib} MiB since its first sleep (freed "
            f"{self.baseline.freed_mib} MiB then, {self.now.freed_mib} at sleep "
            f"{self.now.cycle}; sleep_leak_mib {self.threshold_mib})"
        )


def leak_of(baseline: SleepCycle | None, now: SleepCycle, threshold_mib: int) -> Leak | None:
    """Whether sleep `now` shows a leak against `baseline` (its first measured sleep since
    the cold start): both measured, and `now` freed more than `threshold_mib` less. None:
    no leak, nothing to compare, or the guard off (`threshold_mib` 0)."""
    if threshold_mib <= 0 or baseline is None or baseline is now:
        return None
    first, last = baseline.freed_mib, now.freed_mib
    if first is None or last is None or first <= 0 or last <= 0:  # not both measured
        return None
    growth = first - last
    if growth <= threshold_mib:
        return None
    return Leak(baseline, now, growth, threshold_mib)


@dataclass(frozen=True, slots=True)
class Trip:
    """The guard's last stop of a backend: why, in words, and when (wall clock)."""

    cause: GuardCause
    detail: str
    at: float


@dataclass(frozen=True, slots=True)
class SleepRecord:
    """What `/backends` shows of a backend's sleeps: one moment of its `SleepHistory`."""

    cycles: int
    baseline: SleepCycle | None
    recent: tuple[SleepCycle, ...]
    growth_mib: int | None
    last_trip: Trip | None


class SleepHistory:
    """A backend's sleeps since its last cold start: the baseline (its first measured
    sleep), the last `RECENT_CYCLES`, and the guard's last trip (kept across cold starts,
    so `/backends` still says why it was stopped)."""

    def __init__(self) -> None:
        self.cycles = 0  # sleeps since the last cold start
        self.baseline: SleepCycle | None = None
        self.recent: deque[SleepCycle] = deque(maxlen=RECENT_CYCLES)
        self.last_trip: Trip | None = None

    def record(
        self, *, level: int, freed_mib: int | None, held_mib: int | None, at: float
    ) -> SleepCycle:
        self.cycles += 1
        cycle = SleepCycle(self.cycles, level, freed_mib, held_mib, at)
        if self.baseline is None and cycle.measured:
            self.baseline = cycle
        self.recent.append(cycle)
        return cycle

    def started_cold(self) -> None:
        """A new server (a cold start): its sleeps begin again, and a new baseline."""
        self.cycles = 0
        self.baseline = None
        self.recent.clear()

    def tripped(self, cause: GuardCause, detail: str, at: float) -> Trip:
        self.last_trip = Trip(cause, detail, at)
        return self.last_trip

    def snapshot(self) -> SleepRecord:
        return SleepRecord(
            self.cycles, self.baseline, tuple(self.recent), self.growth_mib, self.last_trip
        )

    @property
    def growth_mib(self) -> int | None:
        """How much more its last measured sleep held asleep than its first (None: fewer
        than two measured)."""
        if self.baseline is None or self.baseline.freed_mib is None:
            return None
        last = next((c for c in reversed(self.recent) if c.measured), None)
        if last is None or last is self.baseline or last.freed_mib is None:
            return None
        return self.baseline.freed_mib - last.freed_mib


def wake_cause(*, timed_out: bool, not_ours: bool) -> GuardCause | None:
    """What a wake that failed trips: `wake_timeout` when it got no answer in time, else
    `wake_failed`; None for a server that is not ours (another answers on its port: a
    failure, not the sleep's)."""
    if not_ours:
        return None
    return GuardCause.WAKE_TIMEOUT if timed_out else GuardCause.WAKE_FAILED


def guard_reason(detail: str) -> str:
    """The state reason of a backend the sleep guard stopped."""
    return f"sleep guard: {detail}; stopped, its next request starts it cold"


def leak_fields(leak: Leak) -> dict[str, int | None]:
    """The numbers of a leak, for its `sleep_guard` event."""
    return {
        "cycle": leak.now.cycle,
        "baseline_freed_mib": leak.baseline.freed_mib,
        "freed_mib": leak.now.freed_mib,
        "held_mib": leak.now.held_mib,
        "growth_mib": leak.growth_mib,
        "threshold_mib": leak.threshold_mib,
    }


class SleepGuard:
    """Records a backend's trips: in its history, its metric, an event and the log."""

    def __init__(
        self,
        name: str,
        history: SleepHistory,
        trips: Counter,  # microscheduler_sleep_guard_total{backend,cause}
        events: EventLog | None,
    ) -> None:
        self._name = name
        self._history = history
        self._trips = trips
        self._events = events

    def tripped(
        self, cause: GuardCause, detail: str, fields: dict[str, int | None] | None = None
    ) -> str:
        """The guard stops the backend for `cause`; its state reason."""
        self._history.tripped(cause, detail, time.time())
        self._trips.labels(self._name, cause).inc()
        logger.warning("sleep guard stops backend=%s cause=%s detail=%s", self._name, cause,
                       detail)  # fmt: skip
        if self._events is not None:
            self._events.record("sleep_guard", backend=self._name, cause=str(cause),
                                detail=detail, **(fields or {}))  # fmt: skip
        return guard_reason(detail)

    def leaked(self, leak: Leak) -> str:
        """A sleep that leaked: recorded as a trip; its state reason."""
        return self.tripped(GuardCause.LEAK, leak.describe(), leak_fields(leak))
