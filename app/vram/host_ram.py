"""HostRamBook: a host's RAM as a resource of its sleeping backends.

One book per host (`app.vram.hosts.Host.ram`). It reads the host's RAM through its
`HostRamMonitor` (none: no reading), knows the host's backends, and is every backend's
`ReleasePolicy`: an idle stop, an eviction and a yield all ask it how the backend gives
its memory back (`Backend.give_back`, `Backend.stop_if_idle`), and it answers with
`app.lifecycle.release.choose_release` on the budget state it builds:

- the budget: `host_ram.sleep_budget_mib`, else half of MemTotal (unknown without both);
- the charged: each level-1 sleeper's weights (`Memory.ram_charge_mib`: measured at
  load, else the planner's estimate, else `vram_mib`), and those going to sleep at level
  1 right now (not in MemAvailable yet). A server found asleep at an unknown level is
  charged too: it may hold them.

Each choice is an event (`release`, with its reason in words), and so is each level-1
sleeper stopped to make room (cause `host_ram`). `view()` is what /status and the
metrics show.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.errors import BackendUnavailable
from app.events import EventLog
from app.gpu.host_ram import HostRamMonitor
from app.lifecycle.release import (
    RamState,
    Release,
    ReleaseSubject,
    Sleeper,
    candidate_of,
    choose_release,
)
from app.lifecycle.state import BackendState, StopReason
from app.metrics import series_name
from app.settings import HostRamConfig, ReleaseConfig
from app.vram.tenant import Tenant

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SleeperView:
    backend: str
    charged_mib: int
    charged_from: str | None  # measured, model, vram_mib (None: unknown, charged 0)
    pending: bool  # going to sleep now


@dataclass(frozen=True, slots=True)
class HostRamView:
    """A host's RAM as /status and the metrics show it (MiB)."""

    host: str
    probe: str | None  # meminfo, prometheus; None: no reading possible
    up: bool
    error: str | None
    age_s: float | None
    total_mib: int | None
    available_mib: int | None
    total_bytes: int | None
    available_bytes: int | None
    budget_mib: int | None
    budget_from: str  # sleep_budget_mib, 50% of MemTotal, unknown
    reserve_mib: int
    charged_mib: int
    sleepers: tuple[SleeperView, ...]


