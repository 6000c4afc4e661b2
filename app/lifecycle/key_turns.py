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

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Final


@dataclass(frozen=True, slots=True)
class KeyShare:
    """A request's client key, as the queue counts turns: its name (every anonymous
    request shares one, `anonymous`; a call without a key, `""`) and its weight."""

    name: str = ""
    weight: int = 1


NO_KEY: Final = KeyShare()
ZERO: Final = Fraction(0)


class KeyTurns:
    """The virtual time of each key in one queue (exact fractions: equal shares tie)."""

    def __init__(self) -> None:
        self._virtual: dict[str, Fraction] = {}
        self.virtual: Mapping[str, Fraction] = MappingProxyType(self._virtual)

    def of(self, key: str) -> Fraction:
        return self._virtual.get(key, ZERO)

    def join(self, key: str, floor: Fraction | None) -> None:
        """`key` has a ticket in the queue again; `floor`: the least virtual time of the
        keys of its priority waiting now (None: none waits)."""
        if floor is not None and floor > self.of(key):
            self._virtual[key] = floor

    def served(self, share: KeyShare) -> None:
        """A slot went to a request of `share`'s key."""
        self._virtual[share.name] = self.of(share.name) + Fraction(1, share.weight)

    def clear(self) -> None:
        """The queue is empty: every key starts again from 0."""
        self._virtual.clear()
