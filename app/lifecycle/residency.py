"""`min_resident_s`: once a lazy backend is ready, another backend's start does not evict
it for that long; the start waits instead (zones and the yield force past it). Without it,
two models that do not fit together and take turns with requests swap at every turn, and
each swap costs a full model load (llama-swap #612).

The waiting start sleeps outside the GPUs' locks: nothing is launched meanwhile, so other
starts that fit, zones and the yield are not held up by it, and the protected backend
keeps serving (its data plane never touches admission).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Final

from app.lifecycle.admission import AdmissionRefused, Claimant
from app.lifecycle.backend import Backend
from app.lifecycle.placement import Placement
from app.lifecycle.state import BackendState

logger = logging.getLogger(__name__)

# A waiting start plans again at least this often: a protected backend that stops by
# itself (idle, admin) lets it in sooner.
RESIDENCY_POLL_S: Final = 1.0


def protected_for_s(backend: Backend, now: float | None = None) -> float:
    """Seconds of its min_resident_s left (0: not ready, not lazy, or the time is up)."""
    since = backend.ready_since
    if backend.state is not BackendState.READY or since is None or not backend.lazy:
        return 0.0
    now = time.monotonic() if now is None else now
    return max(0.0, since + backend.config.min_resident_s - now)


def may_evict(starter: Backend, victim: Backend) -> bool:
    """Whether the configuration lets a start of `starter` evict `victim`."""
    return (
        victim.lazy
        and victim is not starter
        and victim.config.priority < starter.config.priority
        and bool(set(victim.config.gpus) & set(starter.config.gpus))
    )


async def wait_out(backend: Claimant, plan: Placement, refusal: str, deadline: float) -> None:
    """Sleep while the residents `plan` waits for are protected (at most `RESIDENCY_POLL_S`:
    the caller plans again after); `start_progress` says so meanwhile. Raises
    `AdmissionRefused` (with `refusal`, what holds the memory) when the wait would end
    after `deadline`."""
    wait_s = plan.wait_s
    assert wait_s is not None
    now = time.monotonic()
    names = ", ".join(plan.protected)
    if now + wait_s > deadline:
        raise AdmissionRefused(
            f"{refusal}; {names} stay resident for {math.ceil(wait_s)}s more (min_resident_s), "
            f"longer than this start waits ({backend.config.start_timeout_s:g}s, "
            "start_timeout_s)"
        )
    until = now + wait_s
    verb = "is" if len(plan.protected) == 1 else "are"

    def progress() -> str:
        left = math.ceil(max(0.0, until - time.monotonic()))
        return f"waiting for VRAM: {names} {verb} resident for {left}s more (min_resident_s)"

    logger.info("start waits for min_resident_s backend=%s residents=%s wait_s=%.1f",
                backend.name, names, wait_s)  # fmt: skip
    with backend.server.waiting_for_vram(progress):
        await asyncio.sleep(min(wait_s, RESIDENCY_POLL_S))
