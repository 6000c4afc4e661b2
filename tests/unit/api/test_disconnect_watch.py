"""The relay's disconnect watch, with a gated receive(): no server, no sleeps."""

from __future__ import annotations

import asyncio

from starlette.types import Message

from app.api.relay import _DisconnectWatch


class GatedReceive:
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.error: Exception | None = None
        self.watching = asyncio.Event()  # the relay under test set its watch up

    async def __call__(self) -> Message:
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return {"type": "http.disconnect"}


async def relay_until_cancelled(receive: GatedReceive, *, stop_first: bool = False) -> str:
    watch = _DisconnectWatch(receive)
    if stop_first:
        watch.stop()
    receive.watching.set()
    try:
        await asyncio.wait_for(asyncio.Event().wait(), 0.2)  # stands in for the upstream wait
    except asyncio.CancelledError:
        assert watch.disconnected
        watch.absorb_cancel()
        return "cancelled by the watch"
    except TimeoutError:
        return "not cancelled"
    finally:
        watch.stop()
    return "unreachable"


async def test_a_disconnect_cancels_the_relaying_task() -> None:
    receive = GatedReceive()
    task = asyncio.create_task(relay_until_cancelled(receive))
    await receive.watching.wait()
    receive.gate.set()
    assert await task == "cancelled by the watch"
    assert task.cancelling() == 0  # the cancellation was absorbed, nothing leaks upward


async def test_a_failing_receive_counts_as_a_disconnect() -> None:
    receive = GatedReceive()
    receive.error = OSError("connection lost")
    task = asyncio.create_task(relay_until_cancelled(receive))
    await receive.watching.wait()
    receive.gate.set()
    assert await task == "cancelled by the watch"


async def test_a_stopped_watch_never_cancels() -> None:
    receive = GatedReceive()
    task = asyncio.create_task(relay_until_cancelled(receive, stop_first=True))
    await receive.watching.wait()
    receive.gate.set()
    assert await task == "not cancelled"
