"""What the schedules (`app.settings.schedules`) put in force at a moment. Pure: the time is
given, the time zone too (`zone()` reads the system's when none is configured).

`schedule_at(windows, now, tz)` says of each window whether it is active at `now` (Unix
seconds) and when its next edge (its next start or end) comes. A window's times are wall
clock times in `tz`, so a window keeps its wall clock times across a DST change (an
evening window from 19:00 is an hour shorter or longer in UTC on the night the clocks
change when it spans the change). A time that does not exist that day (in the gap when
clocks go forward) counts as zoneinfo reads it with `fold=0`: by the offset before the
change (02:30 becomes 03:30 on a one-hour change); a time that happens twice (when
clocks go back) is its first occurrence.
"""

from __future__ import annotations

import os
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, tzinfo

from app.settings.schedules import DAYS, ScheduleWindow

# Occurrences looked at around `now`: the day before (a window across midnight that is
# still running) up to a week ahead (the next start of a window of one weekday).
_DAYS_BEFORE = 1
_DAYS_AHEAD = 8


@dataclass(frozen=True, slots=True)
class WindowState:
    window: ScheduleWindow
    active: bool
    next_edge_at: float  # Unix seconds: when it next begins (inactive) or ends (active)
    active_since: float | None = None  # when the occurrence in force began


def _at(day: date, clock: str, tz: tzinfo) -> float:
    """Unix seconds of wall-clock `clock` (HH:MM, 24:00 the end of the day) on `day`."""
    hours, _, minutes = clock.partition(":")
    if hours == "24":
        day, hours = day + timedelta(days=1), "0"
    local = datetime.combine(day, time(int(hours), int(minutes)), tzinfo=tz)
    return local.timestamp()


def occurrences(window: ScheduleWindow, around: float, tz: tzinfo) -> list[tuple[float, float]]:
    """Its (start, end) spans in Unix seconds from the day before `around` a week ahead."""
    today = datetime.fromtimestamp(around, tz).date()
    spans = []
    for offset in range(-_DAYS_BEFORE, _DAYS_AHEAD):
        day = today + timedelta(days=offset)
        if DAYS[day.weekday()] not in window.days:
            continue
        start = _at(day, window.from_, tz)
        crosses = window.to != "24:00" and window.to <= window.from_
        end = _at(day + timedelta(days=1) if crosses else day, window.to, tz)
        if end > start:  # a window in a DST gap that comes to nothing is skipped
            spans.append((start, end))
    return spans


def window_at(window: ScheduleWindow, now: float, tz: tzinfo) -> WindowState:
    spans = occurrences(window, now, tz)
    current = [(s, e) for s, e in spans if s <= now < e]
    if current:
        start, end = current[0]
        # Back-to-back occurrences (every day 00:00-24:00) are one: it ends at their end.
        for s, e in spans:
            if s == end:
                end = e
        return WindowState(window, True, end, start)
    later = [s for s, _ in spans if s > now]
    return WindowState(window, False, min(later, default=now + 86400.0))


def schedule_at(windows: Iterable[ScheduleWindow], now: float, tz: tzinfo) -> list[WindowState]:
    """Each window's state at `now` (Unix seconds), in the order of `windows`."""
    return [window_at(window, now, tz) for window in windows]


def next_edge(states: Iterable[WindowState]) -> float | None:
    """The soonest edge of any window (None: no windows)."""
    return min((s.next_edge_at for s in states), default=None)


def zone(name: str | None) -> tzinfo:
    """The configured zone, else the system's: `TZ`, then /etc/localtime, then the
    current fixed offset (no DST rules: a warning in the docs, not here)."""
    if name is not None:
        return zoneinfo.ZoneInfo(name)
    tz_name = os.environ.get("TZ", "").lstrip(":")
    if tz_name:
        try:
            return zoneinfo.ZoneInfo(tz_name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            pass
    try:
        with open("/etc/localtime", "rb") as source:
            return zoneinfo.ZoneInfo.from_file(source, key="localtime")
    except (OSError, ValueError):
        local = datetime.now().astimezone().tzinfo
        assert local is not None
        return local
