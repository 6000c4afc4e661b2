"""The one way tests wait for something: poll a cheap condition until it holds, with a
deadline and a failure message that says what was awaited, how long, and what was seen.

`until` is for async tests (the condition may be sync or async); `until_sync` for code
that runs beside threads or subprocesses. Both share `_Wait`. Prefer waiting on the event
itself (`await runtime.start_called.wait()`, a gate in a typed fake) where the code under
test offers one; poll only what it does not announce.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")
What = str | Callable[[], str] | None


class _Wait:
    """A deadline and the message for missing it."""

    def __init__(self, timeout_s: float, what: What, condition: object) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.what = what
        self.condition = condition

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def failure(self, last: object) -> AssertionError:
        what = self.what() if callable(self.what) else self.what
        if what is None:
            what = getattr(self.condition, "__doc__", None) or repr(self.condition)
        return AssertionError(
            f"still waiting after {self.timeout_s:g}s for {what} (last seen: {last!r})"
        )


@overload
async def until(
    condition: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float = ...,
    what: What = ...,
    interval_s: float = ...,
) -> T: ...


@overload
async def until(
    condition: Callable[[], T | None],
    *,
    timeout_s: float = ...,
    what: What = ...,
    interval_s: float = ...,
) -> T: ...


async def until(
    condition: Callable[[], object],
    *,
    timeout_s: float = 5.0,
    what: What = None,
    interval_s: float = 0.005,
) -> object:
    """Poll `condition` (sync or async) until it returns something truthy; return that."""
    wait = _Wait(timeout_s, what, condition)
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if wait.expired():
            raise wait.failure(result)
        await asyncio.sleep(interval_s)


def until_sync(
    condition: Callable[[], T | None],
    *,
    timeout_s: float = 10.0,
    what: What = None,
    interval_s: float = 0.05,
) -> T:
    """`until` for tests that block: threads, subprocesses, a real server."""
    wait = _Wait(timeout_s, what, condition)
    while True:
        result = condition()
        if result:
            return result
        if wait.expired():
            raise wait.failure(result)
        time.sleep(interval_s)
