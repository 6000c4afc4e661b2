"""The rebuild gates: a request waits while a backend it may use is rebuilt, and no
longer than its patience."""

from __future__ import annotations

import asyncio

from app.routing.rebuilds import Rebuilds


async def test_a_request_waits_for_the_rebuilt_backend_only() -> None:
    rebuilds = Rebuilds()
    assert not rebuilds.active
    await asyncio.wait_for(rebuilds.settled(["a"], 5), 1)  # nothing rebuilt: at once
    rebuilds.begin(["a"])
    assert rebuilds.active
    assert "a" in rebuilds
    await asyncio.wait_for(rebuilds.settled(["b"], 5), 1)  # another backend: at once
    held = asyncio.create_task(rebuilds.settled(["b", "a"], 5))
    await asyncio.sleep(0.05)
    assert not held.done()
    rebuilds.end("a")
    await asyncio.wait_for(held, 1)
    assert not rebuilds.active


async def test_a_hold_ends_at_the_requests_patience() -> None:
    rebuilds = Rebuilds()
    rebuilds.begin(["a"])
    await asyncio.wait_for(rebuilds.settled(["a"], 0.05), 1)  # returns: the caller goes on
    assert "a" in rebuilds  # still being rebuilt
    rebuilds.end_all()
    assert not rebuilds.active
