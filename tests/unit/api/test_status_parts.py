"""The parts `/status` gives a bar add up, from one reading: what the page draws and
what it writes beside the bar cannot contradict each other."""

from __future__ import annotations

from app.api.views import host_ram_view, idle_action, ram_parts
from app.settings import ReleaseConfig
from app.vram.host_ram import HostRamView, SleeperView


def ram(total: int | None, available: int | None, *charges: int) -> HostRamView:
    sleepers = tuple(
        SleeperView(backend=f"s{i}", charged_mib=c, charged_from="vram_mib", pending=False)
        for i, c in enumerate(charges)
    )
    return HostRamView(
        host="local", probe="meminfo", up=total is not None, error=None, age_s=0.5,
        total_mib=total, available_mib=available,
        total_bytes=None if total is None else total << 20,
        available_bytes=None if available is None else available << 20,
        budget_mib=12000, budget_from="sleep_budget_mib", reserve_mib=0,
        charged_mib=sum(charges), sleepers=sleepers,
    )  # fmt: skip


def test_a_sleeper_charged_more_than_is_used_is_drawn_within_the_machines_ram() -> None:
    """The issue's case: a sleeper charged 11,000 MiB on a machine that shows 1,900 used
    (its copy not in MemAvailable yet): 'other 0 MiB' and parts beyond the RAM, before."""
    view = host_ram_view(ram(24105, 22205, 11000))
    assert view["used_mib"] == 1900
    assert view["other_mib"] >= 0
    sleeper = view["sleepers"][0]
    assert sleeper["charged_mib"] == 11000  # the budget's figure stays as it is
    parts = sleeper["in_use_mib"] + view["other_mib"] + view["available_mib"]
    assert parts == view["total_mib"]


def test_the_parts_add_up_whatever_the_charges() -> None:
    for total, available, charges in [
        (24105, 10000, [3000, 2000]),  # charges within what is used: other is the rest
        (24105, 10000, [9000, 9000]),  # beyond it: the second is cut
        (24105, 24105, [500]),  # nothing used
        (1000, 2000, []),  # a reading with more available than total (clamped)
    ]:
        used, in_use, other = ram_parts(total, available, charges)
        assert used is not None
        assert other is not None
        assert other >= 0
        assert all(
            part is not None and 0 <= part <= c for part, c in zip(in_use, charges, strict=True)
        )
        assert sum(p or 0 for p in in_use) + other + min(available, total) == total
    assert ram_parts(24105, 10000, [3000, 2000]) == (14105, [3000, 2000], 9105)


def test_without_a_reading_there_are_no_parts() -> None:
    view = host_ram_view(ram(None, None, 4000))
    assert view["used_mib"] is None
    assert view["other_mib"] is None
    assert view["sleepers"][0]["in_use_mib"] is None


def test_the_idle_action_says_sleep_for_a_backend_that_will_sleep() -> None:
    """The page's countdown says 'idle sleep in' from this, not 'idle stop' for all."""
    sleep, auto, stop = (ReleaseConfig(method=m) for m in ("sleep", "auto", "stop"))
    assert idle_action(sleep, sleeps=True, managed=True) == "sleep"
    assert idle_action(auto, sleeps=True, managed=True) == "sleep"  # level 1, else 2
    assert idle_action(ReleaseConfig(method="auto", level=1), sleeps=True, managed=True) == (
        "sleep or stop"
    )
    assert idle_action(auto, sleeps=False, managed=True) == "stop"  # no sleep mode
    assert idle_action(sleep, sleeps=False, managed=True) == "stop"
    assert idle_action(stop, sleeps=True, managed=True) == "stop"
    assert idle_action(sleep, sleeps=True, managed=False) == "stop"
