"""What the API shows of a backend (`app.api.views`): one read-only view over a `Backend`
and its parts, so the API types against the members it reads and nothing else.

The view reads the backend live (it is made per response, so each field is as fresh as
it was before the backend was split into parts); it changes nothing.
"""

from __future__ import annotations

from app.lifecycle.backend import Backend
from app.lifecycle.blocks import Blocks
from app.lifecycle.load import LoadStatus
from app.lifecycle.served import Served
from app.lifecycle.state import BackendState
from app.planner.footprint import Footprint
from app.runtimes.base import Runtime
from app.settings import BackendConfig
from app.upstreams.http import HttpUpstream


class BackendView:
    __slots__ = ("_backend",)

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    # -- its lifecycle ------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._backend.name

    @property
    def config(self) -> BackendConfig:
        return self._backend.config

    @property
    def state(self) -> BackendState:
        return self._backend.state

    @property
    def reason(self) -> str | None:
        return self._backend.reason

    @property
    def lazy(self) -> bool:
        return self._backend.lazy

    @property
    def ready_since(self) -> float | None:
        return self._backend.ready_since

    @property
    def last_start_s(self) -> float | None:
        return self._backend.last_start_s

    @property
    def blocks(self) -> Blocks:
        return self._backend.blocks

    @property
    def serving(self) -> Served:
        return self._backend.serving

    @property
    def runtime(self) -> Runtime:
        return self._backend.runtime

    @property
    def upstream(self) -> HttpUpstream:
        return self._backend.upstream

    def start_progress(self) -> str | None:
        return self._backend.start_progress()

    def load(self) -> LoadStatus | None:
        return self._backend.load()

    # -- its server and its watch -------------------------------------------------------

    @property
    def runtime_detail(self) -> str | None:
        return self._backend.server.runtime_detail

    @property
    def healthy(self) -> bool | None:
        """The last health check; None before the first."""
        return self._backend.server.healthy

    @property
    def health_error(self) -> str | None:
        return self._backend.server.health_error

    @property
    def restart_in_s(self) -> float | None:
        return self._backend.watcher.restart_in_s

    # -- its requests -------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return self._backend.requests.in_flight

    @property
    def waiting(self) -> int:
        return self._backend.requests.waiting

    @property
    def queued(self) -> int:
        return self._backend.requests.queued

    def idle_s(self) -> float:
        return self._backend.requests.idle_s()

    def idle_stop_in_s(self) -> float | None:
        return self._backend.requests.idle_stop_in_s()

    # -- its memory ---------------------------------------------------------------------

    @property
    def vram_mib(self) -> int | None:
        return self._backend.memory.vram_mib

    @property
    def footprint(self) -> Footprint | None:
        return self._backend.memory.footprint

    @property
    def measured_mib(self) -> int | None:
        return self._backend.memory.measured_mib

    @property
    def holds_vram(self) -> bool:
        return self._backend.memory.holds_vram

    @property
    def held_mib(self) -> int | None:
        return self._backend.memory.held_mib

    @property
    def asleep_mib(self) -> int | None:
        return self._backend.memory.asleep_mib

    @property
    def asleep_level(self) -> int | None:
        return self._backend.memory.asleep_level

    @property
    def yield_method(self) -> str:
        return self._backend.memory.yield_method

    @property
    def sleep_supported(self) -> bool:
        return self._backend.memory.sleep_supported

    @property
    def ram_charge(self) -> tuple[int | None, str | None]:
        return self._backend.memory.ram_charge
