"""Backend lifecycle states and the transitions allowed between them. Pure.

    stopped ──> starting ──> ready ──> stopping ──> stopped
       ^           │  │         │          │    \
       └───────────┘  └──> failed <────────┘     └──> sleeping ──> starting | stopping
                                                      failed ──> starting | stopping | stopped

Only `ready` serves requests. `starting -> stopped` is a start that admission refused
before anything was launched (not enough VRAM). `failed` keeps the reason (exit code,
start timeout, runtime error) so errors can say why.

`sleeping` is vLLM's sleep mode (a way to free VRAM without stopping the server, for a
yield, an idle backend or an eviction): reached by draining (`stopping`) and then `POST
/sleep`; waking goes through `starting` (admission for what it takes back, `POST
/wake_up`, then `/health`); `starting -> sleeping` is a wake admission refused.
`stopped -> sleeping` adopts a server found asleep when the gateway starts;
`sleeping -> failed` is a server that died while asleep.

Being *blocked* by a VRAM zone is not a state: a blocked backend is stopped (or being
stopped) and additionally refuses to start until the zone is released.
"""

from __future__ import annotations

import enum
import math
from typing import Final, Protocol

from app.errors import PORT_IN_USE_REASON, BackendUnavailable, UnavailableKind
from app.settings import BackendConfig

# After a failure, requests get the failure for this long instead of a new start, so a
# crash-looping server is not restarted by every request; pinned backends are restarted
# by the watch after it. It doubles with each failure in a row, up to the maximum.
RESTART_BACKOFF_S: Final = 5.0
MAX_RESTART_BACKOFF_S: Final = 300.0


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
        {
            BackendState.READY,
            BackendState.FAILED,
            BackendState.STOPPING,
            BackendState.STOPPED,
            BackendState.SLEEPING,
        }
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


class StopReason(enum.StrEnum):
    """Why the gateway stopped (or put to sleep) a backend: the `reason` label of
    `microscheduler_backend_stops_total` and the words in its state's reason."""

    IDLE = "idle"  # idle past idle_ttl_s
    EVICTION = "eviction"  # room for a backend of higher priority
    ZONE = "zone"  # room for a VRAM zone
    ADMIN = "admin"  # POST /backends/{name}/stop
    SHUTDOWN = "shutdown"  # the gateway stops its own processes
    YIELD = "yield"  # POST /vram/yield
    PROFILE = "profile"  # a GPU profile disabled it
    STANDBY = "standby"  # lifecycle: standby, put to sleep after its load at gateway start
    HOST_RAM = "host_ram"  # a level-1 sleeper stopped to make room in the host RAM budget
    RELOAD = "reload"  # a config reload removed it or changed what needs a restart
    UNLOAD = "unload"  # a client unloaded it: POST /models/unload, Ollama's keep_alive: 0
    UNWANTED = "unwanted"  # a lazy start whose waiting requests all left (start_cancelled)
    # The sleep guard (app.lifecycle.sleep_guard): a sleep that leaked, a wake that failed.
    SLEEP_GUARD = "sleep_guard"


class StartOutcome(enum.StrEnum):
    """How a start ended: the `outcome` label of `microscheduler_backend_starts_total`."""

    READY = "ready"
    FAILED = "failed"
    REFUSED = "refused"  # admission found no room
    CANCELLED = "cancelled"


# The reasons a backend is put to sleep for (`microscheduler_backend_sleeps_total`).
SLEEP_REASONS: Final = (
    StopReason.IDLE,
    StopReason.EVICTION,
    StopReason.YIELD,
    StopReason.ADMIN,
    StopReason.STANDBY,
    StopReason.UNLOAD,
)


class SleepOutcome(enum.StrEnum):
    """How a sleep ended: the `outcome` label of `microscheduler_backend_sleeps_total`."""

    SLEPT = "slept"
    STOPPED = "stopped"  # the server offers no sleep mode: stopped instead
    FAILED = "failed"  # the sleep call failed: stopped instead


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


class RestartBackoff:
    """When a failed backend may be started again: `base_s` after the first failure in a
    row, doubling with each further one up to `MAX_RESTART_BACKOFF_S`. Time is passed in."""

    def __init__(self, base_s: float = RESTART_BACKOFF_S) -> None:
        self._base_s = base_s
        self.failures = 0  # in a row; reset when the backend becomes ready
        self._retry_at: float | None = None

    def failed(self, now: float) -> None:
        self.failures += 1
        backoff = self._base_s * 2 ** min(self.failures - 1, 16)
        self._retry_at = now + min(MAX_RESTART_BACKOFF_S, backoff)

    def reset(self) -> None:
        self.failures, self._retry_at = 0, None

    def retry_in(self, now: float) -> float:
        """Seconds until a new start is allowed (0: now)."""
        return 0.0 if self._retry_at is None else max(0.0, self._retry_at - now)


def refusal(
    backend: str,
    state: BackendState,
    reason: str | None,
    *,
    no_vram: bool = False,
    retry_in_s: float = 0.0,
) -> BackendUnavailable:
    """Why a request for a backend in `state` (not blocked) cannot be served, with when
    to retry: a start in progress (5 s), a failure's restart backoff, or no VRAM.
    A failure whose reason begins `port_in_use:` (another server answers on its port:
    `app.runtimes.port_check`, `app.lifecycle.server.NotOurServer`) is of that kind."""
    detail = f": {reason}" if reason else ""
    if state is BackendState.STARTING:
        return BackendUnavailable(
            f"backend {backend!r} is starting; retry shortly",
            kind=UnavailableKind.STARTING,
            retry_after_s=5,
        )
    if state is BackendState.FAILED:
        return BackendUnavailable(
            f"backend {backend!r} failed{detail}",
            kind=failure_kind(reason),
            retry_after_s=max(1, math.ceil(retry_in_s)),
        )
    kind = UnavailableKind.NO_VRAM if no_vram else UnavailableKind.STOPPED
    return BackendUnavailable(f"backend {backend!r} is {state}{detail}", kind=kind)


def failure_kind(reason: str | None) -> UnavailableKind:
    """The kind of a failed backend's refusal: `port_in_use` when its reason begins with
    it (`PORT_IN_USE_REASON`), else `failed`."""
    if reason is not None and reason.startswith(PORT_IN_USE_REASON):
        return UnavailableKind.PORT_IN_USE
    return UnavailableKind.FAILED


class Stateful(Protocol):
    """What a backend's parts and most of its readers need of it: its name, its config
    (read there each time, never kept: a reload may replace it in place), its state and
    whether it starts on demand. The narrower protocols build on it."""

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> BackendConfig: ...
    @property
    def state(self) -> BackendState: ...
    @property
    def lazy(self) -> bool: ...
