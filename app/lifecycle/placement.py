"""What to evict to free N MiB on some GPUs, and who holds the memory. Pure: no I/O.

Rules (issue: VRAM admission and eviction):
- only lazy backends are evicted; pinned ones never make room for another model;
- only backends below a priority ceiling (a backend evicts lower priorities only; a zone
  may name its own ceiling);
- idle backends go first, then lower priority, then the longest idle; a busy backend is
  evicted only when idle ones do not suffice (its stop drains before it stops);
- nothing is evicted unless the whole need can be met: a refusal leaves everything running;
- picks that turn out unnecessary once later picks are in are dropped again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


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


@dataclass(frozen=True, slots=True)
class Placement:
    fits: bool
    evict: tuple[str, ...] = ()
    # GPU -> MiB still missing after every allowed eviction (only when it does not fit).
    short_mib: Mapping[int, int] = field(default_factory=dict)


def plan_eviction(
    need_mib: Mapping[int, int],
    free_mib: Mapping[int, int],
    residents: Sequence[Resident],
    *,
    below_priority: int | None = None,
) -> Placement:
    """Choose backends to stop so each GPU in `need_mib` has that much free.

    `free_mib` is what admission may count as free now; `below_priority=None` allows any
    priority (zones for outside workloads), else only residents with a lower priority.
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


def describe_holders(gpu: int, total_mib: int, used_mib: int, holders: Sequence[Holder]) -> str:
    """One line saying what holds a GPU's memory, for refusals (503/409) and logs."""
    known = sum(h.mib for h in holders)
    parts = [
        f"{h.label} {h.mib} MiB" + (f" ({h.note})" if h.note else "")
        for h in sorted(holders, key=lambda h: -h.mib)
    ]
    other = used_mib - known
    if other > 0:
        parts.append(f"other processes {other} MiB")
    held = ", ".join(parts) if parts else "nothing the gateway knows of"
    return f"GPU {gpu}: {used_mib} of {total_mib} MiB in use: {held}"
