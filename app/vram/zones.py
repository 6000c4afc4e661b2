"""VRAM zones held for outside workloads (image generation, a game): the data, no I/O.

A zone reserves `mib` on one GPU for a named holder until it is released or expires.
The lazy backends stopped to make room are *blocked* while it is held: their requests
fall back or get 503 naming the zone, and never wake them. A VRAM yield is a zone too
(named `yield`); it keeps the `YieldReport` of what it measured when it was taken, and
its holds: each caller of the yield (a person's `reason`, a schedule's window) holds it on
its own, with its own expiry; the yield ends when the last hold ends (`app.vram.yielding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from app.lifecycle.blocks import BlockKind
from app.settings.base import LOCAL_HOST

YIELD_ZONE = "yield"  # the name of the zone a VRAM yield holds


def gpu_name(host: str, gpu: int) -> str:
    """`GPU 0` on the gateway's own machine, `node-c GPU 0` on another host."""
    return f"GPU {gpu}" if host == LOCAL_HOST else f"{host} GPU {gpu}"


@dataclass(frozen=True, slots=True)
class YieldReport:
    """What a yield did, as the probe measured it (never the sum of configured sizes).

    `freed_mib` is free memory after minus before; None when there was no reading."""

    reason: str
    gpu: int
    min_free_mib: int | None
    include_pinned: bool
    freed_mib: int | None
    free_mib: int | None
    free_mib_before: int | None
    met: bool | None  # free_mib reached min_free_mib; None without a target or a reading
    measured_by: str
    stopped: tuple[str, ...]
    slept: tuple[str, ...]
    blocked: tuple[str, ...]  # down already, kept down while the yield holds
    failed: Mapping[str, str]  # backend -> why it could not be stopped
    drain_timeouts: tuple[str, ...]
    duration_s: float
    # Asleep before the yield: taken as they are (blocked while it holds), freeing nothing.
    already_asleep: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        fields = asdict(self)
        for key in ("stopped", "slept", "already_asleep", "blocked", "drain_timeouts"):
            fields[key] = list(fields[key])
        fields["failed"] = dict(self.failed)
        data: dict[str, Any] = {}
        for key, value in fields.items():  # `already_asleep` right after `slept`
            if key != "already_asleep":
                data[key] = value
            if key == "slept":
                data["already_asleep"] = fields["already_asleep"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> YieldReport:
        """Raises KeyError/TypeError/ValueError on a malformed report."""

        def names(key: str) -> tuple[str, ...]:
            return tuple(str(n) for n in data.get(key) or ())

        def number(key: str) -> int | None:
            value = data.get(key)
            return None if value is None else int(value)

        met = data.get("met")
        return cls(
            reason=str(data["reason"]),
            gpu=int(data["gpu"]),
            min_free_mib=number("min_free_mib"),
            include_pinned=bool(data.get("include_pinned", False)),
            freed_mib=number("freed_mib"),
            free_mib=number("free_mib"),
            free_mib_before=number("free_mib_before"),
            met=None if met is None else bool(met),
            measured_by=str(data.get("measured_by", "")),
            stopped=names("stopped"),
            slept=names("slept"),
            blocked=names("blocked"),
            failed={str(k): str(v) for k, v in dict(data.get("failed") or {}).items()},
            drain_timeouts=names("drain_timeouts"),
            duration_s=float(data.get("duration_s", 0.0)),
            already_asleep=names("already_asleep"),
        )


@dataclass(frozen=True, slots=True)
class Hold:
    """One holder's hold of the yield: its `reason`, when it was taken, when it ends by
    itself (None: when released)."""

    holder: str
    granted_at: float  # wall clock
    expires_at: float | None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def to_json(self) -> dict[str, Any]:
        return {"holder": self.holder, "granted_at": self.granted_at, "expires_at": self.expires_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Hold:
        """Raises KeyError/TypeError/ValueError on a malformed hold."""
        expires = data.get("expires_at")
        return cls(
            holder=str(data["holder"]),
            granted_at=float(data["granted_at"]),
            expires_at=None if expires is None else float(expires),
        )


def holds_end(holds: tuple[Hold, ...]) -> float | None:
    """When the last of `holds` ends by itself; None when one never does (or none)."""
    ends = [h.expires_at for h in holds]
    if not ends or None in ends:
        return None
    return max(e for e in ends if e is not None)


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    holder: str
    gpu: int
    mib: int
    granted_at: float  # wall clock (time.time()): it must survive restarts
    expires_at: float | None
    stopped: tuple[str, ...]  # backends stopped for it, blocked while it is held
    # A yield (`POST /vram/yield`) is a zone too: it holds what it freed for a game.
    kind: Literal["zone", "yield"] = "zone"
    slept: tuple[str, ...] = ()  # backends put to sleep for it (yield), blocked too
    report: YieldReport | None = None  # a yield's measurements
    host: str = LOCAL_HOST  # the machine whose GPU it holds
    # A yield's holds, oldest first; `holder` is the first's, `expires_at` the last end
    # (`with_holds`). A plain zone has none: its `holder` is its one holder.
    holds: tuple[Hold, ...] = ()

    def with_holds(self, holds: tuple[Hold, ...]) -> Zone:
        """The yield held by `holds` (at least one): its `holder` is the oldest's, it
        expires when the last one does."""
        ordered = tuple(sorted(holds, key=lambda h: h.granted_at))
        return replace(self, holds=ordered, holder=ordered[0].holder, expires_at=holds_end(ordered))

    def hold_of(self, holder: str) -> Hold | None:
        return next((h for h in self.holds if h.holder == holder), None)

    @property
    def holders(self) -> tuple[str, ...]:
        return tuple(h.holder for h in self.holds)

    @property
    def blocks(self) -> tuple[str, ...]:
        return self.stopped + self.slept

    @property
    def block_kind(self) -> BlockKind:
        return BlockKind.YIELDED if self.kind == "yield" else BlockKind.BLOCKED

    @property
    def block_key(self) -> str:
        return f"zone:{self.name}"

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def describe(self) -> str:
        if self.kind == "yield":
            held = ", ".join(repr(h) for h in self.holders) or repr(self.holder)
            return f"the VRAM yield for {held} on {gpu_name(self.host, self.gpu)}"
        return (
            f"VRAM zone {self.name!r} (held by {self.holder!r}, {self.mib} MiB on "
            f"{gpu_name(self.host, self.gpu)})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "holder": self.holder,
            "gpu": self.gpu,
            "mib": self.mib,
            "granted_at": self.granted_at,
            "expires_at": self.expires_at,
            "stopped": list(self.stopped),
            "kind": self.kind,
            "slept": list(self.slept),
            "report": None if self.report is None else self.report.to_json(),
            "host": self.host,
            # A yield's holds (a plain zone has none: its entry stays as it was).
            **({"holds": [h.to_json() for h in self.holds]} if self.holds else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Zone:
        """Raises KeyError/TypeError/ValueError on a malformed entry."""
        expires = data["expires_at"]
        zone = cls(
            name=str(data["name"]),
            holder=str(data["holder"]),
            gpu=int(data["gpu"]),
            mib=int(data["mib"]),
            granted_at=float(data["granted_at"]),
            expires_at=None if expires is None else float(expires),
            stopped=tuple(str(b) for b in data["stopped"]),
            kind="yield" if data.get("kind") == "yield" else "zone",
            slept=tuple(str(b) for b in data.get("slept", ())),
            report=None if not data.get("report") else YieldReport.from_json(data["report"]),
            host=str(data.get("host", LOCAL_HOST)),
        )
        if zone.kind != "yield":
            return zone
        holds = tuple(Hold.from_json(h) for h in data.get("holds") or ())
        # A yield saved before holds (one holder, one expiry) is one hold.
        return zone.with_holds(holds or (Hold(zone.holder, zone.granted_at, zone.expires_at),))
