"""How a backend gives its GPU memory back (sleep level 1, level 2, or stop), given its host
RAM budget: `choose_release()`, pure. Idle stops, evictions and yields all ask it
(through `app.vram.host_ram.HostRamBook`, which reads the host's RAM and the
backends, and records each choice as an event).

Level 1 copies the weights to pinned host RAM (vLLM's cumem allocator backs them with
`pin_memory` tensors: `vllm/device_allocator/cumem.py:233-276`), so each level-1 sleeper
is charged its weights against its host's `host_ram.sleep_budget_mib`; level 2 discards
them (a wake reloads them from disk) and costs next to no host RAM. The rules:

- `stop`, or a server the gateway does not manage: stop.
- `auto` for a backend without sleep mode: stop.
- `sleep` at level 2, or `auto` capped at level 2 by nothing but level 1 not fitting:
  level 2.
- Level 1 (`sleep` level 1, or `auto`) when the sleeper fits: its weights plus what the
  other level-1 sleepers are charged within the budget, and MemAvailable minus its
  weights (and minus sleeps under way, not yet in MemAvailable) at least `reserve_mib`.
- When it does not fit, the level-1 sleepers used less recently than it are stopped, the
  least recently used first, until it fits (`make_room`). A sleeper is stopped, not
  moved to level 2: vLLM cannot deepen a sleep (`Executor.sleep` returns at once when
  the weights already sleep, `vllm/v1/executor/abstract.py:400-403`), and waking it to
  sleep again would take back the GPU memory that was just freed.
- When even that does not make room: `sleep` goes to level 2 (it was asked to sleep),
  `auto` to level 2 when its `level` allows, else stop.
- Unknown weights or an unknown budget (no RAM reading and no `sleep_budget_mib`):
  `auto` does not risk level 1 (level 2); an explicit `sleep` level 1 is kept.

Every answer carries its reason in words, for the event log and the logs:
`sleep level 1: fits the host RAM budget (3,200 of 16,384 MiB)`,
`stop: host RAM budget full (17,000 of 16,384 MiB)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from app.settings import BackendConfig, ReleaseConfig

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Sleeper:
    """A backend charged to the host RAM budget: asleep at level 1, or going to sleep at
    level 1 right now (`pending`: its copy is not in MemAvailable yet)."""

    name: str
    charge_mib: int
    last_used: float  # monotonic: when a request of it last began or ended
    pending: bool = False


@dataclass(frozen=True, slots=True)
class RamState:
    """A host's RAM as a release decision sees it. `budget_mib` None: unknown."""

    budget_mib: int | None
    reserve_mib: int
    available_mib: int | None = None
    sleepers: tuple[Sleeper, ...] = ()

    def charged_mib(self, exclude: str | None = None) -> int:
        return sum(s.charge_mib for s in self.sleepers if s.name != exclude)


@dataclass(frozen=True, slots=True)
class Candidate:
    """The backend giving its memory back."""

    name: str
    charge_mib: int | None  # its weights in host RAM at level 1; None: unknown
    last_used: float
    sleep_supported: bool
    managed: bool = True


@dataclass(frozen=True, slots=True)
class Release:
    """The choice: `level` 1 or 2 to sleep at, None to stop; `make_room`: the level-1
    sleepers to stop first (least recently used first)."""

    level: int | None
    reason: str
    make_room: tuple[str, ...] = ()

    @property
    def method(self) -> str:
        return "stop" if self.level is None else "sleep"


def _mib(value: int) -> str:
    return f"{value:,}"


def choose_release(how: ReleaseConfig, candidate: Candidate, ram: RamState) -> Release:
    """How `candidate` gives its memory back, per `how` and its host's RAM (pure)."""
    if not candidate.managed:
        return Release(None, "stop: not managed by the gateway")
    if how.method == "stop":
        return Release(None, "stop: method stop")
    if how.method == "auto" and not candidate.sleep_supported:
        return Release(None, "stop: no sleep mode (set sleep_mode: true if its server has it)")
    deepest = how.sleep_level
    if how.method == "sleep" and deepest == 2:
        return Release(2, "sleep level 2: method sleep, level 2")
    level1 = _level1(candidate, ram)
    if isinstance(level1, Release):
        return level1
    why = level1
    if how.method == "sleep" and why.startswith("unknown"):
        return Release(1, f"sleep level 1: method sleep ({why})")
    if how.method == "sleep" or deepest == 2:
        return Release(2, f"sleep level 2: {why}")
    return Release(None, f"stop: {why}")


