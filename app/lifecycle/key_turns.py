"""Fair turns between the client keys of one priority in a backend's queue (issue 36).

Each key waiting in a queue has a virtual time: the slots granted to it so far, each
counting 1/`weight` (keys.yaml). Among the tickets of one priority that are not aged,
the key with the least virtual time goes first, with its oldest ticket; a tie goes to the
key whose ticket came first. So a key that floods the queue takes one turn, then every
other key of its priority takes one, and a key of weight 2 takes two turns to a weight-1
key's one: weighted fair queueing, counted in requests (the gateway does not know what a
request costs before it runs).

No banked credit: a key that joins the queue (none of its tickets in it) starts at no
less than the least virtual time of the keys of its priority waiting then, so a key that
was idle takes its turn with the others, not every slot until it has caught up. When the
queue empties, every key starts again from 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from app.settings.keys import MAX_WEIGHT


@dataclass(frozen=True, slots=True)
class KeyShare:
    """A request's client key, as the queue counts turns: its name (every anonymous
    request shares one, `anonymous`; a call without a key, `""`) and its weight."""

    name: str = ""
    weight: int = 1


NO_KEY: Final = KeyShare()
# One slot in units of virtual time: divisible by every weight, so a slot's share 1/weight
# is a whole number and equal shares tie exactly (a 1438-bit int: adds and compares in
# well under a microsecond, unlike fractions).
SLOT: Final = math.lcm(*range(1, MAX_WEIGHT + 1))


class KeyTurns:
    """The virtual time of each key in one queue, in `SLOT` units (`virtual`: what the
    order compares; a key not in it is at 0)."""

    def __init__(self) -> None:
        self._virtual: dict[str, int] = {}
        self.virtual: Mapping[str, int] = self._virtual  # read only (typed so)
        self._waiting: dict[str, int] = {}  # tickets in the queue, by key

    def of(self, key: str) -> int:
        return self._virtual.get(key, 0)

    def entered(self, key: str, peers: Callable[[], Iterable[str]]) -> None:
        """A ticket of `key` entered the queue. When none of its was waiting, the key
        joins: it starts at no less than the least virtual time of `peers()` (the keys of
        its priority waiting now)."""
        count = self._waiting.get(key, 0)
        self._waiting[key] = count + 1
        if not count:
            floor = min((self.of(peer) for peer in set(peers())), default=0)
            if floor > self.of(key):
                self._virtual[key] = floor

    def left(self, key: str) -> None:
        """A ticket of `key` left the queue (served or not); when it was the last of the
        queue, every key starts again from 0."""
        count = self._waiting.pop(key) - 1
        if count:
            self._waiting[key] = count
        elif not self._waiting:
            self._virtual.clear()

    def served(self, share: KeyShare) -> None:
        """A slot went to a request of `share`'s key."""
        self._virtual[share.name] = self.of(share.name) + SLOT // share.weight
