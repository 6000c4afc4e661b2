"""Equals take turns ("Swap in seconds" item 1): a start evicts lazy backends of its own
priority when they are idle, least recently used first; a busy one only after its
`max_hold_s` (until then the plan says how long to wait); pinned ones never. Pure."""

from __future__ import annotations

from app.vram.placement import Placement, Resident, plan_eviction


def lazy(
    name: str,
    mib: int = 11000,
    *,
    priority: int = 50,
    idle_s: float = 0.0,
    in_flight: int = 0,
    protected_s: float = 0.0,
    hold_s: float = 0.0,
) -> Resident:
    return Resident(
        name=name,
        gpus=(0,),
        vram_mib=mib,
        priority=priority,
        lazy=True,
        in_flight=in_flight,
        idle_s=idle_s,
        protected_s=protected_s,
        hold_s=hold_s,
    )


def start(
    residents: list[Resident], *, need: int = 11000, free: int = 5000, priority: int = 50
) -> Placement:
    """The plan for a start of `priority` (it evicts lower ones and idle equals)."""
    return plan_eviction(
        {0: need}, {0: free}, residents, below_priority=priority, equal_priority=priority
    )


def test_an_idle_equal_is_evicted_for_a_start() -> None:
    plan = start([lazy("other", idle_s=3.0)])
    assert plan.fits
    assert plan.evict == ("other",)


def test_without_equal_priority_equals_are_still_kept_zones_and_callers_of_old() -> None:
    plan = plan_eviction({0: 11000}, {0: 5000}, [lazy("other", idle_s=3.0)], below_priority=50)
    assert not plan.fits
    assert plan.evict == ()


def test_the_least_recently_used_equal_goes_first() -> None:
    residents = [lazy("recent", 6000, idle_s=1.0), lazy("old", 6000, idle_s=90.0)]
    plan = start(residents, need=6000, free=0)
    assert plan.evict == ("old",)


def test_a_lower_priority_idle_backend_goes_before_an_idle_equal() -> None:
    residents = [lazy("equal", 6000, idle_s=90.0), lazy("lower", 6000, priority=10, idle_s=1.0)]
    plan = start(residents, need=6000, free=0)
    assert plan.evict == ("lower",)


def test_a_higher_priority_backend_is_never_evicted_even_idle() -> None:
    plan = start([lazy("higher", priority=60, idle_s=500.0)])
    assert not plan.fits
    assert plan.wait_s is None


def test_a_pinned_equal_is_never_evicted() -> None:
    pinned = Resident("pinned", (0,), 11000, priority=50, lazy=False, idle_s=500.0)
    plan = start([pinned])
    assert not plan.fits
    assert plan.wait_s is None


def test_a_busy_equal_inside_its_hold_makes_the_start_wait_for_its_turn() -> None:
    plan = start([lazy("busy", in_flight=2, hold_s=7.5)])
    assert not plan.fits
    assert plan.wait_s == 7.5
    assert plan.protected == ("busy",)
    assert plan.holding == ("busy",)


def test_a_busy_equal_past_its_hold_is_evicted_its_stop_drains() -> None:
    plan = start([lazy("busy", in_flight=2, hold_s=0.0)])
    assert plan.fits
    assert plan.evict == ("busy",)


def test_an_idle_equal_goes_before_a_busy_one_past_its_hold() -> None:
    residents = [lazy("busy", 6000, in_flight=1, idle_s=0.0), lazy("idle", 6000, idle_s=0.1)]
    plan = start(residents, need=6000, free=0)
    assert plan.evict == ("idle",)


def test_an_idle_equal_inside_min_resident_s_is_waited_for_not_held() -> None:
    plan = start([lazy("fresh", idle_s=1.0, protected_s=4.0)])
    assert not plan.fits
    assert plan.wait_s == 4.0
    assert plan.protected == ("fresh",)
    assert plan.holding == ()


def test_the_hold_applies_to_equals_only_a_lower_busy_backend_is_evicted_at_once() -> None:
    plan = start([lazy("lower", priority=10, in_flight=3, hold_s=30.0)])
    assert plan.fits
    assert plan.evict == ("lower",)


def test_a_busy_equal_waits_for_the_longer_of_its_hold_and_its_min_resident_s() -> None:
    plan = start([lazy("busy", in_flight=1, hold_s=2.0, protected_s=9.0)])
    assert plan.wait_s == 9.0
    assert plan.holding == ()  # the min_resident_s is what it waits for


def test_a_forced_plan_zones_ignore_holds() -> None:
    busy = lazy("busy", in_flight=1, hold_s=30.0)
    plan = plan_eviction({0: 11000}, {0: 5000}, [busy], equal_priority=None, force=True)
    assert plan.evict == ("busy",)
