"""What a VRAM yield is asked (`YieldRequest`) and answers (`YieldOutcome`, `HoldReleased`,
`RestoreReport`): the data `app.vram.yielding` exchanges with its callers, no I/O;
`app.api.views` renders the answers."""

from __future__ import annotations

from dataclasses import dataclass

from app.vram.zones import Hold, Zone


@dataclass(frozen=True, slots=True)
class YieldRequest:
    reason: str = "gaming"
    min_free_mib: int | None = None  # None: take everything yieldable
    ttl_s: float | None = None  # None: until restored
    include_pinned: bool = False
    gpu: int = 0


@dataclass(frozen=True, slots=True)
class YieldOutcome:
    """The yield that holds (its zone and report); `already`: it held before this call
    (the call added or renewed its own `hold`)."""

    zone: Zone
    already: bool
    hold: Hold  # the caller's own


@dataclass(frozen=True, slots=True)
class HoldReleased:
    """A restore of one holder's hold while others hold on: the yield holds still.
    `released`: False when that holder held nothing."""

    holder: str
    released: bool
    zone: Zone  # the yield as it holds now


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a restore gave back: pinned backends `back` (or still `starting`, or `failed`
    with why), lazy ones `on_demand`. `order`: the order it starts (or wakes) them in,
    one after the other, the most recently used first."""

    reason: str  # the yield's reason (its first holder)
    why: str  # restored | expired | schedule | not met
    back: tuple[str, ...]
    starting: tuple[str, ...]
    failed: dict[str, str | None]
    on_demand: tuple[str, ...]
    yielded_for_s: float
    ended: tuple[str, ...] = ()  # the holds it ended (their holders)
    order: tuple[str, ...] = ()
