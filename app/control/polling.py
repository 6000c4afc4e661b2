"""How often a backend's server is polled: its `/health` (the health watch, every
`health_interval_s`) and its `/metrics` (the scrape, every `gpu.poll_interval_s`). Each
poll is a line in the server's access log, so a gateway that polls an idle server at full
rate (12 health checks and 60 scrapes a minute by default) fills `microscheduler logs`
with them.

While a backend is in use the polls come at that rate. Once it is idle they space out
with its idle time, `IDLE_FRACTION` of it, up to `IDLE_MAX_S`: idle 20 s, a health check
every 5 s (the default rate); idle 1 min, every 15 s; idle 2 min or more, every 30 s. A
request in flight (idle 0) or a failed health check brings the rate back at the next
round. A configured interval above `IDLE_MAX_S` is kept as it is.

The loops still run every round: what is spaced out is the HTTP call to the server. A
managed server that exits is still seen at the next round (its runtime is asked, not the
server), a pinned backend's restart still comes when its backoff has passed. Pure.
"""

from __future__ import annotations

from typing import Final

IDLE_FRACTION: Final = 0.25
IDLE_MAX_S: Final = 30.0


def poll_interval_s(base_s: float, idle_s: float, *, failing: bool = False) -> float:
    """The interval between two polls of a server idle for `idle_s` (0 while requests are
    in flight): `base_s` (the configured interval) while in use or `failing`, growing
    with the idle time up to `IDLE_MAX_S` (or `base_s` when that is longer)."""
    if failing:
        return base_s
    return max(base_s, min(IDLE_MAX_S, idle_s * IDLE_FRACTION))


def poll_due(since_last_s: float | None, interval_s: float, round_s: float) -> bool:
    """Whether a round of a loop that runs every `round_s` polls a server last polled
    `since_last_s` ago (None: never): once the interval has passed, to within half a
    round, so an interval of one round polls every round however the rounds drift."""
    return since_last_s is None or since_last_s + round_s / 2 >= interval_s
