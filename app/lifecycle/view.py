"""What the API shows of a backend (`app.api.views`): one frozen view of a `Backend` and
its parts, taken when a response is made, so the API types against the fields it reads
and nothing else, and one response shows one moment of the backend.

The few readings the API calls (`start_progress()`, `load()`, `idle_s()`,
`idle_stop_in_s()`) answer what was read when the view was taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.lifecycle.backend import Backend
from app.lifecycle.load import LoadStatus
from app.lifecycle.served import Served
from app.lifecycle.sleep_guard import SleepRecord
from app.lifecycle.state import BackendState
from app.planner.footprint import Footprint
from app.runtimes.base import Runtime
from app.settings import BackendConfig
from app.upstreams.http import HttpUpstream
from app.upstreams.vllm_output import CompileSeen


@dataclass(frozen=True, slots=True)
class BackendView:
    # its lifecycle
    name: str
    config: BackendConfig
    state: BackendState
    reason: str | None
    lazy: bool
    ready_since: float | None
    last_start_s: float | None
    last_compile: CompileSeen  # its last start's torch.compile (empty: none logged)
    blocks: Mapping[str, str]  # key -> description
    serving: Served
    runtime: Runtime
    upstream: HttpUpstream
    progress: str | None  # while starting: what the start waits for
    loading: LoadStatus | None  # while starting: how far
    # its server and its watch
    runtime_detail: str | None
    healthy: bool | None  # the last health check; None before the first
    health_error: str | None
    restart_in_s: float | None
    # its requests
    in_flight: int
    waiting: int
    queued: int
    idle: float  # seconds since the last request ended
    idle_stop_in: float | None
    # its memory
    gpus: tuple[int, ...]  # where it is placed (or was last, or goes first: `Memory.gpus`)
    placed_why: str  # why there ("GPU 1: 18.2 GiB free, pack")
    vram_mib: int | None
    footprint: Footprint | None
    measured_mib: int | None
    holds_vram: bool
    held_mib: int | None
    asleep_mib: int | None
    asleep_level: int | None
    yield_method: str
    sleep_supported: bool
    ram_charge: tuple[int | None, str | None]
    sleeps: SleepRecord  # its sleeps since its last cold start, for the sleep guard

    @classmethod
    def of(cls, backend: Backend) -> BackendView:
        server, requests, memory = backend.server, backend.requests, backend.memory
        return cls(
            name=backend.name,
            config=backend.config,
            state=backend.state,
            reason=backend.reason,
            lazy=backend.lazy,
            ready_since=backend.ready_since,
            last_start_s=backend.last_start_s,
            last_compile=server.compiled,
            blocks=dict(backend.blocks),
            serving=backend.serving,
            runtime=backend.runtime,
            upstream=backend.upstream,
            progress=backend.start_progress(),
            loading=backend.load(),
            runtime_detail=server.runtime_detail,
            healthy=server.healthy,
            health_error=server.health_error,
            restart_in_s=backend.watcher.restart_in_s,
            in_flight=requests.in_flight,
            waiting=requests.waiting,
            queued=requests.queued,
            idle=requests.idle_s(),
            idle_stop_in=requests.idle_stop_in_s(),
            gpus=memory.gpus,
            placed_why=memory.placed_why,
            vram_mib=memory.vram_mib,
            footprint=memory.footprint,
            measured_mib=memory.measured_mib,
            holds_vram=memory.holds_vram,
            held_mib=memory.held_mib,
            asleep_mib=memory.asleep_mib,
            asleep_level=memory.asleep_level,
            yield_method=memory.yield_method,
            sleep_supported=memory.sleep_supported,
            ram_charge=memory.ram_charge,
            sleeps=memory.sleeps.snapshot(),
        )

    def start_progress(self) -> str | None:
        return self.progress

    def load(self) -> LoadStatus | None:
        return self.loading

    def idle_s(self) -> float:
        return self.idle

    def idle_stop_in_s(self) -> float | None:
        return self.idle_stop_in
