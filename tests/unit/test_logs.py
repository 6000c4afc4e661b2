"""Access lines cost the loop a string and an append: written in batches by their own
thread, in the same format as every other line, all of them by the drain."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
from collections.abc import Iterator

import pytest

from app import logs


class Recording(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writers: list[tuple[str, str]] = []

    def write(self, text: str) -> int:
        self.writers.append((threading.current_thread().name, text))
        return super().write(text)


@pytest.fixture
def out() -> Iterator[Recording]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = Recording()
    logs.configure("INFO", stream=stream)
    try:
        yield stream
    finally:
        logs.drain()
        root.handlers[:] = handlers
        root.setLevel(level)


async def test_access_lines_are_batched_and_written_by_their_thread(out: Recording) -> None:
    for status in (200, 404):
        logs.access("abc123", f"request method=POST path=/v1/x status={status}")
    assert out.getvalue() == ""  # nothing written on the loop
    logging.getLogger("app.test").warning("other lines go %s", "at once")
    assert " WARNING app.test request_id=- other lines go at once" in out.getvalue()
    await asyncio.sleep(logs.FLUSH_S * 3)  # the flush timer under test
    logs.drain()
    access = [(who, text) for who, text in out.writers if "app.access" in text]
    assert len(access) == 1  # one batch, one write
    who, text = access[0]
    assert who == "access-log"
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("INFO app.access request_id=abc123 request method=POST path=/v1/x "
                             "status=200")  # fmt: skip
    # The same time stamp format as logging's: 2026-11-25 20:12:01,123
    other = out.getvalue().split(" WARNING")[0]
    assert len(lines[0].split(" INFO")[0]) == len(other)


async def test_the_drain_writes_what_is_buffered_and_text_is_made_safe(out: Recording) -> None:
    logs.access("r1", "request path=/\udcff")
    logs.drain()  # before the flush timer
    assert "request_id=r1 request path=/\\udcff" in out.getvalue()


def test_without_configure_access_lines_go_through_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=logs.ACCESS):
        logs.access("r2", "request path=/health status=200")
    assert caplog.records[-1].name == logs.ACCESS
    assert caplog.records[-1].getMessage() == "request path=/health status=200"
