"""A key's limits as sliding windows. Pure: every method takes the time.

- requests per minute: the times of the requests admitted in the last 60 s; a request is
  refused while there are `rpm` of them, until the oldest leaves the window;
- tokens per minute: the tokens of answers that ended in the last 60 s (counted from their
  usage, so a request is admitted while the window is under the limit and its own tokens
  count once it ends, as OpenAI's and Envoy AI Gateway's token limits do);
- cloud tokens per UTC day: a counter that starts again at 00:00 UTC.

Memory is bounded by the limits: at most `rpm` request times, and one token entry per
answer of the last minute.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

WINDOW_S: Final = 60.0
DAY_S: Final = 86400


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused now: the limit's name (a metric label) and when to retry."""

    limit: str  # rpm | tpm | max_concurrent | daily_cloud_tokens
    retry_after_s: float
    message: str


class RequestWindow:
    __slots__ = ("_times", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._times: deque[float] = deque()

    def _expire(self, now: float) -> None:
        times, edge = self._times, now - WINDOW_S
        while times and times[0] <= edge:
            times.popleft()

    def used(self, now: float) -> int:
        self._expire(now)
        return len(self._times)

    def reset_in(self, now: float) -> float:
        """Seconds until one more request fits (0: now)."""
        self._expire(now)
        if len(self._times) < self.limit:
            return 0.0
        return self._times[len(self._times) - self.limit] + WINDOW_S - now

    def empty_in(self, now: float) -> float:
        """Seconds until the window is empty again: the limit back to its initial state."""
        self._expire(now)
        return self._times[-1] + WINDOW_S - now if self._times else 0.0

    def add(self, now: float) -> None:
        self._times.append(now)


class TokenWindow:
    __slots__ = ("_entries", "_total", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: deque[tuple[float, int]] = deque()
        self._total = 0

    def _expire(self, now: float) -> None:
        entries, edge = self._entries, now - WINDOW_S
        while entries and entries[0][0] <= edge:
            self._total -= entries.popleft()[1]

    def used(self, now: float) -> int:
        self._expire(now)
        return self._total

    def reset_in(self, now: float) -> float:
        """Seconds until the window is under the limit again (0: it is)."""
        self._expire(now)
        over = self._total - self.limit
        if over < 0:
            return 0.0
        for at, tokens in self._entries:
            over -= tokens
            if over < 0:
                return at + WINDOW_S - now
        return WINDOW_S  # not reached: the entries sum to the total

    def empty_in(self, now: float) -> float:
        """Seconds until the window is empty again: the limit back to its initial state."""
        self._expire(now)
        return self._entries[-1][0] + WINDOW_S - now if self._entries else 0.0

    def add(self, now: float, tokens: int) -> None:
        if tokens > 0:
            self._entries.append((now, tokens))
            self._total += tokens


class DailyTokens:
    """Tokens per UTC day (`wall` is `time.time()`: days begin at 00:00 UTC).

    The spend survives restarts in the store (`app.store`): `restore` sets what it says
    was spent today; `unknown` marks today's spend as unreadable, and the budget counts as
    spent (fail closed) until `restore` or the next UTC day."""

    __slots__ = ("_day", "_spent", "_unknown_day", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._day = -1
        self._spent = 0
        self._unknown_day: int | None = None

    def restore(self, wall: float, spent: int) -> None:
        self._day, self._spent = int(wall // DAY_S), max(0, spent)
        self._unknown_day = None

    def unknown(self, wall: float) -> None:
        self._unknown_day = int(wall // DAY_S)

    def is_unknown(self, wall: float) -> bool:
        return self._unknown_day == int(wall // DAY_S)

    def spent(self, wall: float) -> int:
        day = int(wall // DAY_S)
        if day != self._day:
            self._day, self._spent = day, 0
        return self._spent

    def exhausted(self, wall: float) -> bool:
        return self.is_unknown(wall) or self.spent(wall) >= self.limit

    def reset_in(self, wall: float) -> float:
        return DAY_S - wall % DAY_S

    def add(self, wall: float, tokens: int) -> None:
        self.spent(wall)
        self._spent += max(0, tokens)


def duration_text(seconds: float) -> str:
    """A reset time as OpenAI's `x-ratelimit-reset-*` headers word it: `250ms`, `1.5s`,
    `6m0s`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{rest}s"
