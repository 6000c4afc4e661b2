"""What keeps a backend from starting: its blocks. The data and the refusal, no I/O.

A block has a key (who placed it: `zone:comfy`, `zone:yield`, `profile`), a description for
errors and a kind. Requests for a blocked backend are refused with `backend_<kind>` and
never wake it; the most telling kind wins when several blocks hold.

Every refusal carries `Retry-After`: when the holds of the telling kind all end by
themselves (a zone's or a yield's TTL), the seconds until the last of them ends; else
`RETRY_AFTER_S`, so clients back off instead of retrying at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from math import ceil
from typing import Final

from app.errors import BackendUnavailable, UnavailableKind
from app.lifecycle.state import StopReason

RETRY_AFTER_S: Final = 10


class BlockKind(StrEnum):
    """Most telling first: a GPU profile disabled it, a VRAM yield took it, a zone stopped it."""

    DISABLED = "disabled"
    YIELDED = "yielded"
    BLOCKED = "blocked"

    @property
    def stop_reason(self) -> StopReason:
        """The stop reason (a metric label) of a backend stopped because of this kind."""
        return _STOP_REASONS[self]

    def refusal(self, backend: str, what: str, retry_after_s: int) -> BackendUnavailable:
        """The error a request for `backend` gets; `what` names the holds of this kind."""
        if self is BlockKind.DISABLED:
            message = f"backend {backend!r} is disabled by {what}"
        elif self is BlockKind.YIELDED:
            message = (
                f"backend {backend!r} gave its VRAM to {what}; "
                "it comes back after POST /vram/restore"
            )
        else:
            message = (
                f"backend {backend!r} is stopped to make room for {what}; "
                "it wakes again when that is released"
            )
        return BackendUnavailable(
            message, kind=UnavailableKind(self.value), retry_after_s=retry_after_s
        )


_ORDER = tuple(BlockKind)
_STOP_REASONS = {
    BlockKind.DISABLED: StopReason.PROFILE,
    BlockKind.YIELDED: StopReason.YIELD,
    BlockKind.BLOCKED: StopReason.ZONE,
}


@dataclass(frozen=True, slots=True)
class Block:
    kind: BlockKind
    description: str
    expires_at: float | None = None  # Unix time it ends by itself; None: when released


class Blocks(Mapping[str, str]):
    """A backend's blocks, read as key -> description; only its backend changes them."""

    __slots__ = ("_blocks",)

    def __init__(self) -> None:
        self._blocks: dict[str, Block] = {}

    def __getitem__(self, key: str) -> str:
        return self._blocks[key].description

    def __iter__(self) -> Iterator[str]:
        return iter(self._blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def kind(self) -> BlockKind | None:
        """The most telling kind that holds; None: nothing blocks."""
        if not self._blocks:
            return None
        return min((b.kind for b in self._blocks.values()), key=_ORDER.index)

    def refusal(self, backend: str, now: float) -> BackendUnavailable | None:
        """The error for a request while blocked (naming every hold of the telling kind);
        `now` is Unix time, for the `Retry-After` of holds that expire."""
        kind = self.kind
        if kind is None:
            return None
        holds = [b for b in self._blocks.values() if b.kind is kind]
        what = "; ".join(b.description for b in holds)
        ends = [b.expires_at for b in holds]
        if any(end is None for end in ends):
            retry = RETRY_AFTER_S
        else:
            retry = max(1, ceil(max(end for end in ends if end is not None) - now))
        return kind.refusal(backend, what, retry)

    def check(self, backend: str) -> None:
        """Raise the `refusal` for a request to `backend` while anything blocks it."""
        refusal = self.refusal(backend, time.time())
        if refusal is not None:
            raise refusal

    def add(
        self, key: str, description: str, kind: BlockKind, expires_at: float | None = None
    ) -> None:
        self._blocks[key] = Block(kind, description, expires_at)

    def remove(self, key: str) -> None:
        self._blocks.pop(key, None)

    def take(self, other: Blocks, *, leaving: str) -> None:
        """Every block of `other` but the one under `leaving` (a replaced object's)."""
        self._blocks.update((k, b) for k, b in other._blocks.items() if k != leaving)
