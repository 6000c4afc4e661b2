"""A start in progress as `/status` shows it (`load`): vLLM's phase and the share done, from
its output (`app.upstreams.vllm_output`), and the seconds left by its last measured cold
start (`StartDurations`, a small section of the state file). `load_status` is pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from app.lifecycle.store import StateStore
from app.upstreams.vllm_output import LAUNCHING, LoadProgress


@dataclass(frozen=True, slots=True)
class LoadStatus:
    """Its phase, the share done (0-100), seconds left (None: not known)."""

    phase: str
    percent: int
    eta_s: int | None


class StartWatch(Protocol):
    """What the server's side knows of a start (`app.lifecycle.server.Server`)."""

    @property
    def load(self) -> LoadProgress | None: ...

    @property
    def waiting_for_memory(self) -> bool: ...


def load_status(
    elapsed_s: float, last_start_s: float | None, watch: StartWatch, *, waking: bool
) -> LoadStatus:
    """`waking`: from sleep (no eta: a cold start's duration says nothing of a wake);
    `watch.waiting_for_memory`: admission still waits for VRAM before the launch."""
    eta = None if last_start_s is None or waking else round(max(0.0, last_start_s - elapsed_s))
    if watch.waiting_for_memory:
        return LoadStatus("waiting_for_vram", 0, eta)
    if waking:
        return LoadStatus("waking", 0, eta)
    progress = watch.load
    if progress is None:
        return LoadStatus(LAUNCHING, 0, eta)
    return LoadStatus(progress.phase, progress.percent, eta)


START_DURATIONS = "start_durations"


class StartDurations:
    """The `start_durations` section: each backend's last measured cold start in seconds
    (launch to healthy, admission included; wakes and adoptions are not measured), for
    the `eta_s` of its next start. Written with `StateStore.put`: a write that fails only
    loses an estimate. Without a store (tests): kept in memory."""

    def __init__(self, store: StateStore | None) -> None:
        self._store = store
        self._memory: dict[str, float] = {}

    def _section(self) -> object:
        return self._memory if self._store is None else self._store.section(START_DURATIONS, {})

    def get(self, backend: str) -> float | None:
        raw = self._section()
        value = raw.get(backend) if isinstance(raw, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
        return None

    def record(self, backend: str, seconds: float, *, cold: bool) -> None:
        """Keep a cold start's duration (a wake's or an adoption's is not kept)."""
        if cold:
            self.put(backend, seconds)

    def put(self, backend: str, seconds: float) -> None:
        raw = self._section()
        section = {**(raw if isinstance(raw, dict) else {}), backend: round(seconds, 3)}
        if self._store is None:
            self._memory = section
        else:
            self._store.put(START_DURATIONS, section)
