"""A start in progress as `/status` shows it (`load`): vLLM's phase and the share done, from
its output (`app.upstreams.vllm_output`), and the seconds left by its last measured cold
start or wake (`StartDurations`, small sections of the state file; a fallback chain
prices a cold entry by them too, `Backend.ready_in_s`). `StartClock` is one backend's:
when its start under way began and what its last ones took. `load_status` is pure."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final, Protocol

from app.lifecycle.state import BackendState
from app.lifecycle.store import StateStore
from app.upstreams.vllm_output import LAUNCHING, CompileSeen, LoadProgress

# The phases of a start before its launch: admission waits for memory other models hold
# (their min_resident_s or max_hold_s), or for its turn on its GPUs (another model's start,
# a zone grant or the yield on them; `start_progress` names it).
WAITING_FOR_VRAM: Final = "waiting_for_vram"
WAITING_FOR_TURN: Final = "waiting_for_turn"


@dataclass(frozen=True, slots=True)
class LoadStatus:
    """Its phase, the share done (0-100), seconds left (None: not known), and its
    torch.compile so far (its seconds, and whether vLLM's compile cache served it)."""

    phase: str
    percent: int
    eta_s: int | None
    compile: CompileSeen | None = None


class StartWatch(Protocol):
    """What the server's side knows of a start (`app.lifecycle.server.Server`)."""

    @property
    def load(self) -> LoadProgress | None: ...

    @property
    def vram_wait_phase(self) -> str | None: ...


def load_status(
    elapsed_s: float, last_start_s: float | None, watch: StartWatch, *, waking: bool
) -> LoadStatus:
    """`waking`: from sleep (`last_start_s` is then the last wake's duration, None when
    none was measured); `watch.vram_wait_phase`: what admission still waits for, if it
    does (`WAITING_FOR_VRAM`, `WAITING_FOR_TURN`)."""
    eta = None if last_start_s is None else round(max(0.0, last_start_s - elapsed_s))
    waiting = watch.vram_wait_phase
    if waiting is not None:
        return LoadStatus(waiting, 0, eta)
    if waking:
        return LoadStatus("waking", 0, eta)
    progress = watch.load
    if progress is None:
        return LoadStatus(LAUNCHING, 0, eta)
    return LoadStatus(progress.phase, progress.percent, eta, progress.compile)


class StartClock:
    """One backend's starts in time: when the one under way began (and, for a wake, the
    level it slept at), and the durations of its last cold start and wakes, for the
    `load` and `eta_s` of the next."""

    def __init__(self, backend: str, durations: StartDurations) -> None:
        self._backend = backend
        self._durations = durations
        # The start's began (monotonic) and, for a wake, the level it slept at (0: unknown).
        self._under_way: tuple[float, int | None] | None = None

    def begin(self, wake_level: int | None) -> tuple[float, int | None]:
        """A start (`wake_level` None) or a wake from `wake_level` begins now. Called
        with the state change, not from the start's task: a /status read in between
        would see the previous start's beginning (and an eta of 0)."""
        self._under_way = (time.monotonic(), wake_level)
        return self._under_way

    def last(self, wake_level: int | None) -> float | None:
        """Its last measured cold start, or wake from `wake_level` (0: level unknown)."""
        if wake_level is None:
            return self._durations.get(self._backend)
        return self._durations.get_wake(self._backend, wake_level)

    def load(self, watch: StartWatch) -> LoadStatus | None:
        """The start under way as /status shows it (None: none was begun)."""
        if self._under_way is None:
            return None
        began, level = self._under_way
        last = self.last(level)
        return load_status(time.monotonic() - began, last, watch, waking=level is not None)

    def ready_in_s(
        self, state: BackendState, held: bool, asleep_level: int, *, managed: bool
    ) -> float | None:
        """`Backend.ready_in_s` for a backend in `state`; `held`: it may not start now
        (blocked, failed in its backoff); `asleep_level`: its sleep's (0: unknown)."""
        if state is BackendState.READY:
            return 0.0
        if held:
            return None
        if state is BackendState.STARTING:
            return self.left_s()
        if state is BackendState.SLEEPING:
            return self.last(asleep_level)
        if state in (BackendState.STOPPED, BackendState.FAILED) and managed:
            return self.last(None)
        return None

    def elapsed_s(self) -> float | None:
        """Seconds the start under way has run (None: none was begun)."""
        return None if self._under_way is None else time.monotonic() - self._under_way[0]

    def left_s(self) -> float | None:
        """Seconds left of the start under way by its last measured one (None: not known)."""
        if self._under_way is None:
            return None
        began, level = self._under_way
        last = self.last(level)
        return None if last is None else max(0.0, last - (time.monotonic() - began))

    def record(self, seconds: float, *, cold: bool, wake_level: int | None) -> None:
        self._durations.record(self._backend, seconds, cold=cold, wake_level=wake_level)


START_DURATIONS = "start_durations"
WAKE_DURATIONS = "wake_durations"


def wake_key(backend: str, level: int | None) -> str:
    """A wake's entry: a level-1 wake keeps the weights in host RAM, any other reloads."""
    return f"{backend}@{1 if level == 1 else 2}"


class StartDurations:
    """The `start_durations` section: each backend's last measured cold start in seconds
    (launch to healthy, admission included; adoptions are not measured), for the `eta_s`
    of its next start; and `wake_durations`: its last wake from sleep (`POST /wake_up`
    to healthy) per sleep level (`wake_key`). Written with `StateStore.put`: a write that
    fails only loses an estimate. Without a store (tests): kept in memory."""

    def __init__(self, store: StateStore | None) -> None:
        self._store = store
        self._memory: dict[str, dict[str, float]] = {}

    def _section(self, name: str) -> object:
        if self._store is None:
            return self._memory.get(name, {})
        return self._store.section(name, {})

    def get(self, backend: str, *, section: str = START_DURATIONS) -> float | None:
        raw = self._section(section)
        value = raw.get(backend) if isinstance(raw, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
        return None

    def get_wake(self, backend: str, level: int | None) -> float | None:
        return self.get(wake_key(backend, level), section=WAKE_DURATIONS)

    def record(
        self, backend: str, seconds: float, *, cold: bool, wake_level: int | None = None
    ) -> None:
        """Keep a cold start's duration, or a wake's (`wake_level`: the level it slept
        at, 0 for a wake of an unknown level); an adoption's is not kept."""
        if cold:
            self.put(backend, seconds)
        elif wake_level is not None:
            self.put(wake_key(backend, wake_level), seconds, section=WAKE_DURATIONS)

    def put(self, backend: str, seconds: float, *, section: str = START_DURATIONS) -> None:
        raw = self._section(section)
        kept = {**(raw if isinstance(raw, dict) else {}), backend: round(seconds, 3)}
        if self._store is None:
            self._memory[section] = kept
        else:
            self._store.put(section, kept)
