"""`schedules:` in models.yaml: weekly windows in the gateway's time zone (`timezone:`,
default the system's local zone). The schema and its checks only; pure.

```yaml
timezone: Europe/Berlin
schedules:
  - {name: evenings, days: [mon, tue, wed, thu, fri], from: "19:00", to: "23:30",
     action: yield, min_free_mib: 20000}    # its hold: "schedule evenings"
  - {name: nights, days: [sat, sun], from: "22:00", to: "06:00", action: profile,
     profile: batch}                      # across midnight: ends the next day at 06:00
  - {name: office, days: [mon, tue, wed, thu, fri], from: "08:30", to: "18:00",
     action: keep_warm, backend: coder}
```

- A window begins on each listed day at `from` and ends at `to` the same day, or the
  next day when `to` is not after `from`; `to: "24:00"` is the end of the day. `from`
  and `to` may not be equal.
- `yield`: the VRAM yield (as `POST /vram/yield` with `reason`, `min_free_mib`,
  `include_pinned`, `gpu`) for the window, its hold let go of at its end; `profile`: the GPU
  profile switched to for the window, and back at its end; `keep_warm`: the backend is
  started at the window's start and not idle-stopped during it.
- Overlaps: two windows of the same action may not overlap (one yield and one profile
  can be in force at a time), except `keep_warm` windows of different backends. Windows
  of different actions may overlap; then each applies (a yield blocks a kept-warm lazy
  backend like any other: the yield wins). Overlap is checked on the weekly wall clock.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Iterable, Mapping
from typing import Annotated, Final, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from app.settings.base import StrictConfig

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: Final[tuple[Day, ...]] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
Action = Literal["yield", "profile", "keep_warm"]
_CLOCK: Final = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])|24:00")
MINUTES_PER_DAY: Final = 24 * 60
MINUTES_PER_WEEK: Final = 7 * MINUTES_PER_DAY


def minutes(clock: str) -> int:
    """Minutes after midnight of `HH:MM` (24:00 is 1440)."""
    hours, _, mins = clock.partition(":")
    return int(hours) * 60 + int(mins)


class ScheduleWindow(StrictConfig):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] = Field(
        description="The window's name (unique)."
    )
    days: list[Day] = Field(min_length=1, description="Days it begins on: mon .. sun.")
    from_: str = Field(alias="from", description="Begins at HH:MM.")
    to: str = Field(
        description="Ends at HH:MM, the next day when not after from; 24:00 is the end of the day."
    )
    action: Action = Field(
        description=(
            "yield: a VRAM yield; profile: a GPU profile; keep_warm: a backend kept running."
        )
    )
    # yield: like POST /vram/yield's body
    reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="yield: the holder of the window's hold of the yield; null: `schedule NAME`.",
    )
    min_free_mib: PositiveInt | None = Field(
        None, description="yield: the MiB to free; null: everything."
    )
    include_pinned: bool = Field(False, description="yield: stop pinned backends too.")
    gpu: NonNegativeInt = Field(0, description="yield: the GPU index.")
    # profile
    profile: str | None = Field(
        None, description="profile: the GPU profile switched to for the window."
    )
    # keep_warm
    backend: str | None = Field(
        None, description="keep_warm: the backend started and not idle-stopped during the window."
    )

    @field_validator("days")
    @classmethod
    def _unique_days(cls, days: list[Day]) -> list[Day]:
        if len(set(days)) != len(days):
            raise ValueError("lists a day twice")
        return days

    @field_validator("from_", "to")
    @classmethod
    def _clock(cls, value: str) -> str:
        if not _CLOCK.fullmatch(value):
            raise ValueError(f"must be a time of day HH:MM (00:00 to 24:00), not {value!r}")
        return value

    @model_validator(mode="after")
    def _fits_action(self) -> ScheduleWindow:
        if minutes(self.from_) % MINUTES_PER_DAY == minutes(self.to) % MINUTES_PER_DAY and (
            self.to != "24:00"
        ):
            raise ValueError("from and to are the same time (a window needs a length)")
        if self.from_ == "24:00":
            raise ValueError("from: 24:00 is the end of a day; begin at 00:00")
        wanted = {"yield": (), "profile": ("profile",), "keep_warm": ("backend",)}[self.action]
        for field in wanted:
            if getattr(self, field) is None:
                raise ValueError(f"action {self.action} needs {field}")
        extra = {
            "reason": self.reason is not None,
            "min_free_mib": self.min_free_mib is not None,
            "include_pinned": self.include_pinned,
            "gpu": self.gpu != 0,
            "profile": self.profile is not None,
            "backend": self.backend is not None,
        }
        allowed = {
            "yield": {"reason", "min_free_mib", "include_pinned", "gpu"},
            "profile": {"profile"},
            "keep_warm": {"backend"},
        }[self.action]
        stray = sorted(k for k, set_ in extra.items() if set_ and k not in allowed)
        if stray:
            raise ValueError(f"action {self.action} takes no {', '.join(stray)}")
        return self

    @property
    def start_min(self) -> int:
        return minutes(self.from_)

    @property
    def length_min(self) -> int:
        """Its length in minutes (to the next day's `to` when `to` is not after `from`)."""
        start, end = self.start_min, minutes(self.to)
        return end - start if end > start else end + MINUTES_PER_DAY - start

    @property
    def yield_reason(self) -> str:
        """The holder of the yield it takes (`POST /vram/yield`'s `reason`)."""
        return self.reason or f"schedule {self.name}"

    @property
    def target(self) -> str | None:
        """What it acts on, for the overlap rule: the backend of a `keep_warm` window."""
        return self.backend if self.action == "keep_warm" else None

    def weekly(self) -> list[tuple[int, int]]:
        """Its spans as [start, end) minutes of the week from Monday 00:00 (one that runs
        past Sunday midnight is split in two)."""
        spans = []
        for day in self.days:
            start = DAYS.index(day) * MINUTES_PER_DAY + self.start_min
            end = start + self.length_min
            if end <= MINUTES_PER_WEEK:
                spans.append((start, end))
            else:
                spans += [(start, MINUTES_PER_WEEK), (0, end - MINUTES_PER_WEEK)]
        return spans


def overlapping(windows: Iterable[ScheduleWindow]) -> tuple[str, str] | None:
    """The names of the first two windows of the same action (and target) that overlap."""
    listed = list(windows)
    for i, first in enumerate(listed):
        for second in listed[i + 1 :]:
            if (first.action, first.target) != (second.action, second.target):
                continue
            if any(a < d and c < b for a, b in first.weekly() for c, d in second.weekly()):
                return first.name, second.name
    return None


def check_schedules(
    windows: list[ScheduleWindow],
    backends: Mapping[str, object],
    profiles: Iterable[str] | None,
) -> str | None:
    """The first problem of `schedules:` as `key: problem`, or None: names unique, no
    overlap of the same action, the backends and profiles they name exist."""
    seen: set[str] = set()
    known_profiles = None if profiles is None else set(profiles)
    for index, window in enumerate(windows):
        where = f"schedules.{index}"
        if window.name in seen:
            return f"{where}.name: {window.name!r} is used twice"
        seen.add(window.name)
        if window.backend is not None and window.backend not in backends:
            return (
                f"{where}.backend: no backend {window.backend!r} (backends: {', '.join(backends)})"
            )
        if window.profile is not None and (
            known_profiles is None or window.profile not in known_profiles
        ):
            listed = ", ".join(sorted(known_profiles)) if known_profiles else "none configured"
            return f"{where}.profile: no GPU profile {window.profile!r} ({listed})"
    clash = overlapping(windows)
    if clash is not None:
        return (
            f"schedules: windows {clash[0]!r} and {clash[1]!r} overlap and do the same thing; "
            "windows of one action may not overlap (keep_warm: of one backend)"
        )
    return None


def check_timezone(name: str | None) -> str | None:
    """The zone's name when zoneinfo knows it; None stays None (the system's local zone)."""
    if name is None:
        return None
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name like Europe/Berlin)") from None
    return name
