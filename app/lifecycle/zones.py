"""VRAM zones held for outside workloads (image generation): the data, no I/O.

A zone reserves `mib` on one GPU for a named holder until it is released or expires.
The lazy backends stopped to make room are *blocked* while it is held: their requests
fall back or get 503 naming the zone, and never wake them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    holder: str
    gpu: int
    mib: int
    granted_at: float  # wall clock (time.time()): it must survive restarts
    expires_at: float | None
    stopped: tuple[str, ...]  # backends stopped for it, blocked while it is held

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def describe(self) -> str:
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
        )
