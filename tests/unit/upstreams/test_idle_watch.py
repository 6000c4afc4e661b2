"""The idle timeout of a response's reads (app.upstreams.idle_watch): one lazily re-armed
timer, only reads count, and a cancellation from outside stays the owner's."""

from __future__ import annotations

import asyncio

import pytest

from app.upstreams.idle_watch import IdleWatch

IDLE_S = 0.2


async def read(watch: IdleWatch, arrives: asyncio.Future[bytes]) -> bytes:
    """One read as `UpstreamResponse.rest` does it: True from `expired` is a timeout."""
    watch.reading()
    try:
        return await arrives
    except asyncio.CancelledError:
        if watch.expired():
            return b"<timed out>"
        raise
    finally:
        watch.read()


async def test_a_read_that_waits_past_idle_s_is_timed_out() -> None:
    watch = IdleWatch(IDLE_S)
    never: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    started = asyncio.get_running_loop().time()
    assert await read(watch, never) == b"<timed out>"
    assert asyncio.get_running_loop().time() - started >= IDLE_S
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    watch.close()


async def test_reads_that_each_come_in_time_never_time_out_however_long_the_stream() -> None:
    loop = asyncio.get_running_loop()
    watch = IdleWatch(IDLE_S)
    got = []
    for i in range(8):  # 8 x 0.1 s: four times idle_s in all, each read within it
        chunk: asyncio.Future[bytes] = loop.create_future()
        loop.call_later(IDLE_S / 2, chunk.set_result, b"%d" % i)
        got.append(await read(watch, chunk))
    assert got == [b"%d" % i for i in range(8)]
    watch.close()


async def test_the_time_between_reads_does_not_count() -> None:
    loop = asyncio.get_running_loop()
    watch = IdleWatch(IDLE_S)
    first: asyncio.Future[bytes] = loop.create_future()
    first.set_result(b"a")
    assert await read(watch, first) == b"a"
    await asyncio.sleep(IDLE_S * 2)  # a slow client: the relay writes meanwhile
    second: asyncio.Future[bytes] = loop.create_future()
    loop.call_later(IDLE_S / 2, second.set_result, b"b")
    assert await read(watch, second) == b"b"
    watch.close()


async def test_a_cancellation_from_outside_is_the_owners() -> None:
    loop = asyncio.get_running_loop()

    async def reader() -> bytes:
        watch = IdleWatch(IDLE_S)
        try:
            return await read(watch, loop.create_future())
        finally:
            watch.close()

    task = asyncio.create_task(reader())
    await asyncio.sleep(IDLE_S / 4)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