class HostRamBook:
    def __init__(
        self,
        host: str,
        config: HostRamConfig,
        monitor: HostRamMonitor | None,
        events: EventLog | None = None,
    ) -> None:
        self.host = host
        self.config = config
        self.monitor = monitor
        self._events = events
        self._backends: Mapping[str, Tenant] = {}

    def attach(self, backends: Mapping[str, Tenant]) -> None:
        """The backends of this host (built after the book)."""
        self._backends = backends

    # -- ReleasePolicy --------------------------------------------------------------------

    async def refresh(self) -> None:
        if self.monitor is not None:
            await self.monitor.read()

    def choose(self, backend: ReleaseSubject, how: ReleaseConfig, cause: str) -> Release:
        release = choose_release(how, candidate_of(backend), self.state())
        logger.info("release choice host=%s backend=%s cause=%s reason=%s make_room=%s",
                    self.host, backend.name, cause, release.reason,
                    ",".join(release.make_room) or "-")  # fmt: skip
        self._record(backend.name, cause, release.method, release.level, release.reason,
                     list(release.make_room))  # fmt: skip
        return release

    async def make_room(self, release: Release, requester: str) -> None:
        for name in release.make_room:
            victim = self._backends.get(name)
            if victim is None:
                continue
            reason = (
                f"stop: host RAM budget full, least recently used level-1 sleeper "
                f"(room for {requester})"
            )
            try:
                stopped = await victim.stop_if_asleep(StopReason.HOST_RAM)
            except BackendUnavailable as exc:
                logger.error("host ram: stop failed host=%s backend=%s error=%s",
                             self.host, name, exc.message)  # fmt: skip
                continue
            if stopped:
                self._record(name, str(StopReason.HOST_RAM), "stop", None, reason, [])

    def _record(
        self,
        backend: str,
        cause: str,
        method: str,
        level: int | None,
        reason: str,
        make_room: list[str],
    ) -> None:
        if self._events is not None:
            self._events.record("release", host=self.host, backend=backend, cause=cause,
                                method=method, level=level, reason=reason,
                                make_room=make_room)  # fmt: skip

    # -- state ----------------------------------------------------------------------------

    def _charged(self) -> Iterator[tuple[Tenant, bool]]:
        """(backend, pending) for each backend charged to the budget."""
        for backend in self._backends.values():
            if backend.state is BackendState.SLEEPING and backend.memory.asleep_level in (1, None):
                yield backend, False
            elif backend.memory.releasing_level == 1:
                yield backend, True

    def _budget(self) -> tuple[int | None, str]:
        if self.config.sleep_budget_mib is not None:
            return self.config.sleep_budget_mib, "sleep_budget_mib"
        reading = None if self.monitor is None else self.monitor.reading
        if reading is None:
            return None, "unknown"
        return reading.total_mib // 2, "50% of MemTotal"

    def state(self) -> RamState:
        reading = None if self.monitor is None else self.monitor.reading
        sleepers = tuple(
            Sleeper(b.name, b.memory.ram_charge_mib or 0, b.requests.last_used, pending)
            for b, pending in self._charged()
        )
        return RamState(
            self._budget()[0],
            self.config.reserve_mib,
            None if reading is None else reading.available_mib,
            sleepers,
        )

    def view(self) -> HostRamView:
        monitor = self.monitor
        reading = None if monitor is None else monitor.reading
        sleepers = tuple(
            SleeperView(b.name, b.memory.ram_charge_mib or 0, b.memory.ram_charge[1], pending)
            for b, pending in self._charged()
        )
        age = None if monitor is None else monitor.age_s()
        budget, budget_from = self._budget()
        return HostRamView(
            host=self.host,
            probe=None if monitor is None else monitor.name,
            up=monitor is not None and monitor.up,
            error=None if monitor is None else monitor.error,
            age_s=None if age is None else round(age, 3),
            total_mib=None if reading is None else reading.total_mib,
            available_mib=None if reading is None else reading.available_mib,
            total_bytes=None if reading is None else reading.total_bytes,
            available_bytes=None if reading is None else reading.available_bytes,
            budget_mib=budget,
            budget_from=budget_from,
            reserve_mib=self.config.reserve_mib,
            charged_mib=sum(s.charged_mib for s in sleepers),
            sleepers=sleepers,
        )


class HostRamCollector(Collector):
    """`microscheduler_host_ram_*` gauges, one series per host (label `host`), read from
    each book's last state at scrape time (no probe is called). Bytes, as the GPU gauges."""

    def __init__(self, books: Mapping[str, HostRamBook]) -> None:
        self._books = dict(books)

    def describe(self) -> Iterator[Metric]:
        return self._families(())

    def collect(self) -> Iterator[Metric]:
        return self._families([b.view() for b in self._books.values()])

    def _families(self, views: Iterator[HostRamView] | tuple[()] | list[HostRamView]) -> (
        Iterator[Metric]
    ):  # fmt: skip
        def family(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(series_name(f"host_ram_{name}"), doc, labels=["host"])

        up = family("probe_up", "1 when the host's last RAM reading succeeded, else 0.")
        total = family("total_bytes", "The host's MemTotal (no sample until read).")
        available = family("available_bytes", "The host's MemAvailable (no sample until read).")
        budget = family(
            "sleep_budget_bytes",
            "Host RAM the weights of level-1 sleepers may hold (host_ram.sleep_budget_mib, "
            "else half of MemTotal; no sample while unknown).",
        )
        reserve = family(
            "reserve_bytes", "MemAvailable a level-1 sleep must leave free (host_ram.reserve_mib)."
        )
        charged = family(
            "sleep_charged_bytes", "Host RAM charged to level-1 sleepers (their weights)."
        )
        sleepers = family("sleepers", "Backends charged to the host RAM budget (level-1 sleep).")
        for view in views:
            labels = [view.host]
            up.add_metric(labels, 1.0 if view.up else 0.0)
            if view.total_bytes is not None and view.available_bytes is not None:
                total.add_metric(labels, float(view.total_bytes))
                available.add_metric(labels, float(view.available_bytes))
            if view.budget_mib is not None:
                budget.add_metric(labels, float(view.budget_mib * MIB))
            reserve.add_metric(labels, float(view.reserve_mib * MIB))
            charged.add_metric(labels, float(view.charged_mib * MIB))
            sleepers.add_metric(labels, float(len(view.sleepers)))
        yield from (up, total, available, budget, reserve, charged, sleepers)
