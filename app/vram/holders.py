"""Who holds the GPUs' memory, as admission sees it: the backends that may be evicted
(`residents`, for `placement.plan_eviction`) and everything on a GPU with why it was not
evicted (`holders`, for the refusal's words). Reads state only."""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Mapping

from app.lifecycle.state import BackendState
from app.vram.placement import Holder, Resident
from app.vram.residency import hold_for_s, protected_for_s
from app.vram.tenant import Tenant
from app.vram.zones import Zone


def residents(
    backends: Iterable[Tenant], exclude: str | None = None, admitting: Collection[str] = ()
) -> list[Resident]:
    """The backends holding memory (a sleeping one: what it still holds), but `exclude`.
    A start under way is `starting` (waited for by a start that needs its memory) once
    admitted: not while admission still waits for room for it (`admitting`: a sleeper's
    wake, which holds its residue), as it may be waiting for the very start that would
    wait for it."""
    now = time.monotonic()
    return [
        Resident(
            name=b.name,
            gpus=tuple(b.memory.gpus),
            vram_mib=b.memory.counted_mib,
            priority=b.config.priority,
            # A client's keep_alive until unloaded pins it (app.lifecycle.floor).
            lazy=b.lazy and not math.isinf(b.requests.floor.left_s(now)),
            in_flight=b.requests.in_flight,
            idle_s=b.requests.idle_s(now),
            evictable=b.state in (BackendState.READY, BackendState.SLEEPING),
            starting=b.state is BackendState.STARTING and b.name not in admitting,
            protected_s=max(protected_for_s(b, now), _finite(b.requests.floor.left_s(now))),
            kept_s=_finite(b.requests.floor.left_s(now)),
            hold_s=hold_for_s(b, now),
        )
        for b in backends
        if b.memory.holds_vram and b.memory.counted_mib and b.name != exclude
    ]


def _finite(seconds: float) -> float:
    return 0.0 if math.isinf(seconds) else seconds


def holders(
    backends: Mapping[str, Tenant],
    zones: Iterable[Zone],
    gpu: int,
    below_priority: int | None,
    force: bool,
) -> list[Holder]:
    """What holds memory on `gpu`, each with why a start of priority `below_priority`
    (it evicts lower ones, and equals that are idle or past their hold) or (`force`) a
    zone below that ceiling (None: any) could not evict it."""
    found = []
    for r in residents(backends.values()):
        if gpu not in r.gpus:
            continue
        if not r.lazy:
            kept = backends[r.name].lazy  # lazy, pinned by a client's keep_alive: -1
            note = "a client's keep_alive, until unloaded" if kept else "pinned"
        elif below_priority is not None and (
            r.priority > below_priority or (force and r.priority == below_priority)
        ):
            note = f"priority {r.priority}, not below {below_priority}"
        elif below_priority is not None and r.priority == below_priority and r.busy:
            note = f"priority {r.priority} and busy" + (
                f", its turn ends in {math.ceil(r.hold_s)}s (max_hold_s)" if r.hold_s > 0 else ""
            )
        elif not r.evictable:
            note = "starting" if backends[r.name].state is BackendState.STARTING else "stopping"
        elif r.protected_s > 0 and not force:
            why = "a client's keep_alive" if r.protected_s == r.kept_s else "min_resident_s"
            note = f"{why}, {math.ceil(r.protected_s)}s more"
        else:
            note = ""
        asleep = backends[r.name].state is BackendState.SLEEPING
        found.append(Holder(f"backend {r.name}{' (asleep)' if asleep else ''}", r.vram_mib, note))
    found += [Holder(f"zone {z.name} (holder {z.holder})", z.mib) for z in zones if z.gpu == gpu]
    return found
