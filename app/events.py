"""The last events of the control plane (state changes, evictions, yields, profile
switches, fallbacks), kept in memory for `GET /status`, and the change notices behind
`GET /status/stream`. Not a log: bounded, newest last.

Fields come from the gateway (backend names, reasons it wrote), never request bodies or
secrets.

Streams subscribe (`subscribe()`); `record()` queues the event for each subscriber and
`changed()` wakes them (in-flight counts, a GPU sample). Both are synchronous
and O(subscribers): the gateway never waits for a client. A subscriber's queue is
bounded; one that falls `max_queued` events behind is dropped (its stream ends) rather
than buffered without end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

logger = logging.getLogger(__name__)

MAX_EVENTS: Final = 100
MAX_QUEUED: Final = 256


class Subscription:
    """One stream's view of the log: the events it has not sent yet, and `wake`, set when
    anything it shows may have changed."""

    def __init__(self, log: EventLog, max_queued: int) -> None:
        self._log = log
        self.max_queued = max_queued
        self.events: deque[dict[str, Any]] = deque()
        self.dropped = False
        self.ended: str | None = None  # why the gateway ended the stream (it is stopping)
        self.wake = asyncio.Event()

    def take(self) -> list[dict[str, Any]]:
        """The queued events, oldest first; clears the queue and `wake`."""
        events = list(self.events)
        self.events.clear()
        self.wake.clear()
        return events

    def close(self) -> None:
        self._log._subscribers.discard(self)


class EventLog:
    def __init__(self, maxlen: int = MAX_EVENTS) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self._subscribers: set[Subscription] = set()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._seq = 0

    def listen(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call `listener` (synchronous, must not wait) with every event recorded
        (the notifications, `app.notify.notifier`)."""
        self._listeners.append(listener)

    def record(self, kind: str, **fields: Any) -> None:
        self._seq += 1
        event = {"seq": self._seq, "at": round(time.time(), 3), "kind": kind, **fields}
        self._events.append(event)
        for sub in tuple(self._subscribers):
            if len(sub.events) >= sub.max_queued:
                sub.dropped = True
                sub.close()
            else:
                sub.events.append(event)
            sub.wake.set()
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # an observer must never break what recorded the event
                logger.exception("event listener failed kind=%s", kind)

    def changed(self) -> None:
        """Something `/status` shows changed without an event (counts, a GPU sample)."""
        for sub in self._subscribers:
            sub.wake.set()

    def subscribe(self, max_queued: int = MAX_QUEUED) -> Subscription:
        sub = Subscription(self, max_queued)
        self._subscribers.add(sub)
        return sub

    def end_streams(self, reason: str) -> None:
        """End every subscription (the gateway is stopping): each stream says why and
        ends, instead of holding the shutdown until its grace runs out."""
        for sub in tuple(self._subscribers):
            sub.ended = reason
            sub.close()
            sub.wake.set()

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def recent(self) -> list[dict[str, Any]]:
        return list(self._events)