def _level1(candidate: Candidate, ram: RamState) -> Release | str:
    """Level 1 when it fits (after stopping less recently used sleepers if need be), else
    why not in words (`unknown ...` when it could not be checked)."""
    charge, budget = candidate.charge_mib, ram.budget_mib
    if charge is None:
        return "unknown weights (no measured load, model description or vram_mib)"
    if budget is None:
        return "unknown host RAM (no reading and no host_ram.sleep_budget_mib)"
    if charge > budget:
        return f"weights ({_mib(charge)} MiB) exceed the host RAM budget ({_mib(budget)} MiB)"
    others = [s for s in ram.sleepers if s.name != candidate.name]
    pending = sum(s.charge_mib for s in others if s.pending)
    available = None if ram.available_mib is None else ram.available_mib - pending
    charged = sum(s.charge_mib for s in others)
    room: list[Sleeper] = []
    victims = sorted(
        (s for s in others if not s.pending and s.last_used < candidate.last_used),
        key=lambda s: s.last_used,
    )
    while True:
        freed = sum(s.charge_mib for s in room)
        held = charged - freed + charge
        left = None if available is None else available + freed - charge
        if held <= budget and (left is None or left >= ram.reserve_mib):
            reason = f"sleep level 1: fits the host RAM budget ({_mib(held)} of {_mib(budget)} MiB)"
            if room:
                names = ", ".join(s.name for s in room)
                reason += f" after stopping the least recently used level-1 sleeper(s) {names}"
            return Release(1, reason, tuple(s.name for s in room))
        if len(room) == len(victims):
            break
        room.append(victims[len(room)])
    held = charged + charge
    if held > budget:
        return f"host RAM budget full ({_mib(held)} of {_mib(budget)} MiB)"
    assert available is not None
    return (
        f"host RAM reserve ({_mib(available)} MiB available, {_mib(charge)} MiB of weights, "
        f"{_mib(ram.reserve_mib)} MiB kept free)"
    )


def ram_charge(loaded_bytes: int | None, config: BackendConfig) -> tuple[int | None, str | None]:
    """(MiB, where from) a backend's level-1 sleep holds in host RAM: its weights as vLLM
    measured them at load (`measured`, "Model loading took X GiB" summed over its GPUs),
    else the planner's weights of its model description (`model`), else `vram_mib` on
    each of its GPUs (`vram_mib`: weights plus KV cache, more than the weights); (None,
    None): unknown."""
    if loaded_bytes is not None:
        return -(-loaded_bytes // MIB), "measured"
    weights = config.weights_bytes
    if weights is None:
        return None, None
    return -(-weights // MIB), "vram_mib" if config.model_info is None else "model"


class ReleasedMemory(Protocol):
    """What a release decision reads of a backend's memory (`app.lifecycle.memory.Memory`)."""

    @property
    def sleep_supported(self) -> bool: ...
    @property
    def ram_charge_mib(self) -> int | None: ...


class Used(Protocol):
    """What a release decision reads of a backend's requests (`RequestHolds`)."""

    @property
    def last_used(self) -> float: ...


class ReleaseSubject(Protocol):
    """What a release decision reads of a backend (`app.lifecycle.backend.Backend`)."""

    @property
    def name(self) -> str: ...
    @property
    def managed(self) -> bool: ...
    @property
    def memory(self) -> ReleasedMemory: ...
    @property
    def requests(self) -> Used: ...


def candidate_of(backend: ReleaseSubject) -> Candidate:
    memory = backend.memory
    return Candidate(
        name=backend.name,
        charge_mib=memory.ram_charge_mib,
        last_used=backend.requests.last_used,
        sleep_supported=memory.sleep_supported,
        managed=backend.managed,
    )


class ReleasePolicy(Protocol):
    """Who a backend asks how to give its memory back (its host's RAM book)."""

    async def refresh(self) -> None:
        """A fresh reading of the host's RAM (before the decision, out of any lock)."""

    def choose(self, backend: ReleaseSubject, how: ReleaseConfig, cause: str) -> Release:
        """The choice for `backend` now (no I/O); recorded as an event."""

    async def make_room(self, release: Release, requester: str) -> None:
        """Stop the sleepers `release.make_room` names (before `requester` sleeps)."""


class Unbudgeted:
    """The policy when no host RAM is accounted (a backend built alone, in tests)."""

    async def refresh(self) -> None:
        return None

    def choose(self, backend: ReleaseSubject, how: ReleaseConfig, cause: str) -> Release:
        return choose_release(how, candidate_of(backend), RamState(None, 0))

    async def make_room(self, release: Release, requester: str) -> None:
        return None
