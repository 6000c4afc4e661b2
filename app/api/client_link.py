"""A request's line to its own connection, where the gateway's server runs it
(`app.api.connections.GatewayProtocol` puts one in the scope, under `LINK_KEY`).

What the ASGI interface offers for the same questions costs a task or a timer per
request: the relay would await `receive()` in a task of its own to learn that the
client left, and `BodyGuard` would bound every `receive()` with a timeout even when the
whole body is already in. The connection knows both at once:
- `watch(callback)`: `callback()` runs when the connection is lost before the response
  is complete (as `receive()` would return `http.disconnect`), until `unwatch()`;
- `body_in()`: the whole request body has been read from the socket, so `receive()`
  returns it without waiting.
Under another ASGI server (the tests' in-process transport) there is no link and the
callers take the ASGI way.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Final, Protocol

from starlette.types import Scope

LINK_KEY: Final = "microscheduler.link"


class _Cycle(Protocol):
    """What of uvicorn's request-response cycle the link reads."""

    more_body: bool
    response_complete: bool


class _Flow(Protocol):
    def resume_reading(self) -> None: ...


class ClientLink:
    __slots__ = ("_cycle", "_flow", "_watched", "on_lost")

    def __init__(self, cycle: _Cycle, flow: _Flow, watched: set[ClientLink]) -> None:
        """`watched`: the connection's links being watched, which it tells when lost (a
        pipelined request's cycle is not the connection's newest). The cycle is held
        weakly: it holds the scope, which holds this link, and a strong reference back
        would leave each request's objects to the garbage collector."""
        self._cycle = weakref.ref(cycle)
        self._flow = flow
        self._watched = watched
        self.on_lost: Callable[[], None] | None = None

    def watch(self, callback: Callable[[], None]) -> None:
        """`callback()` once the client is gone, until `unwatch()`. Reading resumes, as
        uvicorn's `receive()` resumes it: a close is seen only while the socket is read."""
        self.on_lost = callback
        self._watched.add(self)
        self._flow.resume_reading()

    def unwatch(self) -> None:
        self.on_lost = None
        self._watched.discard(self)

    def body_in(self) -> bool:
        """The request's body has been read to its end (`receive()` will not wait)."""
        cycle = self._cycle()
        return cycle is None or not cycle.more_body

    def lost(self) -> None:
        """The connection closed (the protocol's `connection_lost`): the watcher is told
        when the response was not complete."""
        callback = self.on_lost
        self.unwatch()
        cycle = self._cycle()
        if callback is not None and cycle is not None and not cycle.response_complete:
            callback()


def link_of(scope: Scope) -> ClientLink | None:
    link: Any = scope.get(LINK_KEY)
    return link if isinstance(link, ClientLink) else None
