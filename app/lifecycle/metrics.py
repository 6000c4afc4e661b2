"""The backends' lifecycle series, added to the gateway's `Metrics` (one registry):

    microscheduler_backend_state{backend,state}, backend_starts{backend,outcome},
    backend_start_duration_seconds, start_cancelled{backend}, backend_stops{backend,reason},
    drain_timeouts, backend_sleeps{backend,outcome,reason}, sleep_guard{backend,cause},
    swaps{backend,evicted}, swap_wait_seconds,
    vram_yield_active/vram_yields/vram_yield_freed_bytes{host}, state_save_failures,
    state_persisted, profile_active{profile}, backend_enabled{backend},
    backend_gpu{backend,host,gpu} (`BackendGpuCollector`, read at scrape time)

Their label sets are the lifecycle's own enums (`app.lifecycle.state`), which is why they
live here and not in `app.metrics` (the ground floor, which imports nothing of the app).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.lifecycle.sleep_guard import GuardCause
from app.lifecycle.state import (
    SLEEP_REASONS,
    BackendState,
    SleepOutcome,
    StartOutcome,
    StopReason,
)
from app.metrics import LATENCY_BUCKETS, Declare, Metrics, series_name
from app.settings import BackendConfig

YIELD_OUTCOMES: Final = ("yielded", "already", "restored", "expired", "failed")


class LifecycleMetrics(Metrics):
    """The gateway's metrics: the request series of `Metrics` and the lifecycle's."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self._declare_backend_series()
        self._declare_yield_series()
        self._declare_state_series()

    def _declare_backend_series(self) -> None:
        new = Declare(self.registry)
        self.backend_state = new.gauge(
            "backend_state",
            "1 for the lifecycle state the backend is in, 0 for the others.",
            ("backend", "state"),
        )
        self.starts = new.counter(
            "backend_starts",
            "Starts of a backend by outcome (refused: not enough VRAM).",
            ("backend", "outcome"),
        )
        self.start_duration = new.histogram(
            "backend_start_duration_seconds",
            "From the start decision to the backend answering its health check.",
            ("backend",),
            buckets=(*LATENCY_BUCKETS[5:], 900.0, 1800.0),
        )
        self.start_cancelled = new.counter(
            "start_cancelled",
            "Lazy starts cancelled before ready because every request waiting for them "
            "left (client cancel or max_wait_s) and nothing else asked for them.",
            ("backend",),
        )
        self.stops = new.counter(
            "backend_stops", "Stops of a backend by the gateway, by reason.", ("backend", "reason")
        )
        self.swaps = new.counter(
            "swaps",
            "Starts of `backend` that evicted `evicted` to make room on its GPUs.",
            ("backend", "evicted"),
        )
        self.swap_wait = new.histogram(
            "swap_wait_seconds",
            "How long a start waited for VRAM other models held (min_resident_s, eviction "
            "and the memory coming back); only starts that had to wait or evict, and got in.",
            ("backend",),
        )
        self.drain_timeouts = new.counter(
            "drain_timeouts",
            "Stops that went ahead with requests still in flight after drain_timeout_s.",
            ("backend",),
        )
        self.backend_sleeps = new.counter(
            "backend_sleeps",
            "Sleeps of a backend (vLLM sleep mode) by outcome (stopped: sleep mode was not "
            "offered, so it was stopped instead) and reason (idle, eviction, yield, admin).",
            ("backend", "outcome", "reason"),
        )
        self.sleep_guard = new.counter(
            "sleep_guard",
            "Backends the sleep guard stopped, by cause: leak (what a sleep held grew past "
            "sleep_leak_mib over its first since a cold start), wake_failed, wake_timeout.",
            ("backend", "cause"),
        )

    def _declare_yield_series(self) -> None:
        new = Declare(self.registry)
        self.yield_active = new.gauge(
            "vram_yield_active",
            "1 while a VRAM yield (POST /vram/yield) holds a host's GPU for an outside workload.",
            ("host",),
        )
        self.yields = new.counter(
            "vram_yields", "VRAM yield operations by host and outcome.", ("host", "outcome")
        )
        self.yield_freed = new.gauge(
            "vram_yield_freed_bytes",
            "Free GPU memory after the host's last yield minus before it, as the probe "
            "measured it.",
            ("host",),
        )

    def _declare_state_series(self) -> None:
        """The state file's health and the GPU profiles."""
        new = Declare(self.registry)
        self.state_save_failures = new.counter(
            "state_save_failures",
            "Saves of the state file (zones, yield, profile) that failed (disk full, "
            "directory read-only or missing).",
        )
        self.state_persisted = new.gauge(
            "state_persisted",
            "1 when the state file holds what the gateway holds in memory; 0 while an "
            "ended hold waits for its save to be retried.",
        )
        self.profile_active = new.gauge(
            "profile_active", "1 for the active GPU profile, 0 for the others.", ("profile",)
        )
        self.backend_enabled = new.gauge(
            "backend_enabled",
            "1 when the active GPU profile lets the backend run, else 0.",
            ("backend",),
        )

    def declare_host(self, host: str) -> None:
        """Create a host's yield series at zero (`local`: the gateway's own machine)."""
        self.yield_active.labels(host)
        self.yield_freed.labels(host)
        for outcome in YIELD_OUTCOMES:
            self.yields.labels(host, outcome)

    def declare_backend(self, backend: str) -> None:
        """Create every per-backend series at zero so dashboards see them before traffic."""
        super().declare_backend(backend)
        for state in BackendState:
            self.backend_state.labels(backend, state)
        for outcome in StartOutcome:
            self.starts.labels(backend, outcome)
        for reason in StopReason:
            self.stops.labels(backend, reason)
        self.start_duration.labels(backend)
        self.start_cancelled.labels(backend)
        self.backend_enabled.labels(backend).set(1)
        for slept in SleepOutcome:
            for sleep_reason in SLEEP_REASONS:
                self.backend_sleeps.labels(backend, slept, sleep_reason)
        for cause in GuardCause:
            self.sleep_guard.labels(backend, cause)
        self.drain_timeouts.labels(backend)
        self.swap_wait.labels(backend)

    def set_backend_state(self, backend: str, state: BackendState) -> None:
        for name in BackendState:
            self.backend_state.labels(backend, name).set(1 if name is state else 0)

    def watch_placements(self, backends: Mapping[str, Placed]) -> None:
        """Export `backend_gpu` for `backends` (read at each scrape: a reload that adds or
        removes entries of the mapping in place is seen)."""
        self.registry.register(BackendGpuCollector(backends))


