"""Eviction planning and the holders line: pure functions, plain data."""

from __future__ import annotations

import pytest

from app.vram.placement import Holder, Placement, Resident, describe_holders, plan_eviction


def lazy(
    name: str,
    mib: int,
    *,
    priority: int = 50,
    idle_s: float = 0.0,
    in_flight: int = 0,
    gpus: tuple[int, ...] = (0,),
    protected_s: float = 0.0,
) -> Resident:
    return Resident(
        name=name,
        gpus=gpus,
        vram_mib=mib,
        priority=priority,
        lazy=True,
        in_flight=in_flight,
        idle_s=idle_s,
        protected_s=protected_s,
    )


def test_fits_without_evicting_anything() -> None:
    plan = plan_eviction({0: 8000}, {0: 8000}, [lazy("a", 16000)])
    assert plan == Placement(fits=True)


def test_evicts_only_what_is_needed() -> None:
    residents = [lazy("a", 8000, priority=10), lazy("b", 8000, priority=20)]
    plan = plan_eviction({0: 10000}, {0: 4000}, residents)
    assert plan == Placement(fits=True, evict=("a",))


def test_an_idle_backend_goes_before_a_busy_one_of_lower_priority() -> None:
    residents = [
        lazy("busy-low", 8000, priority=1, in_flight=3),
        lazy("idle-high", 8000, priority=90, idle_s=1.0),
    ]
    plan = plan_eviction({0: 8000}, {0: 0}, residents)
    assert plan.evict == ("idle-high",)


def test_a_busy_backend_is_evicted_when_idle_ones_do_not_suffice() -> None:
    residents = [lazy("busy", 8000, in_flight=1), lazy("idle", 4000, idle_s=5.0)]
    plan = plan_eviction({0: 12000}, {0: 0}, residents)
    assert plan.fits
    assert set(plan.evict) == {"busy", "idle"}


def test_lower_priority_goes_first_among_idle_backends() -> None:
    residents = [
        lazy("high", 8000, priority=40, idle_s=100.0),
        lazy("low", 8000, priority=10, idle_s=1.0),
    ]
    plan = plan_eviction({0: 8000}, {0: 0}, residents)
    assert plan.evict == ("low",)


def test_the_longest_idle_goes_first_at_equal_priority() -> None:
    residents = [
        lazy("recent", 8000, idle_s=5.0),
        lazy("oldest", 8000, idle_s=500.0),
        lazy("middle", 8000, idle_s=50.0),
    ]
    plan = plan_eviction({0: 8000}, {0: 0}, residents)
    assert plan.evict == ("oldest",)


def test_never_evicts_pinned_or_unevictable_backends() -> None:
    residents = [
        Resident("pinned", (0,), 16000, priority=0, lazy=False),
        Resident("starting", (0,), 16000, priority=0, lazy=True, evictable=False),
        lazy("small", 4000, priority=90),
    ]
    plan = plan_eviction({0: 8000}, {0: 0}, residents)
    assert plan == Placement(fits=False, short_mib={0: 4000})


def test_the_priority_ceiling_excludes_equal_and_higher_priorities() -> None:
    residents = [lazy("equal", 8000, priority=50), lazy("higher", 8000, priority=60)]
    refused = plan_eviction({0: 8000}, {0: 0}, residents, below_priority=50)
    assert refused == Placement(fits=False, short_mib={0: 8000})
    allowed = plan_eviction({0: 8000}, {0: 0}, residents, below_priority=51)
    assert allowed == Placement(fits=True, evict=("equal",))


def test_no_priority_ceiling_allows_any_priority() -> None:
    residents = [lazy("top", 8000, priority=1000)]
    plan = plan_eviction({0: 8000}, {0: 0}, residents, below_priority=None)
    assert plan == Placement(fits=True, evict=("top",))


def test_refuses_without_evicting_when_all_candidates_are_not_enough() -> None:
    residents = [lazy("a", 4000), lazy("b", 4000), Resident("pinned", (0,), 12000, 0, lazy=False)]
    plan = plan_eviction({0: 12000}, {0: 2000}, residents)
    assert plan.fits is False
    assert plan.evict == ()
    assert plan.short_mib == {0: 2000}  # 12000 needed - 2000 free - 8000 evictable


def test_short_mib_names_only_the_gpus_that_stay_short() -> None:
    residents = [lazy("on0", 8000, gpus=(0,))]
    plan = plan_eviction({0: 8000, 1: 8000}, {0: 0, 1: 5000}, residents)
    assert plan == Placement(fits=False, short_mib={1: 3000})


def test_a_multi_gpu_need_evicts_on_every_gpu() -> None:
    residents = [
        lazy("on0", 8000, gpus=(0,), priority=10),
        lazy("on1", 8000, gpus=(1,), priority=10),
        lazy("elsewhere", 8000, gpus=(2,), priority=0),
    ]
    plan = plan_eviction({0: 8000, 1: 8000}, {0: 0, 1: 0, 2: 0}, residents)
    assert plan.fits
    assert set(plan.evict) == {"on0", "on1"}


def test_a_backend_on_two_gpus_frees_both() -> None:
    residents = [
        lazy("wide", 8000, gpus=(0, 1), priority=10),
        lazy("on1", 8000, gpus=(1,), priority=20),
    ]
    plan = plan_eviction({0: 8000, 1: 8000}, {0: 0, 1: 0}, residents)
    assert plan == Placement(fits=True, evict=("wide",))


