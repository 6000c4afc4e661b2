"""What a backend asks of admission (the arbiter, or nothing without a GPU to check), and
the accounting of a sleeping backend. The helpers are pure.

A backend asleep (vLLM sleep mode) still runs and keeps its CUDA context, graphs and
allocator leftovers on its GPUs (0.5-6 GiB); levels 1 and 2 free the same GPU memory
(weights and KV cache). So while asleep it counts what it still holds, not its footprint:

- what its sleep freed as the probe saw it (GPU used before the sleep minus after),
  subtracted from its footprint;
- else (no probe, a reading that showed nothing freed, or a GPU full before the sleep:
  see `app.vram.arbiter.VramArbiter.measure_sleep`) what its last measured sleep kept;
- else its `asleep_mib:` estimate;
- else its whole footprint: nothing is counted as free that was not seen or declared.

Once counted, what it holds asleep stays so until it wakes or stops: a neighbour's
allocation later (a game) is the neighbour's, never recomputed into the sleeper's.

A wake takes back its footprint minus what it kept, and is admitted for that much like a
start (it may evict, or be refused and stay asleep).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Final, Protocol

from app.lifecycle.server import Server
from app.settings import BackendConfig, ReleaseConfig


class AdmissionRefused(Exception):
    """Admission could not make room for a start; the message says what holds the memory."""


class StartUnwanted(Exception):
    """Admission would evict for a start nobody waits for any more (its requests left and
    nothing else asked for it): it evicts nothing and the start ends."""


@dataclass(slots=True)
class Freed:
    """What a sleep freed on the backend's first GPU, as the probe saw it (None: unknown,
    or not measurable: the GPU was full). Filled in when the measuring context exits."""

    mib: int | None = None


class ClaimedMemory(Protocol):
    """What admission reads of a backend's memory (`app.lifecycle.memory.Memory`)."""

    @property
    def vram_mib(self) -> int | None: ...
    @property
    def asleep_mib(self) -> int | None: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...  # where it is placed (a wake stays there)
    @property
    def placed_why(self) -> str: ...
    def place(self, gpus: tuple[int, ...], why: str) -> None: ...
    def record_measured(self, mib: int) -> None: ...


class Wanted(Protocol):
    """Whether a backend's start is still wanted (`app.lifecycle.wanted.StartWant`)."""

    @property
    def wanted(self) -> bool: ...


class Claimant(Protocol):
    """What admission reads of a backend (`app.lifecycle.backend.Backend`)."""

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> BackendConfig: ...
    @property
    def memory(self) -> ClaimedMemory: ...
    @property
    def server(self) -> Server: ...  # what its start progress says while admission waits
    @property
    def want(self) -> Wanted: ...  # whether its start under way is still wanted


class Admission(Protocol):
    def admit(self, backend: Claimant, *, wake: bool = False) -> AbstractAsyncContextManager[None]:
        """Entered around a start: reserve the backend's VRAM (evicting if needed) and
        keep other starts out of its GPUs until the start is over. Raises
        `AdmissionRefused` when the backend does not fit. `wake`: a wake from sleep,
        which needs only what it takes back (`wake_mib`)."""

    def measure_sleep(self, backend: Claimant) -> AbstractAsyncContextManager[Freed]:
        """Entered around `POST /sleep`: what the GPU showed freed meanwhile."""

    def fits_now(self, backend: Claimant) -> bool | None:
        """Whether its start would fit without evicting anything, by the last GPU sample
        (no I/O); None: unknown (no telemetry, no sample or no footprint)."""

    def went_idle(self) -> None:
        """A backend's last request in flight ended (starts waiting for its turn may go)."""


class Unchecked:
    """Admission when there is no GPU to check: every start is allowed."""

    def admit(self, backend: Claimant, *, wake: bool = False) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    def measure_sleep(self, backend: Claimant) -> AbstractAsyncContextManager[Freed]:
        return _unmeasured()

    def fits_now(self, backend: Claimant) -> bool | None:
        return None

    def went_idle(self) -> None:
        return None


@contextlib.asynccontextmanager
async def _unmeasured() -> AsyncIterator[Freed]:
    yield Freed()


def asleep_mib(
    footprint: int | None, freed: int | None, declared: int | None, kept: int | None = None
) -> int | None:
    """MiB a backend counts while asleep, from its footprint (None: not checked), what the
    probe saw its sleep free, what its last measured sleep `kept` and its `asleep_mib:`;
    None: its whole footprint."""
    if footprint is None:
        return None
    if freed is not None and freed > 0:
        return max(0, footprint - freed)
    if kept is not None:
        return min(kept, footprint)
    if declared is not None:
        return min(declared, footprint)
    return None


def asleep_reason(level: int, reason: str, kept: int | None) -> str:
    """A sleeping backend's reason: `asleep (level 1, idle, holds 2000 MiB)`."""
    held = "" if kept is None else f", holds {kept} MiB"
    return f"asleep (level {level}, {reason}{held})"


def wake_mib(footprint: int | None, asleep: int | None) -> int | None:
    """MiB a wake takes back: its footprint minus what it kept; None: not checked."""
    if footprint is None:
        return None
    return footprint - min(footprint, asleep if asleep is not None else footprint)


# How a `lifecycle: standby` backend is put to sleep after its load at gateway start: level
# 1, so its first request costs a wake (weights back from host RAM), not a load.
STANDBY_RELEASE: Final = ReleaseConfig(method="sleep", level=1)


def may_have_slept(config: BackendConfig, yield_override: str | None) -> bool:
    """Whether any of its ways to give memory back is sleep mode (a GPU profile's yield
    method included): then a server found running at gateway start may be asleep."""
    methods = (config.yield_.method, yield_override, config.idle.method, config.eviction.method)
    return "sleep" in methods or config.lifecycle == "standby"
