"""How many new requests one turn of the event loop takes in: at most `PER_TURN`; the rest
wait for the next turns, first come first served, their bytes held and their sockets'
reading paused (`GatewayProtocol.data_received`).

Why: a burst's requests arrive together. The loop's selector hands every readable socket
to one turn, and each new request then runs the app up to its upstream connect, about a
millisecond of CPU on these machines. 9,000 streams sent at once held the loop for 10 s
in one turn (`bench/soak.py`, a lag probe sleeping 0.1 s woke 10.0 s late), and every
timer due meanwhile fired late, all at once: the gateway's 5 s upstream connect timeout
failed thousands of connects the kernel had completed long before (504
`upstream_timeout`, "connecting to backend took more than 5s"). With the intake bounded a
turn lasts tens of milliseconds, timers mean what they say, and the same requests go
through in about the same total time.

Only the bookkeeping lives here (no I/O): what to do with a held connection is the
connection's (`Held.take_in`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

# New request heads a turn of the loop takes in (more wait for the next): halved after a
# turn longer than `SLOW_TURN_S`, grown by `MIN_PER_TURN` after a shorter one (additive
# increase, multiplicative decrease: the count follows what this machine does in a turn).
# A turn of `SLOW_TURN_S` keeps the shortest data-plane timer (connect, 5 s) honest.
PER_TURN = 64
MIN_PER_TURN, MAX_PER_TURN = 32, 4096
SLOW_TURN_S = 1.0


class Loop(Protocol):
    """What the intake needs of the event loop."""

    def call_soon(self, callback: Callable[..., object], *args: Any) -> object: ...

    def time(self) -> float: ...


class Held(Protocol):
    """A connection whose new request waits for its turn."""

    def take_in(self) -> None:
        """Its turn came: parse and run the request held."""


class Intake:
    """One server's new requests, at most `per_turn` a turn of the loop."""

    def __init__(self, per_turn: int = PER_TURN) -> None:
        self.per_turn = per_turn
        self.taken = 0  # this turn
        self.waiting: dict[Held, None] = {}  # oldest first
        self._turn: object | None = None  # the next turn's start (a handle), while one is due
        self._turn_began: float | None = None  # when the last turn began, while they follow

    def admit(self, connection: Held, loop: Loop) -> bool:
        """True: take this request in now. False: it waits its turn (`take_in` then), and
        the caller holds its bytes."""
        if self._turn is None:
            self._turn = loop.call_soon(self._next_turn, loop)
        if self.taken < self.per_turn and not self.waiting:
            self.taken += 1
            return True
        self.waiting[connection] = None
        return False

    def forget(self, connection: Held) -> None:
        """It closed while it waited."""
        self.waiting.pop(connection, None)

    def _next_turn(self, loop: Loop) -> None:
        self._turn = None
        self.taken = 0
        now = loop.time()
        if self._turn_began is not None:  # the last turn, from its start to this one's
            if now - self._turn_began > SLOW_TURN_S:
                self.per_turn = max(MIN_PER_TURN, self.per_turn // 2)
            else:
                self.per_turn = min(MAX_PER_TURN, self.per_turn + MIN_PER_TURN)
        self._turn_began = None
        while self.waiting and self.taken < self.per_turn:
            connection = next(iter(self.waiting))
            del self.waiting[connection]
            self.taken += 1
            connection.take_in()
        if self.taken:  # this turn's count must end with it
            self._turn = loop.call_soon(self._next_turn, loop)
            self._turn_began = now
