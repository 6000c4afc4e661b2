"""What the VRAM side reads of a backend and asks of it (`app.lifecycle.backend.Backend`):
a tenant of the GPUs.

- its memory part (`memory`: footprint, what it holds and counts, asleep or not, its
  host RAM charge and yield method) and what admission reads (`Claimant`);
- whether it is ready, lazy, since when, and what is in flight (`requests`);
- the few ways the VRAM side changes it: block and unblock (zones, the yield), stop,
  give back (sleep or stop), stop if asleep, start in the background, wait for a start.
"""

from __future__ import annotations

from typing import Protocol

from app.lifecycle.admission import Claimant
from app.lifecycle.blocks import BlockKind
from app.lifecycle.floor import ResidencyFloor
from app.lifecycle.memory import Memory
from app.lifecycle.state import SleepOutcome, Stateful, StopReason
from app.runtimes.base import Runtime
from app.settings import ReleaseConfig


class Resident(Stateful, Protocol):
    """What the residency rules read of a backend (a `Backend`, or the API's view of one)."""

    @property
    def ready_since(self) -> float | None: ...


class InFlight(Protocol):
    """A tenant's requests, as the VRAM side reads them (`RequestHolds`)."""

    @property
    def in_flight(self) -> int: ...
    @property
    def last_used(self) -> float: ...
    def idle_s(self, now: float | None = None) -> float: ...
    @property
    def floor(self) -> ResidencyFloor: ...


class Tenant(Claimant, Resident, Protocol):
    @property
    def memory(self) -> Memory: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def runtime(self) -> Runtime: ...
    @property
    def requests(self) -> InFlight: ...
    @property
    def last_drain_timed_out(self) -> bool: ...
    def block(
        self,
        key: str,
        description: str,
        kind: BlockKind = BlockKind.BLOCKED,
        expires_at: float | None = None,
    ) -> None: ...
    def unblock(self, key: str) -> None: ...
    async def stop(self, reason: StopReason, *, drain_timeout_s: float | None = None) -> None: ...
    async def give_back(
        self, reason: StopReason, how: ReleaseConfig, *, drain_timeout_s: float | None = None
    ) -> SleepOutcome: ...
    async def stop_if_asleep(self, reason: StopReason) -> bool: ...
    async def start_logged(self, why: str) -> None: ...
    async def start_ended(self, timeout_s: float) -> bool: ...
