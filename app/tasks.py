"""Background tasks with a name and a done-callback that logs failures.

Whoever calls `spawn` owns the task: it keeps the reference and cancels or awaits it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


def spawn(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("background task failed task=%s", task.get_name(), exc_info=exc)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if any) and wait for it to finish, swallowing its cancellation."""
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # already logged by the done-callback
        pass


class OwnedTasks:
    """Background tasks one object owns: kept until done, cancelled by `close()`."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        task = spawn(coro, name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        for task in list(self._tasks):
            await cancel_and_wait(task)


class OpenRelays:
    """The requests being relayed, each by its task, so a stopping gateway can end them
    its own way: `end_all()` cancels each one and marks it (`ending`); the relay, seeing
    the mark, ends its response with an error the client can read (in-band in a stream)
    rather than being cut when the server's grace runs out. After `end_all()`, `stopping`
    is true and a new relay is refused at once."""

    def __init__(self) -> None:
        self._open: set[asyncio.Task[Any]] = set()
        self._ending: set[asyncio.Task[Any]] = set()
        self.stopping = False

    def add(self, task: asyncio.Task[Any]) -> None:
        self._open.add(task)

    def discard(self, task: asyncio.Task[Any]) -> None:
        self._open.discard(task)
        self._ending.discard(task)

    def ending(self, task: asyncio.Task[Any]) -> bool:
        return task in self._ending

    def end_all(self) -> int:
        """Cancel every open relay not ended yet; returns how many."""
        self.stopping = True
        ended = 0
        for task in self._open - self._ending:
            if not task.done():
                self._ending.add(task)
                task.cancel("the gateway is stopping")
                ended += 1
        return ended

    def __len__(self) -> int:
        return len(self._open)
