"""The idle timeout of a response's reads, for every chunk of a stream at the cost of a
clock read: one timer per response, re-armed lazily (when it fires early, it sets itself
for the read under way's own deadline), instead of a timer made and cancelled per chunk
(`asyncio.timeout` around each read: ~9 us a chunk on 2 cores, most of a relayed chunk's
cost at 10,000 streams).

Only the reads count: while the relay writes a chunk to its client (a slow client), the
upstream is not idle. A read past `idle_s` is cancelled as `asyncio.timeout` would cancel
it, and `expired` tells that cancellation apart from any other (the task's own cancel
count, as `asyncio.Timeout` does)."""

from __future__ import annotations

import asyncio


class IdleWatch:
    def __init__(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        assert self._task is not None  # reads happen in a task
        self._cancelling = self._task.cancelling()
        self._began: float | None = None  # the read under way's start (None: no read)
        self._timer: asyncio.TimerHandle | None = None
        self.fired = False

    def reading(self) -> None:
        """A read begins."""
        now = self._began = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(now + self._idle_s, self._check)

    def read(self) -> None:
        """The read ended (a chunk came, or it failed)."""
        self._began = None

    def expired(self) -> bool:
        """Whether the CancelledError a read raised is this watch's (then consumed, like
        `asyncio.timeout` turns its own into TimeoutError), not the task's owner's."""
        assert self._task is not None
        return self.fired and self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        began = self._began
        if began is None:  # between reads: the next read arms it again
            return
        due = began + self._idle_s
        if self._loop.time() < due:  # a later read than the one it was set for
            self._timer = self._loop.call_at(due, self._check)
            return
        self.fired = True
        assert self._task is not None
        self._task.cancel()
