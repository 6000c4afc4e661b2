"""Logging: `key=value` lines carrying the request id of the request being served.

The access line (logger `app.access`, one per request) is written by a thread of its own
(`QueueHandler` -> `QueueListener`): the event loop only takes the record with its request
id and message; the time stamp, the line and the write happen off the loop, so a slow
terminal or pipe never stalls requests. Every other line is written where it is logged,
so what the process says while it starts or stops is never held back. `drain()` (at the
end of the app's lifespan, when no request is left) writes what is still queued.
"""

from __future__ import annotations

import contextvars
import logging
import logging.handlers
import queue
import sys
from typing import TextIO

from app.errors import safe_text

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s request_id=%(request_id)s %(message)s"
ACCESS = "app.access"

_listener: logging.handlers.QueueListener | None = None


class _RequestIdFilter(logging.Filter):
    """Stamps the request id of the context the record was logged in (once: a queued
    record keeps the one it was given before it left the request's context)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.get()
        return True


class SafeFormatter(logging.Formatter):
    """Writes any line: client text a message quotes (a model name, a path) may hold lone
    surrogates, which a UTF-8 stream cannot encode; they are written as escapes."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record))


def configure(level: str, stream: TextIO | None = None) -> None:
    """Lines to `stream` (stderr); the access lines through their writer thread."""
    global _listener
    drain()
    writer = logging.StreamHandler(stream if stream is not None else sys.stderr)
    writer.setFormatter(SafeFormatter(FORMAT))
    writer.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [writer]
    root.setLevel(level)

    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    enqueue = logging.handlers.QueueHandler(records)
    enqueue.addFilter(_RequestIdFilter())  # here, in the request's context
    access = logging.getLogger(ACCESS)
    access.handlers[:] = [enqueue]
    access.propagate = False
    _listener = logging.handlers.QueueListener(records, writer)
    _listener.start()
    # Our own access line replaces uvicorn's; httpx would log every health check.
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("httpx").setLevel(logging.WARNING)


def drain() -> None:
    """Write the queued access lines and stop their thread; later ones are written
    directly. Does nothing unless `configure` ran."""
    global _listener
    listener, _listener = _listener, None
    if listener is None:
        return
    listener.stop()
    access = logging.getLogger(ACCESS)
    access.handlers[:] = []
    access.propagate = True
