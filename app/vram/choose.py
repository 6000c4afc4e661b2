"""Where a start goes: the GPUs of a backend with `gpus: auto` (or a count, or Docker
placements), chosen at each start by its host's `gpu.placement:` policy. Pure: no I/O.

The candidates are every set of N GPUs of its host (N: its tensor-parallel size), or for
a Docker backend the sets its containers were created on. Each is planned as admission
plans a fixed one (`app.vram.placement.plan_eviction`: its footprint on each GPU of the
set, the usual eviction rules). Then, in this order:

1. a set that fits without evicting anything, by the policy:
   - `pack` (the default): the one with the least free memory that still fits (best fit;
     ties: the lowest GPUs), so whole GPUs stay free for a game or a big model;
   - `spread`: the one with the most free memory (on its fullest GPU), so models share
     no GPU while there is room;
2. a set that fits by evicting: one that evicts no busy backend before one that must
   (a busy victim's requests are drained), then where eviction frees most (the most free
   on its fullest GPU once the victims are gone and the start runs), then the lower
   highest priority among the victims, then fewer victims; on that set the victims are
   the usual rules' (idle first, lower priority, least recently used);
3. a set that fits once protections end (`min_resident_s`, a busy equal's turn, a
   client's keep_alive): the shortest wait; then one that may fit once starts under way
   end;
4. none: the set short the least, for the refusal's words.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from app.settings import BackendConfig
from app.vram.placement import Placement, Resident, plan_eviction

Policy = Literal["pack", "spread"]


@dataclass(frozen=True, slots=True)
class Choice:
    gpus: tuple[int, ...]
    plan: Placement  # admission's plan for it (fits, whom to evict, or why it cannot)
    why: str  # for /status and the events: "GPU 1: 18.2 GiB free, pack"


def candidate_sets(
    count: int, present: Sequence[int], placements: Sequence[tuple[int, ...]] | None = None
) -> list[tuple[int, ...]]:
    """Every set of `count` GPUs among `present` (sorted, lowest first), or the
    `placements` all of whose GPUs are present."""
    if placements is not None:
        here = set(present)
        return [tuple(sorted(p)) for p in placements if set(p) <= here]
    return list(itertools.combinations(sorted(present), count))


def gpu_sets(config: BackendConfig, present: Sequence[int] | None) -> list[tuple[int, ...]]:
    """The GPU sets a `gpus: auto` backend may start on, among the GPUs `present` (None:
    no reading): every set of its size, or its Docker placements."""
    runtime = config.runtime
    placements = runtime.placements if runtime.kind == "docker" else None
    made = None if placements is None else [tuple(p.gpus) for p in placements]
    return candidate_sets(config.gpu_count, present or [], made)


def choose(
    sets: Sequence[tuple[int, ...]],
    need_mib: int,
    free_mib: Mapping[int, int],
    residents: Sequence[Resident],
    *,
    policy: Policy,
    below_priority: int | None,
    equal_priority: int | None,
) -> Choice | None:
    """The set a start needing `need_mib` on each of its GPUs goes to (None: no set)."""
    plans = [
        (
            gpus,
            plan_eviction(
                dict.fromkeys(gpus, need_mib),
                free_mib,
                residents,
                below_priority=below_priority,
                equal_priority=equal_priority,
            ),
        )
        for gpus in sets
    ]
    if not plans:
        return None
    free = [(gpus, plan) for gpus, plan in plans if plan.fits and not plan.evict]
    if free:
        gpus, plan = min(free, key=lambda c: _by_policy(c[0], free_mib, policy))
        return Choice(gpus, plan, f"{_free_text(gpus, free_mib)}, {policy}")
    by_name = {r.name: r for r in residents}
    evicting = [(gpus, plan) for gpus, plan in plans if plan.fits]
    if evicting:
        gpus, plan = min(
            evicting, key=lambda c: _victims_cost(c[0], c[1], need_mib, free_mib, by_name)
        )
        after = _free_after(gpus, plan, need_mib, free_mib, by_name)
        return Choice(
            gpus,
            plan,
            f"{_gpus_text(gpus)}: room made by evicting {', '.join(plan.evict)} "
            f"({_gib(after)} GiB free after), {policy}",
        )
    waiting = [(gpus, plan) for gpus, plan in plans if plan.wait_s is not None]
    if waiting:
        gpus, plan = min(waiting, key=lambda c: (c[1].wait_s, c[0]))
        return Choice(gpus, plan, f"{_gpus_text(gpus)}: waiting {plan.wait_s:.0f}s for room")
    starting = [(gpus, plan) for gpus, plan in plans if plan.starting]
    if starting:
        gpus, plan = min(starting, key=lambda c: (len(c[1].starting), c[0]))
        return Choice(gpus, plan, f"{_gpus_text(gpus)}: waiting for {', '.join(plan.starting)}")
    gpus, plan = min(plans, key=lambda c: (sum(c[1].short_mib.values()), c[0]))
    return Choice(gpus, plan, f"{_gpus_text(gpus)}: does not fit")


def _by_policy(
    gpus: tuple[int, ...], free_mib: Mapping[int, int], policy: Policy
) -> tuple[int, int, tuple[int, ...]]:
    fullest = min(free_mib.get(g, 0) for g in gpus)
    total = sum(free_mib.get(g, 0) for g in gpus)
    if policy == "spread":
        return (-fullest, -total, gpus)
    return (fullest, total, gpus)


def _victims_cost(
    gpus: tuple[int, ...],
    plan: Placement,
    need_mib: int,
    free_mib: Mapping[int, int],
    by_name: Mapping[str, Resident],
) -> tuple[int, int, int, int, tuple[int, ...]]:
    victims = [by_name[name] for name in plan.evict]
    busy = sum(1 for v in victims if v.busy)
    top = max(v.priority for v in victims)
    after = _free_after(gpus, plan, need_mib, free_mib, by_name)
    return (busy, -after, top, len(victims), gpus)


def _free_after(
    gpus: tuple[int, ...],
    plan: Placement,
    need_mib: int,
    free_mib: Mapping[int, int],
    by_name: Mapping[str, Resident],
) -> int:
    """MiB left free on the fullest GPU of the set once the victims are gone and it runs."""
    freed = {g: sum(by_name[n].vram_mib for n in plan.evict if g in by_name[n].gpus) for g in gpus}
    return min(free_mib.get(g, 0) + freed[g] - need_mib for g in gpus)


def _gpus_text(gpus: tuple[int, ...]) -> str:
    return f"GPU {', '.join(map(str, gpus))}"


def _free_text(gpus: tuple[int, ...], free_mib: Mapping[int, int]) -> str:
    amounts = " and ".join(_gib(free_mib.get(g, 0)) for g in gpus)
    return f"{_gpus_text(gpus)}: {amounts} GiB free"


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f}"
