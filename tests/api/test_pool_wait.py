"""A capped connection pool is a visible queue: waits are counted, bounded by first_byte_s,
and the slot comes back when a response ends, however it ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from app.errors import UpstreamTimeout
from app.settings import TimeoutsConfig
from app.upstreams.http import HttpUpstream
from tests.fakes.servers import serve_app
from tests.fakes.waits import until


class Observer:
    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.waits: list[float] = []

    def waiting(self, delta: int) -> None:
        self.now += delta
        self.peak = max(self.peak, self.now)

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
async def held() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """An upstream whose answers end only when the test sets `go`."""
    go = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"first")
        await go.wait()
        await response.write(b"rest")
        return response

    app = web.Application()
    app.router.add_post("/x", answer)
    async with serve_app(app) as url:
        try:
            yield url, go
        finally:
            go.set()


async def test_a_request_beyond_the_cap_waits_counted_until_a_response_ends(
    held: tuple[str, asyncio.Event],
) -> None:
    url, go = held
    observer = Observer()
    upstream = HttpUpstream(
        "b", url, TimeoutsConfig(first_byte_s=5), max_connections=1, observer=observer
    )
    try:
        first = await upstream.open("/x", b"", {})
        second = asyncio.create_task(upstream.open("/x", b"", {}))
        await until(lambda: upstream.pool_waiting == 1, what="the second request queued")
        assert observer.now == 1
        assert not second.done()
        go.set()
        async for _ in first.rest():
            pass
        first.release()  # the slot comes back with the response
        opened = await asyncio.wait_for(second, 5)
        assert upstream.pool_waiting == 0
        assert observer.now == 0
        assert len(observer.waits) == 1
        assert observer.waits[0] > 0
        opened.release()
    finally:
        await upstream.close()


async def test_a_wait_longer_than_first_byte_s_is_a_pool_timeout_and_leaks_nothing(
    held: tuple[str, asyncio.Event],
) -> None:
    url, go = held
    observer = Observer()
    upstream = HttpUpstream(
        "b", url, TimeoutsConfig(first_byte_s=0.2), max_connections=1, observer=observer
    )
    try:
        first = await upstream.open("/x", b"", {})
        with pytest.raises(UpstreamTimeout) as info:
            await upstream.open("/x", b"", {})
        assert info.value.kind == "pool_timeout"
        assert "max_connections" in info.value.message
        assert upstream.pool_waiting == 0
        assert observer.now == 0
        first.release()  # closed mid-body: the slot still comes back
        go.set()
        again = await upstream.open("/x", b"", {}, first_byte_s=5)
        again.release()
    finally:
        await upstream.close()


async def test_without_a_cap_nothing_waits(held: tuple[str, asyncio.Event]) -> None:
    url, _ = held
    upstream = HttpUpstream("b", url, TimeoutsConfig(first_byte_s=5))
    try:
        opened = [await upstream.open("/x", b"", {}) for _ in range(20)]
        assert upstream.pool_waiting == 0
        for response in opened:
            response.release()
    finally:
        await upstream.close()
