"""A response's status line and headers held until its first body bytes (`OneWrite`):
uvicorn writes them apart, so an answer ready at once cost two writes, two segments and
two wake-ups of the client; now one."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any


class OneWrite:
    """The transport a request's cycle writes its response to: the status line and
    headers are held until the first body bytes follow them, or at the latest until the
    loop's next turn (a response that starts and then waits), and leave with them in one
    write. Everything else passes straight through (`100 Continue`, later chunks).

    It holds its cycle weakly and lets go of the next turn's handle once it is spent: the
    cycle holds it (its `transport`), and a reference back either way would leave every
    request's cycle, scope and context in a reference cycle, freed only by the garbage
    collector (measured: about 18 objects a request, and the CPU the collections took)."""

    __slots__ = ("_cycle", "_head", "_loop", "_passed", "_transport", "_turn")

    def __init__(
        self, transport: asyncio.Transport, cycle: Any, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._transport = transport
        self._cycle = weakref.ref(cycle)
        self._loop = loop
        self._head: bytes | None = None
        self._turn: asyncio.Handle | None = None  # the next turn's flush, while one is due
        self._passed = False  # the head went out: every write passes through

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._passed = True
            if self._turn is not None:
                self._turn.cancel()
                self._turn = None
            self._transport.write(head + data)
            return
        if not self._passed:
            cycle = self._cycle()
            if cycle is not None and cycle.response_started:
                self._head = data  # uvicorn marks the response started, then writes its head
                self._turn = self._loop.call_soon(self._flush)
                return
        self._transport.write(data)

    def _flush(self) -> None:
        head, self._head = self._head, None
        self._turn = None
        self._passed = True
        cycle = self._cycle()
        gone = cycle is None or cycle.disconnected
        # A client gone (or refused) meanwhile: nothing is written, as uvicorn would not.
        if head is not None and not gone and not self._transport.is_closing():
            self._transport.write(head)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        if self._head is not None:
            if self._turn is not None:
                self._turn.cancel()
            self._flush()
        self._transport.close()
