"""Logging: `key=value` lines carrying the request id of the request being served."""

from __future__ import annotations

import contextvars
import logging

from app.errors import safe_text

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class SafeFormatter(logging.Formatter):
    """Writes any line: client text a message quotes (a model name, a path) may hold lone
    surrogates, which a UTF-8 stream cannot encode; they are written as escapes."""

    def format(self, record: logging.LogRecord) -> str:
        return safe_text(super().format(record))


def configure(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        SafeFormatter("%(asctime)s %(levelname)s %(name)s request_id=%(request_id)s %(message)s")
    )
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Our own access line replaces uvicorn's; httpx would log every health check.
    logging.getLogger("uvicorn.access").disabled = True
    logging.getLogger("httpx").setLevel(logging.WARNING)
