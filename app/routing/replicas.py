"""Replica groups: which member of a group takes a request.

`pick_replica` is the decision, pure (the members' state in, a name and why out):

1. Among the *ready* members that nothing blocks: the fewest requests at the gateway
   (leases in flight plus requests held in its queue: exact, no scrape needed); ties go
   to the fewest requests waiting inside vLLM, then the lowest KV-cache usage (both from
   the last `/metrics` scrape; a member not scraped counts as 0), then a rotation
   (`turn`) so equal members take turns.
2. None ready: wake one. A member already starting is joined (its start is under way),
   else a sleeping one (vLLM's sleep mode wakes in seconds), else the stopped (or
   failed, stopping) one that is cheapest to admit: one whose GPUs have room for it now
   without evicting anything (by its host's last GPU sample: replicas on two machines
   start where there is room), then the smallest VRAM footprint.
3. Members blocked (yielded, in a zone, disabled) are skipped; when every one is,
   there is no pick and the request gets the error a single backend gives.

`Replicas` reads that state from the live backends, keeps each group's turn and counts
`microscheduler_replica_picks_total{group,backend,why}` (`least_loaded`, `woken`,
`retry`: the second member a request tried after the first failed before its first byte).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from app.lifecycle.state import BackendState
from app.metrics import Declare
from app.routing.routed import RoutedBackend
from app.upstreams.vllm_load import BackendLoad

# Members a request tries at most: the one picked, and one retry after a failure before
# the first byte.
REPLICA_ATTEMPTS = 2


class PickWhy(enum.StrEnum):
    LEAST_LOADED = "least_loaded"
    WOKEN = "woken"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class MemberState:
    """What the pick reads of one member."""

    name: str
    state: BackendState
    blocked: bool = False
    in_flight: int = 0  # leases plus requests held in the gateway's queue
    vllm_waiting: int | None = None  # vLLM's num_requests_waiting, last scrape
    kv_usage: float | None = None  # vLLM's kv_cache_usage_perc (0-1), last scrape
    footprint_mib: int | None = None  # what admission counts to start it
    fits: bool | None = None  # room for it now without evicting (None: unknown)


@dataclass(frozen=True, slots=True)
class Pick:
    name: str
    ready: bool  # True: least loaded among the ready; False: one to wake (or join)


# When none is ready: join a start, then wake a sleeper, then start a stopped one.
_WAKE_ORDER = {
    BackendState.STARTING: 0,
    BackendState.SLEEPING: 1,
    BackendState.STOPPED: 2,
    BackendState.FAILED: 3,
    BackendState.STOPPING: 4,
}


# Among those: room now first, unknown next, then those that would have to evict.
_ROOM_ORDER = {True: 0, None: 1, False: 2}


def pick_replica(members: Sequence[MemberState], turn: int = 0) -> Pick | None:
    """The member to send a request to (see the module docstring); None when every
    member is blocked. `turn` rotates among equally loaded ready members."""
    open_ = [m for m in members if not m.blocked]
    ready = [m for m in open_ if m.state is BackendState.READY]
    if ready:
        best = min(_load(m) for m in ready)
        tied = [m for m in ready if _load(m) == best]
        return Pick(tied[turn % len(tied)].name, ready=True)
    if not open_:
        return None
    index = {m.name: i for i, m in enumerate(members)}
    woken = min(
        open_,
        key=lambda m: (
            _WAKE_ORDER.get(m.state, 5),
            _ROOM_ORDER[m.fits],
            math.inf if m.footprint_mib is None else m.footprint_mib,
            index[m.name],
        ),
    )
    return Pick(woken.name, ready=False)


def _load(member: MemberState) -> tuple[int, int, float]:
    return (member.in_flight, member.vllm_waiting or 0, member.kv_usage or 0.0)


class Replicas:
    """The live side of the pick: member states, each group's turn, the pick counter."""

    def __init__(
        self,
        backends: Mapping[str, RoutedBackend],
        registry: CollectorRegistry,
        load_of: Callable[[str], BackendLoad | None] = lambda _name: None,
    ) -> None:
        self._backends = backends
        self._load_of = load_of
        self._turns: dict[str, int] = {}
        self.picks = Declare(registry).counter(
            "replica_picks",
            "Requests sent to a member of a replica group, by why it was picked.",
            ("group", "backend", "why"),
        )
        for name, backend in backends.items():
            group = backend.config.replica_of
            if group is not None:
                for why in PickWhy:
                    self.picks.labels(group, name, why)

    def state(self, name: str, *, room: bool = False) -> MemberState:
        """What the pick reads of member `name`; `room`: also whether it fits now (asked
        only when no member is ready, the one case the pick reads it)."""
        backend = self._backends[name]
        load = self._load_of(name)
        ready = backend.state is BackendState.READY
        return MemberState(
            name,
            backend.state,
            blocked=bool(backend.blocks),
            in_flight=backend.requests.in_flight + backend.requests.waiting,
            vllm_waiting=load.requests_waiting if load is not None and ready else None,
            kv_usage=load.kv_cache_usage_ratio if load is not None and ready else None,
            footprint_mib=backend.memory.vram_mib,
            fits=backend.admission.fits_now(backend) if room and not ready else None,
        )

    def pick(self, group: str, members: Sequence[str], *, skip: Collection[str] = ()) -> str | None:
        """The member of `group` to try (not one of `skip`), counted; None: every one left
        is blocked (or skipped)."""
        turn = self._turns.get(group, 0)
        # A member a reload removed since the request's plane was built is not picked.
        states = [self.state(m) for m in members if m not in skip and m in self._backends]
        if not any(s.state is BackendState.READY and not s.blocked for s in states):
            states = [self.state(s.name, room=True) for s in states]  # one to wake: where
        chosen = pick_replica(states, turn)
        if chosen is None:
            return None
        if chosen.ready and not skip:  # a retry does not move the turn
            self._turns[group] = turn + 1
        why = PickWhy.RETRY if skip else PickWhy.LEAST_LOADED if chosen.ready else PickWhy.WOKEN
        self.picks.labels(group, chosen.name, why).inc()
        return chosen.name


class MemberAttempts:
    """The members of `group` one request tries: the one picked first (`fallback` when
    none can be: the request then gets that backend's refusal), then at most one other
    after a failure before the first byte (`REPLICA_ATTEMPTS` in all)."""

    def __init__(
        self,
        replicas: Replicas | None,
        group: str,
        members: Sequence[str],
        fallback: str,
    ) -> None:
        self._replicas = replicas
        self._group = group
        self._members = members
        picked = None if replicas is None else replicas.pick(group, members)
        self.tried = [picked or fallback]

    @property
    def current(self) -> str:
        return self.tried[-1]

    @property
    def may_retry(self) -> bool:
        return len(self.tried) < REPLICA_ATTEMPTS and self._replicas is not None

    def retry(self) -> str | None:
        """Another member to try (counted as a `retry` pick); None: no attempt is left, or
        every other member is blocked."""
        if not self.may_retry or self._replicas is None:
            return None
        name = self._replicas.pick(self._group, self._members, skip=self.tried)
        if name is not None:
            self.tried.append(name)
        return name