class PlacedMemory(Protocol):
    @property
    def gpus(self) -> tuple[int, ...]: ...
    @property
    def holds_vram(self) -> bool: ...


class Placed(Protocol):
    """What `BackendGpuCollector` reads of a backend (`app.lifecycle.backend.Backend`)."""

    @property
    def config(self) -> BackendConfig: ...
    @property
    def memory(self) -> PlacedMemory: ...


class BackendGpuCollector(Collector):
    """`microscheduler_backend_gpu{backend,host,gpu}`: 1 for each GPU a backend holds
    memory on now (`Backend.memory.gpus` while `holds_vram`, as `/status` `gpus`), 0 for
    each other GPU it may sit on: its `gpus:` list, and every GPU a scrape saw it hold
    since the gateway started (`gpus: auto` or a count). A GPU it left goes to 0, not away, so a
    graph shows the move and `changes()` counts it; the series stay bounded by the
    backends x their host's GPUs. A kubernetes backend without `host:` has none (the
    cluster places it); a backend a reload removed loses its series.

    Read at scrape time, like the GPU and host RAM collectors: nothing to keep in step
    with the starts, stops and placements (a placement happens inside an admission,
    before any state change)."""

    def __init__(self, backends: Mapping[str, Placed]) -> None:
        self._backends = backends
        self._seen: dict[str, set[int]] = {}  # backend -> GPUs a scrape saw it hold

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for name in set(self._seen) - set(self._backends):
            del self._seen[name]  # removed by a reload
        for name, backend in self._backends.items():
            config, memory = backend.config, backend.memory
            if not config.gpus_accounted:
                continue
            held = set(memory.gpus) if memory.holds_vram else set()
            seen = self._seen.setdefault(name, set())
            seen |= held | set(config.fixed_gpus or ())
            for gpu in sorted(seen):
                family.add_metric([name, config.host_name, str(gpu)], 1.0 if gpu in held else 0.0)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            series_name("backend_gpu"),
            "1 for each GPU the backend holds memory on now, 0 for the others it may use "
            "(its gpus: list, or those a scrape saw it hold since the gateway started).",
            labels=["backend", "host", "gpu"],
        )
