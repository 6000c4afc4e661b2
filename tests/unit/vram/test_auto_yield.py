"""The automatic yield's policy, from readings alone (no loop, no GPU)."""

from __future__ import annotations

from app.settings import AutoYieldConfig
from app.vram.auto_yield import REASON, AutoYieldPolicy, Decision
from app.vram.zones import Hold, Zone

CONFIG = AutoYieldConfig(enabled=True, foreign_mib=2000, settle_s=10, restore_after_s=30)


def held(granted_at: float, gpu: int = 0, holders: tuple[str, ...] = (REASON,)) -> Zone:
    zone = Zone("yield", holders[0], gpu, 20000, granted_at, None, ("a",), kind="yield")
    return zone.with_holds(tuple(Hold(h, granted_at + i, None) for i, h in enumerate(holders)))


def test_foreign_memory_must_stay_above_the_threshold_for_settle_s() -> None:
    policy = AutoYieldPolicy(CONFIG)
    assert policy.decide(0.0, {0: 5000}, None) is None
    assert policy.decide(5.0, {0: 1500}, None) is None  # a spike that went away
    assert policy.decide(6.0, {0: 5000}, None) is None  # counting again from here
    assert policy.decide(15.9, {0: 5000}, None) is None
    assert policy.decide(16.0, {0: 5000}, None) == Decision("yield", 0, 5000)


def test_its_own_yield_is_restored_after_restore_after_s_below() -> None:
    policy = AutoYieldPolicy(CONFIG)
    zone = held(granted_at=100.0)
    policy.took(zone)
    assert policy.decide(20.0, {0: 9000}, zone) is None  # the game still runs
    assert policy.decide(21.0, {0: 100}, zone) is None  # it ended: wait restore_after_s
    assert policy.decide(40.0, {0: 4000}, zone) is None  # back again: start over
    assert policy.decide(41.0, {0: 0}, zone) is None
    assert policy.decide(71.0, {0: 0}, zone) == Decision("restore", 0, 0)


def test_a_yield_a_person_asked_for_is_never_undone() -> None:
    policy = AutoYieldPolicy(CONFIG)
    theirs = held(granted_at=50.0)
    for now in (0.0, 100.0, 1000.0):
        assert policy.decide(now, {0: 0}, theirs) is None


def test_its_yield_restored_by_a_person_is_forgotten() -> None:
    policy = AutoYieldPolicy(CONFIG)
    policy.took(held(granted_at=100.0))
    assert policy.decide(1.0, {0: 0}, None) is None  # restored by hand
    later = held(granted_at=200.0)  # then a person yields
    assert policy.decide(100.0, {0: 0}, later) is None
    assert policy.decide(1000.0, {0: 0}, later) is None


def test_each_gpu_is_watched_on_its_own() -> None:
    policy = AutoYieldPolicy(CONFIG)
    assert policy.decide(0.0, {0: 100, 1: 8000}, None) is None
    assert policy.decide(10.0, {0: 100, 1: 8000}, None) == Decision("yield", 1, 8000)


def test_its_yield_a_person_holds_on_to_is_theirs_once_it_let_go() -> None:
    """Issue 33: its restore ends its own hold; a person's hold keeps the yield, which
    is then never undone here."""
    policy = AutoYieldPolicy(CONFIG)
    both = held(granted_at=100.0, holders=(REASON, "game"))
    policy.took(both)
    assert policy.decide(0.0, {0: 0}, both) is None
    assert policy.decide(30.0, {0: 0}, both) == Decision("restore", 0, 0)
    theirs = both.with_holds(tuple(h for h in both.holds if h.holder == "game"))
    assert theirs.granted_at == both.granted_at  # the same yield, held on by the person
    for now in (31.0, 100.0, 1000.0):
        assert policy.decide(now, {0: 0}, theirs) is None
