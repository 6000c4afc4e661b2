"""The relay's disconnect watch: told by the request's `ClientLink` under the gateway's
own server, by a gated receive() under another. No server, no sleeps."""

from __future__ import annotations

import asyncio

from starlette.types import Message

from app.api.client_link import LINK_KEY, ClientLink
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


async def relay_until_cancelled(
    receive: GatedReceive,
    *,
    stop_first: bool = False,
    scope: dict[str, object] | None = None,
    ready: asyncio.Event | None = None,
) -> str:
    """A relay's wait for its upstream, watched: by `receive` (no link in `scope`) or by
    the link there. `ready` (else `receive.watching`) is set once the watch is up."""
    watch = _DisconnectWatch(receive, scope or {})
    if stop_first:
        watch.stop()
    (ready or receive.watching).set()
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


class Cycle:
    def __init__(self) -> None:
        self.more_body = True
        self.response_complete = False


class Flow:
    def __init__(self) -> None:
        self.resumed = 0

    def resume_reading(self) -> None:
        self.resumed += 1


def never_receive() -> GatedReceive:
    """A receive() the link's watch must not use: awaited, it would never return."""
    return GatedReceive()


async def watched_by_link(
    link: ClientLink, ready: asyncio.Event, *, stop_first: bool = False
) -> str:
    # never_receive(): a receive() the link's watch must not use (it would never return).
    return await relay_until_cancelled(
        never_receive(), stop_first=stop_first, scope={LINK_KEY: link}, ready=ready
    )


async def test_the_connection_tells_the_watch_through_the_link() -> None:
    cycle, flow, watched = Cycle(), Flow(), set[ClientLink]()
    link = ClientLink(cycle, flow, watched)
    ready = asyncio.Event()
    task = asyncio.create_task(watched_by_link(link, ready))
    await ready.wait()
    assert watched == {link}  # the connection will tell it when lost
    assert flow.resumed == 1  # reading resumed, as receive() resumes it: a close is seen
    link.lost()
    assert await task == "cancelled by the watch"
    assert task.cancelling() == 0
    assert watched == set()


async def test_a_stopped_link_watch_is_not_told() -> None:
    cycle, flow, watched = Cycle(), Flow(), set[ClientLink]()
    link = ClientLink(cycle, flow, watched)
    ready = asyncio.Event()
    task = asyncio.create_task(watched_by_link(link, ready, stop_first=True))
    await ready.wait()
    assert watched == set()
    link.lost()
    assert await task == "not cancelled"


async def test_a_connection_lost_after_its_response_is_no_disconnect() -> None:
    cycle, flow, watched = Cycle(), Flow(), set[ClientLink]()
    link = ClientLink(cycle, flow, watched)
    told: list[str] = []
    link.watch(lambda: told.append("lost"))
    cycle.response_complete = True
    link.lost()
    assert told == []
    assert watched == set()


def test_the_link_says_when_the_body_is_all_in() -> None:
    cycle = Cycle()
    link = ClientLink(cycle, Flow(), set())
    assert not link.body_in()
    cycle.more_body = False
    assert link.body_in()
