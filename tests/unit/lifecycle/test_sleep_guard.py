"""The sleep guard's rules (app.lifecycle.sleep_guard): pure, no loop."""

from __future__ import annotations

from app.lifecycle.sleep_guard import RECENT_CYCLES, GuardCause, SleepCycle, SleepHistory, leak_of


def cycle(n: int, freed: int | None, held: int | None = None) -> SleepCycle:
    return SleepCycle(cycle=n, level=1, freed_mib=freed, held_mib=held, at=0.0)


def test_a_leak_is_a_sleep_that_freed_more_than_the_threshold_less_than_the_first() -> None:
    first = cycle(1, 14000)
    assert leak_of(first, cycle(2, 13488), 512) is None  # 512 less: not past it
    leak = leak_of(first, cycle(3, 13487), 512)
    assert leak is not None
    assert (leak.growth_mib, leak.threshold_mib) == (513, 512)
    assert "grew 513 MiB" in leak.describe()
    assert "freed 14000 MiB then, 13487 at sleep 3" in leak.describe()


def test_no_leak_without_two_measured_sleeps_or_with_the_guard_off() -> None:
    first = cycle(1, 14000)
    assert leak_of(None, cycle(1, 1000), 512) is None  # no baseline
    assert leak_of(first, first, 512) is None  # the baseline itself
    assert leak_of(first, cycle(2, None), 512) is None  # not measured (a full GPU)
    assert leak_of(first, cycle(2, 0), 512) is None  # nothing seen freed: not measured
    assert leak_of(first, cycle(2, 1000), 0) is None  # sleep_leak_mib 0: never
    assert leak_of(first, cycle(2, 20000), 512) is None  # freed more: no growth


def test_the_history_keeps_the_first_measured_sleep_and_the_last_few() -> None:
    history = SleepHistory()
    history.record(level=1, freed_mib=None, held_mib=2000, at=1.0)  # not measured
    assert history.baseline is None
    second = history.record(level=1, freed_mib=14000, held_mib=2000, at=2.0)
    assert history.baseline is second
    assert history.growth_mib is None  # one measured sleep: nothing to compare
    for n in range(RECENT_CYCLES + 2):
        history.record(level=2, freed_mib=14000 - 100 * n, held_mib=2000 + 100 * n, at=3.0 + n)
    assert history.cycles == RECENT_CYCLES + 4
    assert len(history.recent) == RECENT_CYCLES
    assert history.baseline is second  # kept, though no longer among the recent
    assert history.growth_mib == 100 * (RECENT_CYCLES + 1)
    record = history.snapshot()
    assert (record.cycles, record.baseline, record.growth_mib) == (
        history.cycles,
        second,
        history.growth_mib,
    )


def test_a_cold_start_begins_again_but_the_last_trip_is_kept() -> None:
    history = SleepHistory()
    history.record(level=1, freed_mib=14000, held_mib=2000, at=1.0)
    trip = history.tripped(GuardCause.WAKE_FAILED, "wake from sleep failed (...)", at=2.0)
    history.started_cold()
    assert (history.cycles, history.baseline, list(history.recent)) == (0, None, [])
    assert history.last_trip is trip
    assert history.record(level=1, freed_mib=13000, held_mib=3000, at=3.0).cycle == 1
    assert history.baseline is not None
    assert history.baseline.freed_mib == 13000
