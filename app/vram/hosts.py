"""The machines whose GPUs the gateway schedules: the local one (the top-level `docker:` and
`gpu:`) and each of `hosts:`.

A `Host` bundles what is per machine: its GPU monitor (none: no telemetry, admission off
there), its `VramArbiter` (admission, eviction and zones on its GPUs, which never see
another host's backends), its `VramYield`, when configured its automatic yield, and its
`HostRamBook` (its RAM, the budget of its level-1 sleepers). A
backend belongs to the host its `host:` names; a kubernetes backend without one belongs to
none (the cluster's scheduler places it).

Zone names are unique across hosts (`POST /vram/zones/{zone}/release` finds the zone on
whichever host holds it); every host may hold a yield of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from app.errors import Conflict, ErrorCode, InvalidRequest, NotFound
from app.gpu.poller import GpuMonitor
from app.settings import LOCAL_HOST, GpuConfig
from app.vram.arbiter import VramArbiter
from app.vram.auto_yield import AutoYield
from app.vram.host_ram import HostRamBook
from app.vram.tenant import Tenant
from app.vram.yielding import VramYield


@dataclass(frozen=True, eq=False)
class Host:
    name: str
    gpu: GpuConfig
    arbiter: VramArbiter
    vram_yield: VramYield
    auto_yield: AutoYield | None
    backends: Mapping[str, Tenant]  # those whose GPUs it accounts
    ram: HostRamBook  # its RAM, and how its backends give their memory back
    # Why it has no probe although none was asked for (`gpu.probe: auto`, `app.gpu.auto`).
    probe_warning: str | None = None

    @property
    def monitor(self) -> GpuMonitor | None:
        """Its GPU telemetry (the arbiter's); None: admission is off there."""
        return self.arbiter.monitor


class Hosts(Mapping[str, Host]):
    """Every host by name, the local one first."""

    def __init__(self, hosts: Mapping[str, Host]) -> None:
        self._hosts = dict(hosts)
        assert LOCAL_HOST in self._hosts
        # zone name -> the host granting it now, and how many grants of it are running
        self._acquiring: dict[str, tuple[Host, int]] = {}

    def __getitem__(self, name: str) -> Host:
        return self._hosts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    @property
    def local(self) -> Host:
        return self._hosts[LOCAL_HOST]

    def named(self, name: str | None) -> Host:
        """The host a request names (None: the local one); 400 naming the known ones."""
        if name is None:
            return self.local
        host = self._hosts.get(name)
        if host is None:
            raise InvalidRequest(
                f"no host {name!r} (hosts: {', '.join(self._hosts)})", param="host"
            )
        return host

    def holding_zone(self, zone: str) -> Host:
        """The host holding zone `zone`; 404 `zone_not_found` when none does."""
        for host in self._hosts.values():
            if zone in host.arbiter.book.zones:
                return host
        raise NotFound(f"no VRAM zone {zone!r} is held", code=ErrorCode.ZONE_NOT_FOUND)

    @contextlib.contextmanager
    def zone_name(self, zone: str, on: Host) -> Iterator[None]:
        """Around a zone's acquire on host `on`: a zone name is held on one host at a time,
        so 409 when another host holds it or is granting it right now."""
        for host in self._hosts.values():
            held = host.arbiter.book.zones.get(zone)
            if host is not on and held is not None:
                raise Conflict(
                    f"{held.describe()} is already held on host {host.name!r}; zone names "
                    "are unique across hosts: release it first or pick another name"
                )
        granting, running = self._acquiring.get(zone, (on, 0))
        if granting is not on:
            raise Conflict(
                f"VRAM zone {zone!r} is being granted on host {granting.name!r}; zone names "
                "are unique across hosts"
            )
        # Counted: two grants on one host may overlap, and the name stays theirs until
        # the last one ends (not the first, which may end first by being refused).
        self._acquiring[zone] = (on, running + 1)
        try:
            yield
        finally:
            host, running = self._acquiring[zone]
            if running == 1:
                del self._acquiring[zone]
            else:
                self._acquiring[zone] = (host, running - 1)
