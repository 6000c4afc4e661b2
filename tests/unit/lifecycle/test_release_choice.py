"""`choose_release`: sleep level 1 while the weights fit the host RAM budget, else level 2
or stop; the least recently used level-1 sleepers make room (pure, budget numbers)."""

from __future__ import annotations

import pytest

from app.lifecycle.release import (
    Candidate,
    RamState,
    Release,
    Sleeper,
    choose_release,
    ram_charge,
)
from app.settings import BackendConfig, ReleaseConfig
from app.settings.model_info import ModelInfoConfig

AUTO = ReleaseConfig()
AUTO_L1 = ReleaseConfig(method="auto", level=1)
SLEEP_L1 = ReleaseConfig(method="sleep")
SLEEP_L2 = ReleaseConfig(method="sleep", level=2)
STOP = ReleaseConfig(method="stop")


def me(charge: int | None = 3200, *, last_used: float = 100.0, sleep: bool = True) -> Candidate:
    return Candidate("me", charge, last_used, sleep_supported=sleep)


def ram(*sleepers: Sleeper, budget: int | None = 16384, available: int | None = None) -> RamState:
    return RamState(budget, 4096, available, sleepers)


def test_level_1_while_it_fits_the_budget_with_the_numbers_in_the_reason() -> None:
    release = choose_release(AUTO, me(), ram())
    assert release == Release(1, "sleep level 1: fits the host RAM budget (3,200 of 16,384 MiB)")
    # The other sleepers' charges count.
    release = choose_release(AUTO, me(), ram(Sleeper("a", 8000, 50.0)))
    assert release.level == 1
    assert "(11,200 of 16,384 MiB)" in release.reason


def test_the_least_recently_used_sleeper_is_stopped_to_make_room() -> None:
    sleepers = (Sleeper("old", 6000, 10.0), Sleeper("older", 6000, 5.0), Sleeper("new", 4000, 90))
    release = choose_release(AUTO, me(), ram(*sleepers))
    # 16,000 charged + 3,200 > 16,384: stopping "older" (6,000) is enough.
    assert release.level == 1
    assert release.make_room == ("older",)
    assert "(13,200 of 16,384 MiB) after stopping" in release.reason


def test_sleepers_used_more_recently_than_the_candidate_are_kept() -> None:
    # The candidate itself is the least recently used: it does not push out newer ones.
    release = choose_release(AUTO, me(last_used=1.0), ram(Sleeper("new", 15000, 90.0)))
    assert release == Release(2, "sleep level 2: host RAM budget full (18,200 of 16,384 MiB)")
    release = choose_release(AUTO_L1, me(last_used=1.0), ram(Sleeper("new", 15000, 90.0)))
    assert release == Release(None, "stop: host RAM budget full (18,200 of 16,384 MiB)")


def test_weights_larger_than_the_budget_never_sleep_at_level_1() -> None:
    release = choose_release(AUTO, me(20000), ram(Sleeper("a", 1000, 1.0)))
    assert release.level == 2
    assert release.make_room == ()
    assert "weights (20,000 MiB) exceed the host RAM budget (16,384 MiB)" in release.reason
    # An explicit level-1 sleep is deepened, not refused: it was asked to sleep.
    assert choose_release(SLEEP_L1, me(20000), ram()).level == 2
    assert choose_release(ReleaseConfig(level=1), me(20000), ram()).level is None


def test_the_reserve_keeps_mem_available_free() -> None:
    # Budget room, but only 6,000 MiB available: 6,000 - 3,200 < 4,096.
    release = choose_release(AUTO_L1, me(), ram(available=6000))
    assert release.level is None
    assert "host RAM reserve (6,000 MiB available, 3,200 MiB of weights, 4,096 MiB kept" in (
        release.reason
    )
    assert choose_release(AUTO, me(), ram(available=8000)).level == 1
    # A sleep under way is not in MemAvailable yet: it counts against it.
    pending = Sleeper("going", 2000, 1.0, pending=True)
    assert choose_release(AUTO_L1, me(), ram(pending, available=8000)).level is None
    # Stopping an older sleeper gives its RAM back to MemAvailable too.
    old = Sleeper("old", 2000, 1.0)
    release = choose_release(AUTO, me(), ram(old, available=6000))
    assert (release.level, release.make_room) == (1, ("old",))


def test_a_budget_of_zero_means_no_level_1() -> None:
    assert choose_release(AUTO, me(), ram(budget=0)).level == 2


@pytest.mark.parametrize(
    ("how", "candidate", "level", "reason"),
    [
        (STOP, me(), None, "stop: method stop"),
        (AUTO, me(sleep=False), None, "stop: no sleep mode"),
        (SLEEP_L2, me(), 2, "sleep level 2: method sleep, level 2"),
        (AUTO, Candidate("me", 1, 1.0, True, managed=False), None, "stop: not managed"),
    ],
)
def test_methods_that_do_not_look_at_the_budget(
    how: ReleaseConfig, candidate: Candidate, level: int | None, reason: str
) -> None:
    release = choose_release(how, candidate, ram(Sleeper("full", 16384, 1.0)))
    assert release.level == level
    assert release.reason.startswith(reason)
    assert release.make_room == ()


def test_unknown_weights_or_budget_auto_avoids_level_1_sleep_keeps_it() -> None:
    assert choose_release(AUTO, me(None), ram()).level == 2
    assert choose_release(AUTO, me(), ram(budget=None)).level == 2
    release = choose_release(SLEEP_L1, me(), ram(budget=None))
    assert release.level == 1
    assert "unknown host RAM" in release.reason
    assert choose_release(AUTO_L1, me(None), ram()).level is None


def test_its_own_charge_is_not_counted_twice() -> None:
    # A backend found asleep and asked again is one of the sleepers already.
    release = choose_release(AUTO, me(10000), ram(Sleeper("me", 10000, 1.0)))
    assert release.level == 1
    assert "(10,000 of 16,384 MiB)" in release.reason


def test_the_charge_is_the_measured_load_else_the_planners_weights_else_vram_mib() -> None:
    backend = BackendConfig.model_validate(
        {"url": "http://127.0.0.1:1", "models": ["m"], "vram_mib": 1000, "gpus": [0, 1]}
    )
    assert ram_charge(None, backend) == (2000, "vram_mib")  # on each of its GPUs
    assert ram_charge(3 * 1024**3 + 1, backend) == (3073, "measured")  # rounded up
    described = backend.model_copy(
        update={"model_info": ModelInfoConfig(layers=32, kv_heads=8, head_dim=128, weights_gib=2.5)}
    )
    assert ram_charge(None, described) == (2560, "model")
    assert ram_charge(None, backend.model_copy(update={"vram_mib": None})) == (None, None)
