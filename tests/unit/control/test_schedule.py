"""The pure schedule function (`app.control.schedule.schedule_at`) and the checks of
`schedules:` (`app.settings.schedules`): windows across midnight, weekdays, DST changes
(zoneinfo), the overlap rule."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from app.control.schedule import next_edge, schedule_at, window_at
from app.settings.schedules import ScheduleWindow
from tests.fakes.servers import gateway_settings

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def window(**fields: Any) -> ScheduleWindow:
    base = {"name": "w", "days": ["fri"], "from": "22:00", "to": "06:00", "action": "yield"}
    return ScheduleWindow.model_validate({**base, **fields})


def local(text: str, tz: zoneinfo.ZoneInfo = BERLIN, fold: int = 0) -> float:
    """Unix seconds of a wall-clock time in `tz`."""
    return datetime.fromisoformat(text).replace(tzinfo=tz, fold=fold).timestamp()


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# 2025-01-10 is a Friday.


def test_a_window_across_midnight_runs_into_the_next_day() -> None:
    night = window()
    before = window_at(night, local("2025-01-10T21:00"), BERLIN)
    assert (before.active, before.next_edge_at) == (False, local("2025-01-10T22:00"))
    inside = window_at(night, local("2025-01-11T03:00"), BERLIN)  # Saturday morning
    assert (inside.active, inside.next_edge_at) == (True, local("2025-01-11T06:00"))
    assert inside.active_since == local("2025-01-10T22:00")
    after = window_at(night, local("2025-01-11T06:00"), BERLIN)  # the end is not inside
    assert (after.active, after.next_edge_at) == (False, local("2025-01-17T22:00"))


def test_only_the_listed_days_begin_a_window() -> None:
    night = window()
    thursday = window_at(night, local("2025-01-09T23:00"), BERLIN)
    assert thursday.active is False
    # Friday night's Saturday morning is the window; Saturday night is not.
    assert window_at(night, local("2025-01-12T03:00"), BERLIN).active is False
    weekdays = window(days=["mon", "wed"], **{"from": "09:00", "to": "17:00"})
    tuesday = window_at(weekdays, local("2025-01-07T10:00"), BERLIN)
    assert (tuesday.active, tuesday.next_edge_at) == (False, local("2025-01-08T09:00"))
    assert window_at(weekdays, local("2025-01-08T16:59"), BERLIN).active is True


def test_a_whole_day_and_back_to_back_days_are_one_window() -> None:
    days = window(days=["sat", "sun"], **{"from": "00:00", "to": "24:00"})
    saturday = window_at(days, local("2025-01-11T12:00"), BERLIN)
    assert (saturday.active, saturday.next_edge_at) == (True, local("2025-01-13T00:00"))


def test_the_soonest_edge_of_all_windows_is_next() -> None:
    states = schedule_at(
        [window(name="a"), window(name="b", days=["mon"], **{"from": "08:00", "to": "09:00"})],
        local("2025-01-10T12:00"),
        BERLIN,
    )
    assert [s.window.name for s in states] == ["a", "b"]
    assert next_edge(states) == local("2025-01-10T22:00")
    assert next_edge([]) is None


def test_spring_forward_keeps_wall_clock_times() -> None:
    """2025-03-30 in Berlin: 02:00 CET -> 03:00 CEST. A Sunday 01:00-04:00 window lasts
    two real hours; its edges are at the wall-clock times."""
    sunday = window(days=["sun"], **{"from": "01:00", "to": "04:00"})
    state = window_at(sunday, utc("2025-03-30T00:30"), BERLIN)  # 01:30 CET
    assert state.active is True
    assert state.next_edge_at == utc("2025-03-30T02:00")  # 04:00 CEST
    assert state.next_edge_at - utc("2025-03-30T00:00") == 2 * 3600  # from 01:00 CET
    # A start in the gap (02:30 does not exist that day) counts by the offset before it.
    gap = window(days=["sun"], **{"from": "02:30", "to": "05:00"})
    before = window_at(gap, utc("2025-03-30T00:59"), BERLIN)
    assert (before.active, before.next_edge_at) == (False, utc("2025-03-30T01:30"))


def test_fall_back_keeps_wall_clock_times() -> None:
    """2025-10-26 in Berlin: 03:00 CEST -> 02:00 CET. A Sunday 01:00-04:00 window lasts
    four real hours; 02:30 happens twice and both are inside."""
    sunday = window(days=["sun"], **{"from": "01:00", "to": "04:00"})
    start = local("2025-10-26T01:00")
    state = window_at(sunday, local("2025-10-26T02:30", fold=1), BERLIN)  # the second 02:30
    assert state.active is True
    assert state.next_edge_at - start == 4 * 3600
    assert window_at(sunday, local("2025-10-26T02:30", fold=0), BERLIN).active is True


def test_the_days_are_the_zones_days() -> None:
    """Friday 22:00 in Tokyo is Friday 13:00 UTC: the same instant, another wall clock."""
    tokyo = zoneinfo.ZoneInfo("Asia/Tokyo")
    night = window()
    assert window_at(night, utc("2025-01-10T13:30"), tokyo).active is True
    assert window_at(night, utc("2025-01-10T13:30"), BERLIN).active is False


# -- validation ---------------------------------------------------------------------------

BACKENDS = {"b": {"url": "http://127.0.0.1:9", "models": ["m"]}}


def settings(schedules: list[dict[str, Any]], **fields: Any) -> Any:
    return gateway_settings(BACKENDS, schedules=schedules, **fields)


def test_windows_of_one_action_may_not_overlap() -> None:
    first = {"name": "a", "days": ["mon"], "from": "18:00", "to": "22:00", "action": "yield"}
    second = {"name": "b", "days": ["mon"], "from": "21:00", "to": "23:00", "action": "yield"}
    with pytest.raises(ValidationError, match="'a' and 'b' overlap"):
        settings([first, second])
    # Across the week's end: Sunday night runs into Monday morning.
    sunday = {**first, "days": ["sun"], "from": "23:00", "to": "01:00"}
    monday = {**second, "days": ["mon"], "from": "00:30", "to": "02:00"}
    with pytest.raises(ValidationError, match="overlap"):
        settings([sunday, monday])
    # Back to back is not an overlap; other days neither.
    settings([first, {**second, "from": "22:00"}])
    settings([first, {**second, "days": ["tue"]}])


def test_different_actions_and_keep_warm_of_different_backends_may_overlap() -> None:
    two = {"b": BACKENDS["b"], "c": {"url": "http://127.0.0.1:9", "models": ["n"]}}
    day = {"days": ["mon"], "from": "08:00", "to": "18:00"}
    gateway_settings(
        two,
        schedules=[
            {"name": "y", **day, "action": "yield"},
            {"name": "kb", **day, "action": "keep_warm", "backend": "b"},
            {"name": "kc", **day, "action": "keep_warm", "backend": "c"},
        ],
    )
    with pytest.raises(ValidationError, match="overlap"):
        gateway_settings(
            two,
            schedules=[
                {"name": "k1", **day, "action": "keep_warm", "backend": "b"},
                {"name": "k2", **day, "action": "keep_warm", "backend": "b"},
            ],
        )


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"from": "25:00"}, "HH:MM"),
        ({"to": "7:00"}, "HH:MM"),
        ({"from": "06:00", "to": "06:00"}, "same time"),
        ({"days": ["fri", "fri"]}, "twice"),
        ({"days": ["friday"]}, "days"),
        ({"action": "profile"}, "needs profile"),
        ({"action": "keep_warm"}, "needs backend"),
        ({"backend": "b"}, "takes no backend"),
        ({"action": "keep_warm", "backend": "b", "min_free_mib": 5}, "takes no min_free_mib"),
    ],
)
def test_a_window_is_checked(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        window(**fields)


def test_names_backends_profiles_and_the_zone_must_exist() -> None:
    w = {"name": "a", "days": ["mon"], "from": "08:00", "to": "09:00"}
    with pytest.raises(ValidationError, match="no backend 'nope'"):
        settings([{**w, "action": "keep_warm", "backend": "nope"}])
    with pytest.raises(ValidationError, match="no GPU profile 'batch'"):
        settings([{**w, "action": "profile", "profile": "batch"}])
    with pytest.raises(ValidationError, match="used twice"):
        settings([{**w, "action": "yield"}, {**w, "action": "yield", "days": ["tue"]}])
    with pytest.raises(ValidationError, match="unknown time zone"):
        settings([], timezone="Mars/Olympus")
    assert settings([], timezone="Europe/Berlin").timezone == "Europe/Berlin"
