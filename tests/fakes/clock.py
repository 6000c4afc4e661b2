"""A wall clock the test sets, for the schedules' loop (`app.control.scheduler.Clock`).

The loop's `sleep` returns only when the test moves the clock (`advance_to`), whatever it
asked for; `advance_to` returns once the loop has acted on the new time and is waiting
again, so the test reads the outcome without polling.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime


def at(text: str) -> float:
    """Unix seconds of an ISO time in UTC (`2025-01-06T19:00`)."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


class FakeClock:
    def __init__(self, now: float) -> None:
        self._now = now
        self._moved = asyncio.Event()
        self._waiting = asyncio.Event()  # the loop is in `sleep`: done with the last time
        self.sleeps: list[float] = []  # what the loop asked to wait, each time

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._moved.clear()
        self._waiting.set()
        await self._moved.wait()

    async def settled(self, timeout_s: float = 10.0) -> None:
        """Until the loop has acted on the current time and waits again."""
        await asyncio.wait_for(self._waiting.wait(), timeout_s)

    async def advance_to(self, now: float, timeout_s: float = 10.0) -> None:
        """Move the clock to `now`, wake the loop and wait until it has acted."""
        await self.settled(timeout_s)
        self._now = now
        self._waiting.clear()
        self._moved.set()
        await self.settled(timeout_s)
