"""Automatic yield: when something the gateway does not manage (a game) takes GPU memory,
yield; when it has gone for a while, restore what the gateway yielded itself.

`AutoYieldPolicy` decides from readings (pure: no I/O, no clock of its own); `AutoYield`
feeds it the GPU monitor's last snapshot on every poll and acts through `VramYield`.

Foreign memory on a GPU = used (as the probe measures it) minus what the gateway's
backends hold there (their measured memory, else what admission placed). It must stay
above `foreign_mib` for `settle_s` before a yield (a brief spike does not stop models),
and below it for `restore_after_s` before a restore. A yield a person asked for is never
undone here; one that a person restored is forgotten; its restore ends its own hold
only, so a person who joined the automatic yield (`POST /vram/yield`) holds it on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from app.errors import GatewayError
from app.events import EventLog
from app.gpu.telemetry import GpuSnapshot
from app.settings import AutoYieldConfig
from app.vram.arbiter import VramArbiter
from app.vram.yield_answers import YieldRequest
from app.vram.yielding import VramYield
from app.vram.zones import Zone

logger = logging.getLogger(__name__)

REASON = "auto: foreign GPU memory"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["yield", "restore"]
    gpu: int
    foreign_mib: int


def foreign_mib(snapshot: GpuSnapshot, held: Mapping[int, int]) -> dict[int, int]:
    """Per usable GPU: used memory the backends' `held` MiB do not account for (>= 0)."""
    return {
        stats.index: max(0, stats.used_mib - held.get(stats.index, 0))
        for stats in snapshot.gpus
        if not stats.lost
    }


class AutoYieldPolicy:
    """When to yield and when to restore, from (time, foreign MiB per GPU, the yield held)."""

    def __init__(self, config: AutoYieldConfig) -> None:
        self.config = config
        self._above_since: dict[int, float] = {}
        self._below_since: float | None = None
        self.ours: float | None = None  # granted_at of the yield this policy took

    def took(self, zone: Zone) -> None:
        self.ours = zone.granted_at

    def decide(self, now: float, foreign: Mapping[int, int], held: Zone | None) -> Decision | None:
        cfg = self.config
        if held is not None and (self.ours != held.granted_at or held.hold_of(REASON) is None):
            # A person's yield, ours restored and another taken, or ours let go of (a
            # person holds it on).
            self.ours = None
        if held is None:
            self.ours = None
            self._below_since = None
            for gpu, mib in sorted(foreign.items()):
                if mib <= cfg.foreign_mib:
                    self._above_since.pop(gpu, None)
                    continue
                since = self._above_since.setdefault(gpu, now)
                if now - since >= cfg.settle_s:
                    return Decision("yield", gpu, mib)
            return None
        self._above_since.clear()
        if self.ours is None:
            return None  # never undo a yield a person asked for
        mib = foreign.get(held.gpu, 0)
        if mib > cfg.foreign_mib:
            self._below_since = None
            return None
        if self._below_since is None:
            self._below_since = now
        if now - self._below_since >= cfg.restore_after_s:
            return Decision("restore", held.gpu, mib)
        return None


class AutoYield:
    def __init__(
        self,
        config: AutoYieldConfig,
        vram_yield: VramYield,
        arbiter: VramArbiter,
        events: EventLog,
    ) -> None:
        self.policy = AutoYieldPolicy(config)
        self._yield = vram_yield
        self._arbiter = arbiter
        self._events = events

    async def step(self, snapshot: GpuSnapshot | None, now: float) -> Decision | None:
        """Decide on the latest snapshot (monotonic `now`) and act; returns what it did."""
        if snapshot is None:
            return None
        foreign = foreign_mib(snapshot, self._arbiter.held_mib(measured=True))
        decision = self.policy.decide(now, foreign, self._yield.current)
        if decision is None:
            return None
        host = self._arbiter.host
        self._events.record(f"auto_{decision.action}", host=host, gpu=decision.gpu,
                            foreign_mib=decision.foreign_mib)  # fmt: skip
        logger.info("auto %s host=%s gpu=%d foreign_mib=%d", decision.action, host,
                    decision.gpu, decision.foreign_mib)  # fmt: skip
        try:
            if decision.action == "yield":
                request = YieldRequest(
                    reason=REASON,
                    include_pinned=self.policy.config.include_pinned,
                    gpu=decision.gpu,
                )
                outcome = await self._yield.yield_vram(request)
                if not outcome.already:
                    self.policy.took(outcome.zone)
            else:
                # Its own hold only: a person who joined the yield holds it on.
                await self._yield.restore("auto", holder=REASON)
        except GatewayError as exc:
            logger.error("auto %s failed gpu=%d error=%s", decision.action, decision.gpu, exc)
        return decision
