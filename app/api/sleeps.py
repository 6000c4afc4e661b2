"""A backend's sleeps in `/backends` and `/status` (`sleeps`): what the sleep guard
records of them (`app.lifecycle.sleep_guard`; docs/lifecycle.md, "The sleep guard")."""

from __future__ import annotations

from typing import Any

from app.lifecycle.sleep_guard import SleepRecord

Json = dict[str, Any]


def sleeps_view(record: SleepRecord, leak_mib: int) -> Json:
    """What each sleep freed and kept since its last cold start: the first measured
    (`baseline_freed_mib`), the last few, how much more the last measured one held than
    the first (`growth_mib`), the threshold, and the guard's last stop (kept across cold
    starts)."""
    baseline = record.baseline
    trip = record.last_trip
    return {
        "cycles": record.cycles,
        "baseline_freed_mib": None if baseline is None else baseline.freed_mib,
        "baseline_held_mib": None if baseline is None else baseline.held_mib,
        "growth_mib": record.growth_mib,
        "sleep_leak_mib": leak_mib,
        "recent": [
            {
                "cycle": c.cycle,
                "level": c.level,
                "freed_mib": c.freed_mib,
                "held_mib": c.held_mib,
                "at": round(c.at, 3),
            }
            for c in record.recent
        ],
        "last_trip": None
        if trip is None
        else {"cause": str(trip.cause), "detail": trip.detail, "at": round(trip.at, 3)},
    }
