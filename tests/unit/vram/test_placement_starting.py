"""A backend still starting holds its memory (admitted, not ready yet) and is not evicted;
when the need would be met once such starts end, the plan names them (`starting`) so the
start waits for them and plans again, instead of being refused (issue 31, 3). Pure."""

from __future__ import annotations

from dataclasses import replace

from app.vram.placement import Placement, Resident, plan_eviction
from app.vram.residency import turn_text
from tests.unit.vram.test_placement_turns import lazy


def starting(name: str, mib: int = 11000, **fields: object) -> Resident:
    return replace(lazy(name, mib), evictable=False, starting=True, **fields)  # type: ignore[arg-type]


def start(
    residents: list[Resident], *, need: int = 11000, free: int = 5000, priority: int = 50
) -> Placement:
    return plan_eviction(
        {0: need}, {0: free}, residents, below_priority=priority, equal_priority=priority
    )


def test_an_equal_still_starting_is_waited_for_not_refused() -> None:
    plan = start([starting("turn-b")])
    assert not plan.fits
    assert plan.evict == ()
    assert plan.starting == ("turn-b",)
    assert plan.wait_s is None


def test_a_lower_priority_start_under_way_is_waited_for_too() -> None:
    plan = start([starting("low", priority=10)])
    assert plan.starting == ("low",)


def test_a_start_under_way_that_could_not_be_evicted_once_ready_is_not_waited_for() -> None:
    higher = start([starting("high", priority=90)])
    pinned = start([replace(starting("pinned"), lazy=False)])
    for plan in (higher, pinned):
        assert not plan.fits
        assert plan.starting == ()  # refused at once, as when it is ready
        assert plan.short_mib == {0: 6000}


def test_nothing_is_waited_for_when_an_eviction_makes_room_now() -> None:
    plan = start([starting("turn-b", 6000), lazy("idle", 6000, idle_s=5.0)], free=5000)
    assert plan.fits
    assert plan.evict == ("idle",)
    assert plan.starting == ()


def test_a_protection_is_waited_out_before_a_start_under_way_is() -> None:
    residents = [starting("turn-b", 6000), lazy("protected", 6000, protected_s=3.0)]
    plan = start(residents, free=5000)
    assert plan.wait_s == 3.0
    assert plan.protected == ("protected",)
    assert plan.starting == ()


def test_only_the_starts_under_way_the_need_takes_are_named() -> None:
    residents = [starting("big", 11000), starting("small", 2000), lazy("idle", 2000)]
    plan = start(residents, free=0, need=13000)
    assert plan.starting == ("big",)  # with idle evicted: 2000 + 11000


def test_starts_under_way_that_would_not_make_room_either_are_not_waited_for() -> None:
    plan = start([starting("turn-b", 3000)], free=5000, need=11000)
    assert not plan.fits
    assert plan.starting == ()
    assert plan.short_mib == {0: 6000}


def test_a_zone_forces_past_protections_but_does_not_wait_for_starts() -> None:
    plan = plan_eviction({0: 11000}, {0: 5000}, [starting("turn-b")], force=True)
    assert not plan.fits
    assert plan.starting == ()


def test_the_words_for_a_start_waiting_its_turn() -> None:
    assert turn_text([("turn-b's start", ["GPU 0"])]) == "waiting for turn-b's start on GPU 0"
    assert (
        turn_text([("b's start", ["node-c GPU 0", "node-c GPU 1"]), ("zone comfy", ["GPU 1"])])
        == "waiting for b's start on node-c GPU 0 and node-c GPU 1, zone comfy on GPU 1"
    )
