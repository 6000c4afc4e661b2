"""A residency floor: a client asked that its model stay loaded at least until a moment
(Ollama's `keep_alive` with a duration, `app.api.ollama.keep_alive`), or until it is
unloaded (a negative one: `math.inf`). Pure: the moments are `time.monotonic()` values
the caller passes.

While it lasts the idle reaper does not stop the backend (`Backend._idle_past_ttl`, and
`RequestHolds.idle_stop_in_s` counts to the later of the two), and another backend's start
does not evict it: it waits for a finite floor as for `min_resident_s`, and treats an
infinite one as a pinned backend (`app.vram.holders.residents`). Any stop or sleep ends
it (`Backend._begin_stop`): an unload, an admin's stop, a zone or a yield that forces it.
"""

from __future__ import annotations

import math


class ResidencyFloor:
    __slots__ = ("until",)

    def __init__(self) -> None:
        self.until: float | None = None  # monotonic; inf: until it is unloaded

    def keep(self, seconds: float, now: float) -> None:
        """At least `seconds` more from `now` (never shortens a floor already set)."""
        end = math.inf if math.isinf(seconds) else now + max(0.0, seconds)
        self.until = end if self.until is None else max(self.until, end)

    def left_s(self, now: float) -> float:
        """Seconds left (0: none; inf: until unloaded)."""
        return 0.0 if self.until is None else max(0.0, self.until - now)

    def clear(self) -> None:
        self.until = None
