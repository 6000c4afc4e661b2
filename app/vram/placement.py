"""What to evict to free N MiB on some GPUs, and who holds the memory. Pure: no I/O.

Rules (issue: VRAM admission and eviction; "Swap in seconds" item 1):
- only lazy (and standby) backends are evicted; pinned ones never make room for another
  model;
- only backends below a priority ceiling (a backend evicts lower priorities; a zone
  may name its own ceiling); with `equal_priority`, a start also evicts backends of its
  own priority, but only idle ones (nothing in flight): equals take turns. A busy equal
  keeps the GPU while its requests come, up to its `max_hold_s` from its ready (its
  `hold_s` left): until then the start waits (`wait_s`, like `min_resident_s`; the
  arbiter plans again as soon as it goes idle), after it the equal is evicted like a
  lower one (its stop drains: its batch is served, later requests wait for its turn);
- idle backends go first, then lower priority, then the longest idle (least recently
  used); a busy backend is evicted only when idle ones do not suffice (its stop drains
  before it stops);
- nothing is evicted unless the whole need can be met: a refusal leaves everything running;
- a backend inside its `min_resident_s` is not evicted for another backend's start; when
  only such backends stand in the way, the plan says how long until it fits (`wait_s`), so
  admission waits instead of refusing. Zones and the yield force past it (`force`);
- a backend still starting (it holds its memory from its admission to its ready, health
  check and learning included) is not evicted; when the need would be met once such
  starts end (ready: evictable like the others, by these rules; failed: their memory
  free), the plan names them (`starting`) so admission waits for them and plans again,
  instead of refusing because a holder is mid-start. Never for a forced plan;
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
    starting: bool = False  # a start under way: not evictable until it ends
    # Seconds of its `min_resident_s` left: until then only a forced plan evicts it.
    protected_s: float = 0.0
    # Busy: seconds of its `max_hold_s` left, during which a start of equal priority waits
    # for it to go idle instead of evicting it (0: the hold is over, or it is idle).
    hold_s: float = 0.0
    # Of `protected_s`: a client's keep_alive floor (`app.lifecycle.floor`), when finite.
    kept_s: float = 0.0

    @property
    def busy(self) -> bool:
        return self.in_flight > 0


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
    # Of `protected`: busy equals inside their `max_hold_s` (the wait ends sooner when
    # they go idle); the others are inside their `min_resident_s`.
    holding: tuple[str, ...] = ()
    # Of `protected`: those a client's keep_alive keeps (rather than their min_resident_s).
    kept: tuple[str, ...] = ()
    # Does not fit now (nor by waiting out protections), but may once the starts of
    # these residents end: they hold memory it needs and are not evictable while starting.
    starting: tuple[str, ...] = ()


def plan_eviction(
    need_mib: Mapping[int, int],
    free_mib: Mapping[int, int],
    residents: Sequence[Resident],
    *,
    below_priority: int | None = None,
    equal_priority: int | None = None,
    force: bool = False,
) -> Placement:
    """Choose backends to stop so each GPU in `need_mib` has that much free.

    `free_mib` is what admission may count as free now; `below_priority=None` allows any
    priority (zones for outside workloads), else only residents with a lower priority,
    and (`equal_priority`, a backend's start: its own priority) equals when idle or past
    their hold. `force` (zones, the yield) evicts residents inside their `min_resident_s`
    too.
    """
    deficit = {gpu: need - free_mib.get(gpu, 0) for gpu, need in need_mib.items()}
    if all(d <= 0 for d in deficit.values()):
        return Placement(fits=True)

    def allowed(r: Resident) -> bool:
        if below_priority is None or r.priority < below_priority:
            return True
        return r.priority == equal_priority

    eligible = [
        _held(r, equal_priority) if r.priority == equal_priority else r
        for r in residents
        if r.lazy and allowed(r) and any(g in deficit for g in r.gpus)
    ]
    candidates = sorted(
        (r for r in eligible if r.evictable),
        key=lambda r: (r.busy, r.priority, -r.idle_s, r.name),
    )
    if force:
        return _pick(deficit, candidates)
    plan = _pick(deficit, [r for r in candidates if r.protected_s <= 0])
    if plan.fits:
        return plan
    plan = _after_protections(plan, deficit, candidates)
    if plan.wait_s is not None:
        return plan
    starting = [r for r in eligible if r.starting and not r.evictable]
    return _after_starts(plan, deficit, candidates, starting)


def _after_protections(
    plan: Placement, deficit: Mapping[int, int], candidates: Sequence[Resident]
) -> Placement:
    """`plan` (it does not fit), with when it would by evicting protected candidates."""
    # The earliest moment enough protections have ended; a plan then, computed now, is
    # only a promise: admission plans again when it comes.
    for wait_s in sorted({r.protected_s for r in candidates if r.protected_s > 0}):
        later = _pick(deficit, [r for r in candidates if r.protected_s <= wait_s])
        if later.fits:
            protected = {r.name for r in candidates if r.protected_s > 0}
            names = tuple(n for n in later.evict if n in protected)
            held = {r.name for r in candidates if r.busy and r.protected_s == r.hold_s > 0}
            holding = tuple(n for n in names if n in held)
            floors = {r.name for r in candidates if r.kept_s > 0 and r.protected_s == r.kept_s}
            kept = tuple(n for n in names if n in floors and n not in holding)
            return replace(plan, wait_s=wait_s, protected=names, holding=holding, kept=kept)
    return plan


def _after_starts(
    plan: Placement,
    deficit: Mapping[int, int],
    candidates: Sequence[Resident],
    starting: Sequence[Resident],
) -> Placement:
    """`plan` (it does not fit, even after protections), with the starts under way that
    hold what it lacks: once they end it may fit (whether they are then evicted now or
    after a protection is decided when admission plans again)."""
    if not starting:
        return plan
    later = _pick(deficit, [*candidates, *sorted(starting, key=lambda r: r.name)])
    names = {r.name for r in starting}
    waited = tuple(n for n in later.evict if n in names)
    return replace(plan, starting=waited) if later.fits and waited else plan


def _held(resident: Resident, equal_priority: int | None) -> Resident:
    """An equal's turn: while busy and inside its hold, it is protected like inside its
    `min_resident_s` (for the longer of the two)."""
    if resident.busy and resident.hold_s > 0:
        return replace(resident, protected_s=max(resident.protected_s, resident.hold_s))
    return resident


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
