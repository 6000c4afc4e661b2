"""What to evict to free N MiB on some GPUs, and who holds the memory. Pure: no I/O.

Rules (issue: VRAM admission and eviction):
- only lazy backends are evicted; pinned ones never make room for another model;
- only backends below a priority ceiling (a backend evicts lower priorities only; a zone
  may name its own ceiling);
- idle backends go first, then lower priority, then the longest idle; a busy backend is
  evicted only when idle ones do not suffice (its stop drains before it stops);
- nothing is evicted unless the whole need can be met: a refusal leaves everything running;
- a backend inside its `min_resident_s` is not evicted for another backend's start; when
  only such backends stand in the way, the plan says how long until it fits (`wait_s`), so
  admission waits instead of refusing. Zones and the yield force past it (`force`);
- picks that turn out unnecessary once later picks are in are dropped again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class Resident:
    """A backend that holds VRAM now."""

    name: str
    gpus: tuple[int, ...]
    vram_mib: int
    priority: int
    lazy: bool
    in_flight: int = 0
    idle_s: float = 0.0
    evictable: bool = True  # False while it is starting or stopping
    # Seconds of its `min_resident_s` left: until then only a forced plan evicts it.
    protected_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Placement:
    fits: bool
    evict: tuple[str, ...] = ()
    # GPU -> MiB still missing after every allowed eviction (only when it does not fit).
    short_mib: Mapping[int, int] = field(default_factory=dict)
    # Does not fit only because residents inside their min_resident_s hold the memory: in
    # `wait_s` seconds it fits by evicting them (`protected`, those protected now).
    wait_s: float | None = None
    protected: tuple[str, ...] = ()


def plan_eviction(
    need_mib: Mapping[int, int],
    free_mib: Mapping[int, int],
    residents: Sequence[Resident],
    *,
    below_priority: int | None = None,
    force: bool = False,
) -> Placement:
    """Choose backends to stop so each GPU in `need_mib` has that much free.

    `free_mib` is what admission may count as free now; `below_priority=None` allows any
    priority (zones for outside workloads), else only residents with a lower priority.
    `force` (zones, the yield) evicts residents inside their `min_resident_s` too.
    """
    deficit = {gpu: need - free_mib.get(gpu, 0) for gpu, need in need_mib.items()}
    if all(d <= 0 for d in deficit.values()):
        return Placement(fits=True)

    candidates = sorted(
        (
            r
            for r in residents
            if r.lazy
            and r.evictable
            and (below_priority is None or r.priority < below_priority)
            and any(g in deficit for g in r.gpus)
        ),
        key=lambda r: (r.in_flight > 0, r.priority, -r.idle_s, r.name),
    )
    if force:
        return _pick(deficit, candidates)
    plan = _pick(deficit, [r for r in candidates if r.protected_s <= 0])
    if plan.fits:
        return plan
    # The earliest moment enough protections have ended; a plan then, computed now, is
    # only a promise: admission plans again when it comes.
    for wait_s in sorted({r.protected_s for r in candidates if r.protected_s > 0}):
        later = _pick(deficit, [r for r in candidates if r.protected_s <= wait_s])
        if later.fits:
            protected = {r.name for r in candidates if r.protected_s > 0}
            names = tuple(n for n in later.evict if n in protected)
            return replace(plan, wait_s=wait_s, protected=names)
    return plan


def _pick(deficit: Mapping[int, int], candidates: Sequence[Resident]) -> Placement:
    """Evict `candidates` in their order until no GPU lacks memory; then drop the picks
    that turned out unnecessary."""
    deficit = dict(deficit)
    picked: list[Resident] = []
    for resident in candidates:
        if all(d <= 0 for d in deficit.values()):
            break
        if not any(deficit.get(g, 0) > 0 for g in resident.gpus):
            continue
        picked.append(resident)
        for gpu in resident.gpus:
            if gpu in deficit:
                deficit[gpu] -= resident.vram_mib

    short = {gpu: d for gpu, d in deficit.items() if d > 0}
    if short:
        return Placement(fits=False, short_mib=short)

    # Drop picks made redundant by later ones, least preferred victims first.
    for resident in reversed(list(picked)):
        without = {
            gpu: d + (resident.vram_mib if gpu in resident.gpus else 0)
            for gpu, d in deficit.items()
        }
        if all(d <= 0 for d in without.values()):
            picked.remove(resident)
            deficit = without
    return Placement(fits=True, evict=tuple(r.name for r in picked))


@dataclass(frozen=True, slots=True)
class Holder:
    """Something the gateway knows occupies VRAM on a GPU."""

    label: str  # "backend reasoning" or "zone comfy (holder comfyui)"
    mib: int
    note: str = ""  # why it was not evicted: "pinned", "priority 60", "busy", ...


def describe_holders(gpu: str, total_mib: int, used_mib: int, holders: Sequence[Holder]) -> str:
    """One line saying what holds a GPU's memory (`gpu`: its name, `node-c GPU 0`), for
    refusals (503/409) and logs."""
    known = sum(h.mib for h in holders)
    parts = [
        f"{h.label} {h.mib} MiB" + (f" ({h.note})" if h.note else "")
        for h in sorted(holders, key=lambda h: -h.mib)
    ]
    other = used_mib - known
    if other > 0:
        parts.append(f"other processes {other} MiB")
    held = ", ".join(parts) if parts else "nothing the gateway knows of"
    return f"{gpu}: {used_mib} of {total_mib} MiB in use: {held}"
