"""The last events of the control plane (state changes, evictions, yields, profile
switches, fallbacks), kept in memory for `GET /status`. Not a log: bounded, newest last.

Fields come from the gateway (backend names, reasons it wrote), never request bodies or
secrets.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Final

MAX_EVENTS: Final = 100


class EventLog:
    def __init__(self, maxlen: int = MAX_EVENTS) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=maxlen)

    def record(self, kind: str, **fields: Any) -> None:
        self._events.append({"at": round(time.time(), 3), "kind": kind, **fields})

    def recent(self) -> list[dict[str, Any]]:
        return list(self._events)
