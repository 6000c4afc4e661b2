"""VRAM zones held for outside workloads (image generation): the data, no I/O.

A zone reserves `mib` on one GPU for a named holder until it is released or expires.
The lazy backends stopped to make room are *blocked* while it is held: their requests
fall back or get 503 naming the zone, and never wake them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

YIELD_ZONE = "yield"  # the name of the zone a VRAM yield holds


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
    report: dict[str, Any] = field(default_factory=dict)  # the yield's answer, as measured

    @property
    def blocks(self) -> tuple[str, ...]:
        return self.stopped + self.slept

    @property
    def block_kind(self) -> str:
        return "yielded" if self.kind == "yield" else "blocked"

    @property
    def block_key(self) -> str:
        return f"zone:{self.name}"

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def describe(self) -> str:
        if self.kind == "yield":
            return f"the VRAM yield for {self.holder!r} on GPU {self.gpu}"
        return (
            f"VRAM zone {self.name!r} (held by {self.holder!r}, {self.mib} MiB on GPU {self.gpu})"
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
            "report": self.report,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Zone:
        """Raises KeyError/TypeError/ValueError on a malformed entry."""
        expires = data["expires_at"]
        return cls(
            name=str(data["name"]),
            holder=str(data["holder"]),
            gpu=int(data["gpu"]),
            mib=int(data["mib"]),
            granted_at=float(data["granted_at"]),
            expires_at=None if expires is None else float(expires),
            stopped=tuple(str(b) for b in data["stopped"]),
            kind="yield" if data.get("kind") == "yield" else "zone",
            slept=tuple(str(b) for b in data.get("slept", ())),
            report=dict(data.get("report") or {}),
        )
