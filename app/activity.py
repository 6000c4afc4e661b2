"""Activity: the last requests the gateway answered, one small fixed record each, kept
in memory for `GET /activity` and `microscheduler activity`. Not a log: bounded (the
ring holds `activity_size` entries, 1,000 by default; the oldest goes first), newest
first when read.

An entry holds what the gateway decided and measured, never what the client sent:
the time, the key's name, the model (the configured name the request was routed by),
the route (the backend or provider that answered), the API (the endpoint's name), the
status, the tokens of the answer's usage, the wait and why, the fallbacks taken (and
their reasons; with `cold_start_budget`, the passed-over entry's expected time to ready,
`expected_wake_s`), the duration, and the error that ended a response whose status line
had gone out (`stream_error`: a stream that ended with an error event is a 200 on the
wire, and stays one here). Every string in it comes from the configuration
(names) or a closed vocabulary, so an entry's size does not depend on the request.

Waits are counted per request in `Waits`, which the request's context carries
(`current_waits`, set by the access middleware): the backend's queue adds the time a
request was held for its start (`wake`), for memory other models hold before the start
can begin (`yield`: their `min_resident_s`) or for a slot (`queue`: `max_inflight` in
flight), the upstream's pool the time it waited for a free connection (`limit`:
`max_connections` in use). The reason given is the one that took the longest.
"""

from __future__ import annotations

import contextvars
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

DEFAULT_SIZE: Final = 1000
WAIT_HEADER: Final = b"x-microscheduler-wait"
# Shorter waits are not told (a pinned backend's first health check, a slot freed at
# once): `0.00s` would say nothing.
TOLD_WAIT_S: Final = 0.005


class WaitKind(StrEnum):
    """Why a request waited before its upstream was opened."""

    NONE = "none"  # it did not
    QUEUE = "queue"  # for a slot on its ready backend (max_inflight in flight)
    WAKE = "wake"  # for its backend to start (or to stop, then start)
    LIMIT = "limit"  # for a free connection to its upstream (max_connections in use)
    YIELD = "yield"  # its backend's start waited for memory other models hold


class Waits:
    """The seconds one request waited, by kind. Filled by the queue and the pool; read
    once the upstream answers (the response header) and when the request ends."""

    __slots__ = ("_seconds",)

    def __init__(self) -> None:
        self._seconds: dict[WaitKind, float] = {}

    def add(self, kind: WaitKind, seconds: float) -> None:
        self._seconds[kind] = self._seconds.get(kind, 0.0) + max(0.0, seconds)

    @property
    def waited(self) -> bool:
        """Whether it waited long enough to be told (`TOLD_WAIT_S`)."""
        return self.total_s >= TOLD_WAIT_S

    @property
    def total_s(self) -> float:
        return sum(self._seconds.values())

    @property
    def reason(self) -> WaitKind:
        """The kind that took the longest; `none` when it did not wait (`waited`)."""
        if not self.waited:
            return WaitKind.NONE
        return max(self._seconds.items(), key=lambda item: item[1])[0]

    def summary(self) -> tuple[float, WaitKind]:
        """(seconds, reason) for an activity entry: (0.0, none) when it did not wait."""
        if not self._seconds or not self.waited:
            return 0.0, WaitKind.NONE
        return self.total_s, self.reason

    def header(self) -> bytes | None:
        """`2.31s; reason=wake` for `x-microscheduler-wait`; None when it did not wait."""
        if not self.waited:
            return None
        return f"{self.total_s:.2f}s; reason={self.reason}".encode()


# The waits of the request being served (set per request by the access middleware).
current_waits: contextvars.ContextVar[Waits | None] = contextvars.ContextVar(
    "current_waits", default=None
)


def add_wait(kind: WaitKind, seconds: float) -> None:
    """Count `seconds` of waiting for `kind` on the current request, if any."""
    waits = current_waits.get()
    if waits is not None:
        waits.add(kind, seconds)


@dataclass(frozen=True, slots=True)
class Entry:
    """One finished request. `route`: the backend or provider that answered (or was
    tried last); None fields: not known (a request refused before routing, a stream
    without usage)."""

    at: float  # when it arrived, Unix seconds
    key: str | None
    model: str | None
    route: str | None
    api: str
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    wait_s: float
    wait_reason: WaitKind
    fallbacks: int
    duration_s: float
    fallback_reasons: tuple[str, ...] = ()  # `FallbackReason`s, in the chain's order
    expected_wake_s: float | None = None  # a cold entry passed over (cold_start_budget)
    # The error that ended it after its status line went out (the status stays what went
    # out, 200): the gateway's error code, or `upstream_<status>` / `upstream_error` for
    # the upstream's own error event (`app.upstreams.sse_errors`). None: it did not.
    stream_error: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """Completion tokens per second of the time after the wait (prefill included)."""
        busy = self.duration_s - self.wait_s
        if not self.completion_tokens or busy <= 0:
            return None
        return self.completion_tokens / busy

    def view(self) -> dict[str, Any]:
        rate = self.tokens_per_s
        return {
            "at": round(self.at, 3),
            "key": self.key,
            "model": self.model,
            "route": self.route,
            "api": self.api,
            "status": self.status,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens_per_s": None if rate is None else round(rate, 1),
            "wait_s": round(self.wait_s, 3),
            "wait_reason": str(self.wait_reason),
            "fallbacks": self.fallbacks,
            "fallback_reasons": list(self.fallback_reasons),
            "expected_wake_s": self.expected_wake_s,
            "duration_s": round(self.duration_s, 3),
            "stream_error": self.stream_error,
        }


class Activity:
    """The ring of the last `size` entries. A `sink` (`persist_to`) also gets each entry
    (the store's queue, `app.store.usage`: it must not block)."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._entries: deque[Entry] = deque(maxlen=size)
        self._sink: Callable[[Entry], None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def persist_to(self, sink: Callable[[Entry], None] | None) -> None:
        self._sink = sink

    def restore(self, entries: Iterable[Entry]) -> None:
        """Entries saved by an earlier run, oldest first, before the ones recorded since."""
        self._entries = deque([*entries, *self._entries], maxlen=self.size)

    def record(self, entry: Entry) -> None:
        self._entries.append(entry)
        if self._sink is not None:
            self._sink(entry)

    def recent(
        self, limit: int, *, model: str | None = None, key: str | None = None
    ) -> list[Entry]:
        """Up to `limit` entries, newest first, of `model` and `key` when given."""
        found: list[Entry] = []
        for entry in reversed(self._entries):
            if len(found) >= limit:
                break
            if (model is None or entry.model == model) and (key is None or entry.key == key):
                found.append(entry)
        return found


def entry_at(started_perf: float, ended_perf: float) -> tuple[float, float]:
    """(arrival as Unix seconds, duration) of a request timed with `time.perf_counter`."""
    duration = max(0.0, ended_perf - started_perf)
    return time.time() - duration, duration
