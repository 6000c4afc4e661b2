"""Access lines leave the event loop's thread, keep their request id and are all written;
other lines are written at once."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator

import pytest

from app import logs


@pytest.fixture
def restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        logs.drain()
        root.handlers[:] = handlers
        root.setLevel(level)


def test_access_lines_are_written_by_their_thread_with_their_request_id(restored: None) -> None:
    written_by: list[tuple[str, str]] = []

    class Recording(io.StringIO):
        def write(self, text: str) -> int:
            written_by.append((threading.current_thread().name, text))
            return super().write(text)

    out = Recording()
    logs.configure("INFO", stream=out)
    token = logs.request_id.set("abc123")
    try:
        logging.getLogger(logs.ACCESS).info("request path=%s status=%d", "/v1/x", 200)
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("app.test").exception("failed")
    finally:
        logs.request_id.reset(token)
    # Written at once, in this thread, request id included:
    assert " ERROR app.test request_id=abc123 failed" in out.getvalue()
    assert "ValueError: boom" in out.getvalue()
    logs.drain()  # what is queued is written before drain returns
    me = threading.current_thread().name
    access = [(thread, text) for thread, text in written_by if "request path" in text]
    assert len(access) == 1
    assert access[0][0] != me
    assert "INFO app.access request_id=abc123 request path=/v1/x status=200" in access[0][1]
    # After the drain, access lines are written directly.
    logging.getLogger(logs.ACCESS).info("late")
    assert "app.access request_id=- late" in out.getvalue()
