"""Logging: `key=value` lines carrying the request id of the request being served.

Every line but the access line goes through `logging` and is written where it is logged,
so what the process says while it starts or stops is never held back.

The access line (one per request, `app.access`) is the hot path: once `configure` ran, it
costs the event loop one f-string and a list append (`access()`); lines are joined and
handed every `FLUSH_S` (one timer) to a writer thread, which makes them safe to encode and
writes them, so a slow terminal or pipe never stalls requests and the loop pays no
`LogRecord`, no formatter and no write per request. Same format as the other lines.
`drain()` (at the end of the app's lifespan, when no request is left) writes the rest.
Without `configure` (an app in a test), `access()` logs through `logging`.

A line is one line whatever a client sent: control characters in a message (a `%0a` in a
path, a model name with a newline) are written as escapes (`escape_controls`), in the
access lines and in every other message; a traceback keeps its lines.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import re
import sys
import threading
import time
from typing import Final, TextIO

from app.errors import safe_text

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s request_id=%(request_id)s %(message)s"
ACCESS = "app.access"
FLUSH_S: Final = 0.1

_access_logger = logging.getLogger(ACCESS)
# C0 and C1 controls, DEL, and Unicode's line and paragraph separators.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """`text` with its control characters as escapes (`\\n`, `\\x1b`, `\\u2028`): what a
    client sent cannot end a log line early or forge another."""
    if _CONTROLS.search(text) is None:
        return text
    return _CONTROLS.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class SafeFormatter(logging.Formatter):
    """Writes any line: client text a message quotes (a model name, a path) may hold lone
    surrogates, which a UTF-8 stream cannot encode, or control characters, which would
    start a line of the client's making; both are written as escapes."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record))

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


class AccessWriter:
    """Access lines in batches: appended on the loop, written by a thread of its own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lines: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._batches: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._second = -1
        self._stamp = ""
        self._thread = threading.Thread(target=self._write, name="access-log", daemon=True)
        self._thread.start()

    def line(self, rid: str, message: str) -> None:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        millis = int((now - second) * 1000)
        self._lines.append(f"{self._stamp},{millis:03d} INFO {ACCESS} request_id={rid} {message}\n")
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not on a loop: hand it over at once
                self.flush()
                return
            self._timer = loop.call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        self._timer = None
        if self._lines:
            batch = "".join(self._lines)
            self._lines.clear()
            self._batches.put(batch)

    def close(self) -> None:
        """Write what is buffered and end the thread (it has written everything after)."""
        if self._timer is not None:
            self._timer.cancel()
        self.flush()
        self._batches.put(None)
        self._thread.join(timeout=5)

    def _write(self) -> None:
        while (batch := self._batches.get()) is not None:
            try:
                self._stream.write(safe_text(batch))
                self._stream.flush()
            except (OSError, ValueError):  # stderr gone: nothing left to tell
                pass


_writer: AccessWriter | None = None


def access_on() -> bool:
    """Whether an access line would be written (callers skip formatting one otherwise)."""
    return _writer is not None or _access_logger.isEnabledFor(logging.INFO)


def access(rid: str, message: str) -> None:
    """One access line for request `rid`."""
    writer = _writer
    if writer is not None:
        writer.line(rid, escape_controls(message))
    elif _access_logger.isEnabledFor(logging.INFO):
        _access_logger.info("%s", escape_controls(message))


def configure(level: str, stream: TextIO | None = None) -> None:
    """Lines to `stream` (stderr); the access lines through their writer."""
    global _writer
    drain()
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(SafeFormatter(FORMAT))
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if _access_logger.isEnabledFor(logging.INFO):
        _writer = AccessWriter(out)
    # Our own access line replaces uvicorn's; httpx would log every health check.
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("httpx").setLevel(logging.WARNING)


def drain() -> None:
    """Write the buffered access lines and stop their thread; later lines go through
    `logging`. Does nothing unless `configure` set a writer up."""
    global _writer
    writer, _writer = _writer, None
    if writer is not None:
        writer.close()