def test_a_multi_gpu_need_is_refused_when_one_gpu_stays_short() -> None:
    residents = [lazy("on0", 8000, gpus=(0,)), Resident("pinned1", (1,), 8000, 0, lazy=False)]
    plan = plan_eviction({0: 8000, 1: 8000}, {0: 0, 1: 0}, residents)
    assert plan == Placement(fits=False, short_mib={1: 8000})


def test_residents_on_other_gpus_are_not_evicted() -> None:
    residents = [lazy("on1", 16000, gpus=(1,), priority=0), lazy("on0", 8000, priority=90)]
    plan = plan_eviction({0: 8000}, {0: 0, 1: 0}, residents)
    assert plan.evict == ("on0",)


def test_a_small_pick_made_redundant_by_a_later_big_one_is_dropped() -> None:
    # "small" is preferred (lower priority) but not enough; "big" alone is.
    residents = [lazy("small", 2000, priority=10), lazy("big", 12000, priority=20)]
    plan = plan_eviction({0: 10000}, {0: 0}, residents)
    assert plan == Placement(fits=True, evict=("big",))


def test_picks_that_are_all_needed_are_kept() -> None:
    residents = [lazy("a", 3000, priority=10), lazy("b", 3000, priority=20)]
    plan = plan_eviction({0: 6000}, {0: 0}, residents)
    assert plan == Placement(fits=True, evict=("a", "b"))


# -- min_resident_s -------------------------------------------------------------------------


def test_a_protected_resident_is_not_evicted_while_another_one_suffices() -> None:
    residents = [
        lazy("protected", 8000, priority=10, idle_s=100.0, protected_s=30.0),
        lazy("free", 8000, priority=20),
    ]
    plan = plan_eviction({0: 8000}, {0: 0}, residents)
    assert plan == Placement(fits=True, evict=("free",))


def test_only_protected_residents_in_the_way_means_wait_until_the_protection_ends() -> None:
    residents = [lazy("a", 16000, priority=10, protected_s=12.5)]
    plan = plan_eviction({0: 16000}, {0: 8000}, residents, below_priority=50)
    assert plan == Placement(fits=False, short_mib={0: 8000}, wait_s=12.5, protected=("a",))


def test_the_wait_is_until_enough_protections_have_ended_not_the_last_one() -> None:
    # "late" would be picked first (lower priority), but "early" alone is enough at 3 s.
    residents = [
        lazy("late", 8000, priority=10, protected_s=60.0),
        lazy("early", 8000, priority=20, protected_s=3.0),
        lazy("unprotected", 4000, priority=30),
    ]
    plan = plan_eviction({0: 12000}, {0: 0}, residents)
    assert (plan.fits, plan.wait_s, plan.protected) == (False, 3.0, ("early",))
    assert plan.short_mib == {0: 8000}  # what is missing now


def test_a_wait_that_needs_two_protections_to_end_waits_for_the_later() -> None:
    residents = [lazy("a", 8000, protected_s=5.0), lazy("b", 8000, protected_s=20.0)]
    plan = plan_eviction({0: 16000}, {0: 0}, residents, below_priority=60)
    assert (plan.wait_s, set(plan.protected)) == (20.0, {"a", "b"})


def test_no_wait_is_offered_when_even_the_end_of_every_protection_is_not_enough() -> None:
    residents = [
        lazy("a", 8000, protected_s=5.0),
        Resident("pinned", (0,), 16000, priority=0, lazy=False),
    ]
    plan = plan_eviction({0: 16000}, {0: 0}, residents)
    assert plan == Placement(fits=False, short_mib={0: 16000})


def test_protection_does_not_lift_the_priority_ceiling() -> None:
    residents = [lazy("equal", 16000, priority=50, protected_s=5.0)]
    plan = plan_eviction({0: 16000}, {0: 0}, residents, below_priority=50)
    assert plan == Placement(fits=False, short_mib={0: 16000})


def test_a_forced_plan_evicts_protected_residents_at_once() -> None:
    residents = [lazy("a", 8000, priority=10, protected_s=300.0), lazy("b", 8000, priority=20)]
    plan = plan_eviction({0: 16000}, {0: 0}, residents, below_priority=None, force=True)
    assert plan == Placement(fits=True, evict=("a", "b"))


@pytest.mark.parametrize(
    ("holders", "used", "expected"),
    [
        (
            [Holder("backend small", 4000), Holder("backend orchestrator", 16000, "pinned")],
            20000,
            "GPU 0: 20000 of 24000 MiB in use: backend orchestrator 16000 MiB (pinned), "
            "backend small 4000 MiB",
        ),
        (
            [Holder("zone comfy (holder comfyui)", 6000)],
            9000,
            "GPU 0: 9000 of 24000 MiB in use: zone comfy (holder comfyui) 6000 MiB, "
            "other processes 3000 MiB",
        ),
        ([], 5000, "GPU 0: 5000 of 24000 MiB in use: other processes 5000 MiB"),
        ([], 0, "GPU 0: 0 of 24000 MiB in use: nothing the gateway knows of"),
    ],
)
def test_describe_holders(holders: list[Holder], used: int, expected: str) -> None:
    assert describe_holders("GPU 0", 24000, used, holders) == expected


def test_describe_holders_mentions_no_other_processes_when_holders_account_for_all() -> None:
    line = describe_holders("GPU 1", 24000, 8000, [Holder("backend a", 8000)])
    assert line == "GPU 1: 8000 of 24000 MiB in use: backend a 8000 MiB"
    assert "other processes" not in line
