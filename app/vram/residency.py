"""`min_resident_s`: once a lazy backend is ready, another backend's start does not evict
it for that long; the start waits instead (zones and the yield force past it).
`max_hold_s`: a busy lazy backend keeps the GPU against a start of equal priority for that
long from its ready; the start waits for it to go idle (woken at once when it does:
`IdleSignal`) or for the hold to end. Without them, two models that do not fit together
and take turns with requests swap at every turn, and each swap costs a wake or a full
model load (llama-swap #612).

The waiting start sleeps outside the GPUs' locks: nothing is launched meanwhile, so other
starts that fit, zones and the yield are not held up by it, and the protected backend
keeps serving (its data plane never touches admission).

A start that needs memory held by a backend still starting (admitted but not ready yet:
past its GPUs' locks and learning what it serves, or adopted at gateway start and still
loading) waits for that start to end the same way (`wait_for_starts`), then plans again:
the other is then ready and evicted by these rules (or protected by them), or failed and
its memory free. It is never refused because the holder is mid-start (issue 31, 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Final

from app.lifecycle.admission import AdmissionRefused, Claimant
from app.lifecycle.load import WAITING_FOR_TURN
from app.lifecycle.state import BackendState
from app.vram.placement import Placement
from app.vram.tenant import Resident, Tenant

logger = logging.getLogger(__name__)

# A waiting start plans again at least this often: a protected backend that stops by
# itself (idle, admin) lets it in sooner.
RESIDENCY_POLL_S: Final = 1.0


def protected_for_s(backend: Resident, now: float | None = None) -> float:
    """Seconds of its min_resident_s left (0: not ready, not lazy, or the time is up)."""
    since = backend.ready_since
    if backend.state is not BackendState.READY or since is None or not backend.lazy:
        return 0.0
    now = time.monotonic() if now is None else now
    return max(0.0, since + backend.config.min_resident_s - now)


def hold_for_s(backend: Tenant, now: float | None = None) -> float:
    """Busy: seconds of its `max_hold_s` left, during which a start of equal priority
    waits for it (0: idle, not ready, not lazy, or the hold is over)."""
    since = backend.ready_since
    if (
        backend.state is not BackendState.READY
        or since is None
        or not backend.lazy
        or not backend.requests.in_flight
    ):
        return 0.0
    now = time.monotonic() if now is None else now
    return max(0.0, since + backend.config.max_hold_s - now)


def may_evict(starter: Tenant, victim: Tenant) -> bool:
    """Whether the configuration lets a start of `starter` evict `victim` (an equal only
    when idle or past its hold: see `app.vram.placement`)."""
    return (
        victim.lazy
        and victim is not starter
        and victim.config.priority <= starter.config.priority
        and bool(set(victim.memory.gpus) & set(starter.memory.gpus))
    )


async def wait_out(
    backend: Claimant, plan: Placement, refusal: str, deadline: float, idle: IdleSignal
) -> None:
    """Sleep while the residents `plan` waits for are protected (at most `RESIDENCY_POLL_S`,
    or until a backend goes idle: the caller plans again after); `start_progress` says so
    meanwhile. Raises `AdmissionRefused` (with `refusal`, what holds the memory) when the
    wait would end after `deadline`."""
    wait_s = plan.wait_s
    assert wait_s is not None
    now = time.monotonic()
    names = ", ".join(plan.protected)
    # A busy equal's turn may end sooner (when it goes idle): wait for it up to the
    # deadline; a min_resident_s ends when it ends: refuse at once when that is too late.
    why = _why(plan)
    if now + wait_s > deadline and (not plan.holding or now >= deadline):
        raise AdmissionRefused(
            f"{refusal}; {names} stay resident for {math.ceil(wait_s)}s more "
            f"({why}), longer than "
            f"this start waits ({backend.config.start_timeout_s:g}s, "
            "start_timeout_s)"
        )
    until = min(now + wait_s, deadline)
    verb = "is" if len(plan.protected) == 1 else "are"

    def progress() -> str:
        left = math.ceil(max(0.0, until - time.monotonic()))
        return f"waiting for VRAM: {names} {verb} resident for {left}s more ({why})"

    logger.info("start waits for min_resident_s/max_hold_s backend=%s residents=%s "
                "wait_s=%.1f", backend.name, names, wait_s)  # fmt: skip
    with backend.server.waiting_for_vram(progress):
        await idle.wait(min(until - now, RESIDENCY_POLL_S))


def _why(plan: Placement) -> str:
    """What protects the residents a start waits for, in config's words."""
    if plan.holding:
        return "busy, max_hold_s"
    if plan.kept and len(plan.kept) == len(plan.protected):
        return "a client's keep_alive"
    return "min_resident_s, a client's keep_alive" if plan.kept else "min_resident_s"


def turn_text(turns: Sequence[tuple[str, Sequence[str]]]) -> str:
    """What a start waits for its turn on, in words, from (whose, on which GPUs) pairs:
    `waiting for turn-b's start on GPU 0`."""
    return "waiting for " + ", ".join(f"{whose} on {' and '.join(gpus)}" for whose, gpus in turns)


async def wait_for_starts(
    backend: Claimant, starting: Sequence[Tenant], text: str, refusal: str, deadline: float
) -> None:
    """Wait (at most `RESIDENCY_POLL_S`: the caller plans again after) for the starts of
    `starting` to end: they hold memory this start needs and are not evicted mid-start.
    `start_progress` is `text` meanwhile (`turn_text`), its load phase `waiting_for_turn`.
    Raises `AdmissionRefused` (with `refusal`, what holds the memory) once `deadline` has
    passed, or when their starts have ended without them leaving `starting`."""
    names = ", ".join(b.name for b in starting)
    now = time.monotonic()
    if now >= deadline:
        verb = "is" if len(starting) == 1 else "are"
        raise AdmissionRefused(
            f"{refusal}; {names} {verb} still starting, longer than this start waits "
            f"({backend.config.start_timeout_s:g}s, start_timeout_s)"
        )
    logger.debug("start waits for starts under way backend=%s starting=%s", backend.name, names)
    timeout_s = min(deadline - now, RESIDENCY_POLL_S)
    with backend.server.waiting_for_vram(lambda: text, phase=WAITING_FOR_TURN):
        under_way = await asyncio.gather(*(b.start_ended(timeout_s) for b in starting))
    if not any(under_way) and all(b.state is BackendState.STARTING for b in starting):
        raise AdmissionRefused(refusal)  # no start of theirs runs: nothing to wait for


class IdleSignal:
    """Pulsed when a backend's last request ends: starts waiting for an equal's turn plan
    again at once (no poll delay added to a switch)."""

    def __init__(self) -> None:
        # The next pulse's event, made by its first waiter: a pulse nobody waits for (the
        # end of every request's last lease) makes nothing.
        self._event: asyncio.Event | None = None

    def pulse(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self, timeout_s: float) -> None:
        """Until the next pulse, at most `timeout_s`."""
        if self._event is None:
            self._event = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)
