"""Backend lifecycle states and the transitions allowed between them. Pure.

    stopped ──> starting ──> ready ──> stopping ──> stopped
       ^           │  │         │          │    \
       └───────────┘  └──> failed <────────┘     └──> sleeping ──> starting | stopping
                                                      failed ──> starting | stopping | stopped

Only `ready` serves requests. `starting -> stopped` is a start that admission refused
before anything was launched (not enough VRAM). `failed` keeps the reason (exit code,
start timeout, runtime error) so errors can say why.

`sleeping` is vLLM's sleep mode (a yield's way to free VRAM without stopping the server):
reached by draining (`stopping`) and then `POST /sleep`; waking goes through `starting`
(`POST /wake_up`, then `/health`). `stopped -> sleeping` adopts a server found asleep
when the gateway starts; `sleeping -> failed` is a server that died while asleep.

Being *blocked* by a VRAM zone is not a state: a blocked backend is stopped (or being
stopped) and additionally refuses to start until the zone is released.
"""

from __future__ import annotations

import enum


class BackendState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"
    SLEEPING = "sleeping"


TRANSITIONS: dict[BackendState, frozenset[BackendState]] = {
    BackendState.STOPPED: frozenset({BackendState.STARTING, BackendState.SLEEPING}),
    BackendState.STARTING: frozenset(
        {BackendState.READY, BackendState.FAILED, BackendState.STOPPING, BackendState.STOPPED}
    ),
    BackendState.READY: frozenset({BackendState.STOPPING, BackendState.FAILED}),
    BackendState.STOPPING: frozenset(
        {BackendState.STOPPED, BackendState.FAILED, BackendState.SLEEPING}
    ),
    BackendState.SLEEPING: frozenset(
        {BackendState.STARTING, BackendState.STOPPING, BackendState.FAILED}
    ),
    BackendState.FAILED: frozenset(
        {BackendState.STARTING, BackendState.STOPPING, BackendState.STOPPED}
    ),
}


class InvalidTransition(RuntimeError):
    def __init__(self, current: BackendState, target: BackendState) -> None:
        super().__init__(f"backend cannot go from {current} to {target}")
        self.current = current
        self.target = target


def check_transition(current: BackendState, target: BackendState) -> BackendState:
    """Return `target` when the table allows `current -> target`, else raise."""
    if target not in TRANSITIONS[current]:
        raise InvalidTransition(current, target)
    return target
