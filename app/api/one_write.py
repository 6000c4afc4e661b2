"""A response's status line and headers held until its first body bytes (`OneWrite`):
uvicorn writes them apart, so an answer ready at once cost two writes, two segments and
two wake-ups of the client; now one."""

from __future__ import annotations

import asyncio
from typing import Any


class OneWrite:
    """The transport a request's cycle writes its response to: the status line and
    headers are held until the first body bytes follow them, or at the latest until the
    loop's next turn (a response that starts and then waits), and leave with them in one
    write. Everything else passes straight through (`100 Continue`, later chunks)."""

    __slots__ = ("_cycle", "_head", "_held", "_loop", "_transport")

    def __init__(
        self, transport: asyncio.Transport, cycle: Any, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._transport = transport
        self._cycle = cycle
        self._loop = loop
        self._head: bytes | None = None
        self._held: asyncio.Handle | None = None  # the next turn's flush; None once passed

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            assert self._held is not None
            self._held.cancel()
            self._transport.write(head + data)
        elif self._held is None and self._cycle.response_started:
            self._head = data  # uvicorn marks the response started, then writes its head
            self._held = self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        head, self._head = self._head, None
        # A client gone (or refused) meanwhile: nothing is written, as uvicorn would not.
        if head is not None and not self._cycle.disconnected and not self._transport.is_closing():
            self._transport.write(head)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        if self._head is not None:
            assert self._held is not None
            self._held.cancel()
            self._flush()
        self._transport.close()
