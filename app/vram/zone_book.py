"""The zones one host's arbiter holds, as data kept in the state file: holding, releasing,
expiring and re-applying them at start, and what they block. `VramArbiter` (which grants
zones after making room) has one (`VramArbiter.book`); the yield is a zone too
(`app.vram.yielding`).

Every host saves its zones in its own section of the one state file: `zones` for the
gateway's own machine, `zones@NAME` for another host.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace

from app.errors import ErrorCode, NotFound
from app.events import EventLog
from app.lifecycle.store import StateStore
from app.settings.base import LOCAL_HOST
from app.vram.tenant import Tenant
from app.vram.zones import Zone

logger = logging.getLogger(__name__)


def zone_section(host: str) -> str:
    """The state file's section holding `host`'s zones: `zones`, or `zones@NAME`."""
    return "zones" if host == LOCAL_HOST else f"zones@{host}"


def section_host(section: str) -> str | None:
    """The host whose zones `section` holds; None: not a zones section."""
    if section == "zones":
        return LOCAL_HOST
    host = section.removeprefix("zones@")
    return None if host == section else host


class ZoneBook:
    def __init__(
        self, store: StateStore, *, host: str = LOCAL_HOST, events: EventLog | None = None
    ) -> None:
        self.host = host
        self._section = zone_section(host)
        self.store = store  # the state file (shared by every host's arbiter)
        self._events = events
        self._backends: Mapping[str, Tenant] = {}  # this host's (the arbiter attaches them)
        self.zones: dict[str, Zone] = {}

    def attach(self, backends: Mapping[str, Tenant]) -> None:
        self._backends = backends

    def release_zone(self, name: str) -> Zone:
        zone = self.zones.get(name)
        if zone is None:
            raise NotFound(f"no VRAM zone {name!r} is held", code=ErrorCode.ZONE_NOT_FOUND)
        self._drop([zone], "released")
        return zone

    def expire_zones(self, now: float) -> list[Zone]:
        """Drop expired zones. A yield is not among them: its expiry is a restore, which
        `VramYield` does (it wakes what the yield took)."""
        expired = [z for z in self.zones.values() if z.expired(now) and z.kind == "zone"]
        if expired:
            self._drop(expired, "expired")
        return expired

    def _drop(self, zones: list[Zone], why: str) -> None:
        """Forget `zones`, unblock what they stopped (it wakes on demand), save once.

        Ending a hold always takes effect: a release, a restore or an expiry goes ahead
        in memory even when the state file cannot be written (a full disk must not keep
        backends blocked); the store retries the save and `/status` shows the file is
        behind (`StateStore.put`)."""
        names = {zone.name for zone in zones}
        self._persist({n: z for n, z in self.zones.items() if n not in names})
        for zone in zones:
            del self.zones[zone.name]
            for name in zone.blocks:
                backend = self._backends.get(name)
                if backend is not None:
                    backend.unblock(zone.block_key)
            logger.info("zone %s host=%s zone=%s holder=%s", why, self.host, zone.name, zone.holder)
            if self._events is not None and zone.kind == "zone":
                self._events.record(f"zone_{why}", host=self.host, zone=zone.name,
                                    holder=zone.holder)  # fmt: skip
        if self._events is not None:
            self._events.changed()

    def restore(self) -> list[Zone]:
        """Re-apply the zones saved by an earlier run (expired ones are dropped)."""
        now = time.time()
        saved = self.store.section(self._section, [])
        for raw in saved:
            try:
                zone = Zone.from_json(raw)
            except (KeyError, TypeError, ValueError) as exc:
                logger.error("ignoring malformed saved zone entry=%r error=%s", raw, exc)
                continue
            if zone.expired(now):
                logger.info("saved zone expired while the gateway was down zone=%s", zone.name)
                continue
            missing = [b for b in zone.stopped if b not in self._backends]
            if missing:
                logger.warning("saved zone names unknown backends zone=%s backends=%s",
                               zone.name, ",".join(missing))  # fmt: skip
            zone = replace(
                zone,
                stopped=tuple(b for b in zone.stopped if b in self._backends),
                slept=tuple(b for b in zone.slept if b in self._backends),
                host=self.host,
            )
            self.zones[zone.name] = zone
            for backend in zone.blocks:
                self._backends[backend].block(
                    zone.block_key, zone.describe(), zone.block_kind, zone.expires_at
                )
        if len(self.zones) != len(saved):
            self._persist(self.zones)  # drop what expired or was malformed (retried if need be)
        return list(self.zones.values())

    async def hold_zone(self, zone: Zone) -> None:
        """Hold `zone` (replacing one of the same name) once it is saved, the save awaited
        (`StateStore.hold`): the loop serves while the store's thread saves
        (`StateWriteError`: nothing changes). Its blocks are the caller's to place. A zone
        dropped or kept meanwhile (an expiry, another hold of the yield ended) is saved
        again after this one, so the state file ends as memory is."""
        wanted = {**self.zones, zone.name: zone}
        try:
            await self.store.hold(self._section, [z.to_json() for z in wanted.values()])
        except asyncio.CancelledError:
            # The save may run on in the store's thread: queued after it, this puts the
            # file back to what memory holds (the zone is not held).
            self._persist(self.zones)
            raise
        self.zones[zone.name] = zone
        if self.zones != wanted:  # changed during the save: its save, queued after this
            # one's, left this zone out: save what memory holds now
            self._persist(self.zones)
        if self._events is not None:
            self._events.changed()

    async def ensure_state_writable(self) -> None:
        """Raises `StateWriteError` when a zone could not be saved now (the store's
        thread checks; the loop serves meanwhile)."""
        await self.store.ensure_writable()

    def keep_zone(self, zone: Zone) -> None:
        """Hold `zone` in place of the one of its name, less than before (a hold of the
        yield ended): takes effect even when the state file cannot be written (the save
        is retried, like `_drop`'s)."""
        self._persist({**self.zones, zone.name: zone})
        self.zones[zone.name] = zone
        if self._events is not None:
            self._events.changed()

    def drop_zone(self, name: str, why: str) -> Zone | None:
        """Forget zone `name` and unblock what it blocked; None when it is not held."""
        zone = self.zones.get(name)
        if zone is not None:
            self._drop([zone], why)
        return zone

    def _persist(self, zones: Mapping[str, Zone]) -> None:
        """Save `zones` as this host's (a hold ended): never refused, retried when the
        file cannot be written."""
        self.store.put(self._section, [z.to_json() for z in zones.values()])
