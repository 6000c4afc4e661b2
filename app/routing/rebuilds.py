"""Backends a configuration reload is rebuilding (a new object for a changed runtime or
address: `app.reload.apply`). Between the old object's block and the new one's
registration, a request for such a backend would be refused (503 `backend_disabled`) or
spilled to a paid provider (`local_disabled`); instead it is held here, as a wake holds
one, and then goes to whatever is registered: the new backend (woken as usual), or, when
the hold outlasted the request's patience, the old one's refusal.

The reloader closes a gate per rebuilt backend before it blocks the old object and opens
it once the new one is registered (or the reload failed); `Dispatcher.open` waits on the
gates of the backends a call may use. No I/O, one event per gate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from app.activity import WaitKind, add_wait


class Rebuilds:
    def __init__(self) -> None:
        self._gates: dict[str, asyncio.Event] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._gates

    @property
    def active(self) -> bool:
        """Whether any backend is being rebuilt (the hot path tests only this)."""
        return bool(self._gates)

    def begin(self, names: Iterable[str]) -> None:
        """Hold the requests for `names` from now on."""
        for name in names:
            self._gates.setdefault(name, asyncio.Event())

    def end(self, name: str) -> None:
        """Let the requests for `name` go (to what is registered now)."""
        gate = self._gates.pop(name, None)
        if gate is not None:
            gate.set()

    def end_all(self) -> None:
        for name in list(self._gates):
            self.end(name)

    async def settled(self, names: Iterable[str], timeout_s: float) -> None:
        """Wait until no backend of `names` is being rebuilt, at most `timeout_s` (counted
        as the request's wake); returns at once when none is (the hot path: a dict test)."""
        waiting = [gate for name in names if (gate := self._gates.get(name)) is not None]
        if not waiting:
            return
        began = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                for gate in waiting:
                    await gate.wait()
        except TimeoutError:
            pass  # the caller meets the old backend's refusal
        finally:
            add_wait(WaitKind.WAKE, time.monotonic() - began)
