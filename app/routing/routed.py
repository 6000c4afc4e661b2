"""What routing reads of a backend (`app.lifecycle.backend.Backend`): the data plane's
narrow interface to a local backend, after llama-swap's `Process`.

- a request's way in: `requests.acquire()` (a lease on the ready backend, held while it
  starts), `requests.warm_up()` (begin its start without waiting: a priced-out chain);
- what it serves (`serving`), how to reach it (`upstream`), how long until it is ready
  (`ready_in_s`), its `config`, `state` and `blocks`;
- for a replica group's pick: its requests in flight or held, its footprint and whether
  it fits now (`admission.fits_now`, which reads it as a `Claimant`);
- for LoRA adapters: the adapters loaded on its server (`adapters`) and `adapters_epoch`.
"""

from __future__ import annotations

from typing import Protocol

from app.errors import BackendUnavailable, UnavailableKind
from app.lifecycle.adapters import LoadedAdapters
from app.lifecycle.admission import Admission, Claimant
from app.lifecycle.blocks import Blocks
from app.lifecycle.key_turns import NO_KEY, KeyShare
from app.lifecycle.lease import Lease, WaitNotice
from app.lifecycle.served import Served
from app.lifecycle.state import BackendState
from app.settings.keys import Priority
from app.upstreams.http import HttpUpstream


class Requests(Protocol):
    """A backend's requests, as routing uses them (`app.lifecycle.request_holds`)."""

    async def acquire(
        self,
        on_wait: WaitNotice | None = None,
        *,
        max_wait_s: float | None = None,
        priority: Priority = Priority.NORMAL,
        share: KeyShare = NO_KEY,
    ) -> Lease: ...
    async def warm_up(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def waiting(self) -> int: ...


class RoutedBackend(Claimant, Protocol):
    """A local backend as routing sees it: a `Claimant` (name, config, memory, server) and
    what the data plane reads besides."""

    @property
    def state(self) -> BackendState: ...
    @property
    def blocks(self) -> Blocks: ...
    @property
    def serving(self) -> Served: ...
    @property
    def upstream(self) -> HttpUpstream: ...
    @property
    def requests(self) -> Requests: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def adapters(self) -> LoadedAdapters: ...
    @property
    def adapters_epoch(self) -> int: ...
    def ready_in_s(self) -> float | None: ...


def removed(name: str) -> BackendUnavailable:
    """The refusal of backend `name` when a request meets it after a reload removed it: a
    request keeps the routing plane it arrived on (`app.routing.plane`), which may name
    it still. The same answer as the reload's block gave while it was drained."""
    return BackendUnavailable(
        f"backend {name!r} is disabled by a configuration reload", kind=UnavailableKind.DISABLED
    )
