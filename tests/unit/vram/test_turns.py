"""Equals take turns in admission ("Swap in seconds" item 1): two lazy backends of the same
priority that do not fit together alternate instead of the second being refused. The
arbiter with real `Backend`s, gated fake runtimes and the simulated GPU (the rig of
tests/unit/vram/test_arbiter.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.lifecycle.state import BackendState
from tests.fakes.waits import until
from tests.unit.vram.test_arbiter import (
    Rig,
    Rigs,
    rig,
    rigs,
    settle,
    state_of,
    unavailable,
    within,
)

__all__ = ["rig", "rigs"]  # the fixtures, shared with test_arbiter


def swaps(rig: Rig, backend: str, evicted: str) -> float | None:
    return rig.metrics.registry.get_sample_value(
        "microscheduler_swaps_total", {"backend": backend, "evicted": evicted}
    )


async def test_two_equal_lazy_models_that_do_not_fit_together_alternate(rigs: Rigs) -> None:
    rig = rigs.make(total_mib=16000)
    first = await rig.ready("first", vram_mib=11000)
    second = rig.add("second", vram_mib=11000)

    lease = await within(second.requests.acquire())  # was: 503 backend_no_vram, first kept idle
    lease.release()
    assert state_of(first) is BackendState.STOPPED
    assert state_of(second) is BackendState.READY

    lease = await within(first.requests.acquire())  # and back
    lease.release()
    assert state_of(second) is BackendState.STOPPED
    assert state_of(first) is BackendState.READY
    assert swaps(rig, "second", "first") == 1
    assert swaps(rig, "first", "second") == 1


async def test_a_higher_priority_idle_backend_is_not_evicted_by_a_lower_one(rigs: Rigs) -> None:
    rig = rigs.make(total_mib=16000)
    high = await rig.ready("high", vram_mib=11000, priority=60)
    low = rig.add("low", vram_mib=11000, priority=50)
    error = await unavailable(low)
    assert error.kind == "no_vram"
    assert "backend high 11000 MiB (priority 60, not below 50)" in error.message
    assert state_of(high) is BackendState.READY


async def test_a_pinned_equal_is_not_evicted(rigs: Rigs) -> None:
    rig = rigs.make(total_mib=16000)
    pinned = await rig.ready("pinned", vram_mib=11000, pinned=True)
    lazy = rig.add("lazy", vram_mib=11000)
    error = await unavailable(lazy)
    assert "backend pinned 11000 MiB (pinned)" in error.message
    assert state_of(pinned) is BackendState.READY


async def test_a_busy_equal_keeps_the_gpu_until_its_last_request_ends(rigs: Rigs) -> None:
    rig = rigs.make(total_mib=16000)
    first = await rig.ready("first", vram_mib=11000, max_hold_s=600)
    second = rig.add("second", vram_mib=11000)
    serving = [await within(first.requests.acquire()), await within(first.requests.acquire())]

    waiting = asyncio.create_task(second.requests.acquire())
    progress = await until(second.start_progress, what="the start to say what it waits for")
    assert "first is resident for " in progress
    assert "(busy, max_hold_s)" in progress
    serving.pop().release()
    await settle()
    assert state_of(first) is BackendState.READY  # one request still in flight
    more = await within(first.requests.acquire())  # the resident's own requests keep coming
    more.release()
    assert not waiting.done()

    began = time.monotonic()
    serving.pop().release()  # idle: its turn is over, at once (no poll)
    lease = await within(waiting, 2.0)
    assert time.monotonic() - began < 0.5
    lease.release()
    assert state_of(first) is BackendState.STOPPED
    assert swaps(rig, "second", "first") == 1


async def test_a_busy_equal_is_evicted_after_its_hold_its_requests_drained(rigs: Rigs) -> None:
    rig = rigs.make(total_mib=16000)
    first = await rig.ready("first", vram_mib=11000, max_hold_s=0.3)
    second = rig.add("second", vram_mib=11000)
    busy = await within(first.requests.acquire())

    waiting = asyncio.create_task(second.requests.acquire())
    await until(lambda: state_of(first) is BackendState.STOPPING, what="the hold to end")
    assert not waiting.done()  # the drain serves the request in flight first
    busy.release()
    lease = await within(waiting)
    lease.release()
    assert state_of(first) is BackendState.STOPPED
    assert first.last_drain_timed_out is False


async def test_a_start_waiting_for_a_busy_equal_gives_up_at_its_start_timeout(rigs: Rigs) -> None:
    rig = rigs.make(total_mib=16000)
    first = await rig.ready("first", vram_mib=11000, max_hold_s=600)
    second = rig.add("second", vram_mib=11000, start_timeout_s=0.3)
    busy = await within(first.requests.acquire())
    began = time.monotonic()
    # The hold ends later than the start may wait, but the equal may go idle before: the
    # start waits for that up to its start_timeout_s, then gives up.
    error = await unavailable(second)
    assert time.monotonic() - began >= 0.3
    assert error.kind == "no_vram"
    assert "(priority 50 and busy, its turn ends in " in error.message
    assert "longer than this start waits (0.3s, start_timeout_s)" in error.message
    assert state_of(first) is BackendState.READY
    busy.release()


async def test_a_start_waits_for_an_equal_still_starting_then_takes_its_turn(
    rigs: Rigs,
) -> None:
    # Issue 31, 3: b has passed its health check and learns what it serves (its
    # /openapi.json, ~0.6 s on a real server) when a's start plans: b holds its memory but
    # is not ready, so not evictable yet. a waits for b's start, then for b's turn.
    rig = rigs.make(total_mib=16000)
    b = rig.add("turn-b", vram_mib=11000)
    a = rig.add("turn-a", vram_mib=11000)
    rig.health["turn-b"].learn_gate.clear()
    request_b = asyncio.create_task(b.requests.acquire())
    await within(rig.health["turn-b"].learning.wait())
    assert state_of(b) is BackendState.STARTING

    request_a = asyncio.create_task(a.requests.acquire())  # was: 503 backend_no_vram at once
    progress = await until(
        lambda: a.start_progress() or (request_a.done() and repr(request_a.exception())),
        what="a's start to say what it waits for",
    )
    assert progress == "waiting for turn-b's start on GPU 0", progress
    load = a.load()
    assert load is not None
    assert load.phase == "waiting_for_turn"
    assert not request_a.done()
    assert rig.runtimes["turn-a"].starts == 0

    rig.health["turn-b"].learn_gate.set()
    lease_b = await within(request_b)  # b's request first: its turn

    def waits_for_the_turn() -> str | None:
        words = a.start_progress()
        return words if words and "turn-b is resident" in words else None

    turn = await until(waits_for_the_turn, what="a's start to wait for b's turn")
    assert turn.endswith("(busy, max_hold_s)")
    lease_b.release()
    lease_a = await within(request_a)  # then a's: served, no 503
    lease_a.release()
    assert state_of(b) is BackendState.STOPPED
    assert swaps(rig, "turn-a", "turn-b") == 1


async def test_a_start_waiting_for_the_gpu_says_whose_start_holds_it(rigs: Rigs) -> None:
    # One start per GPU: while b launches (minutes on a real server), a's start waits for
    # the GPU's lock; /status said `launching 0%`, as if a were loading.
    rig = rigs.make(total_mib=16000)
    b = rig.add("turn-b", vram_mib=11000)
    a = rig.add("turn-a", vram_mib=11000)
    rig.health["turn-b"].gate.clear()
    request_b = asyncio.create_task(b.requests.acquire())
    await within(rig.health["turn-b"].called.wait())  # launched, not healthy yet

    starting_a = asyncio.create_task(a.start())
    progress = await until(a.start_progress, what="a's start to say what it waits for")
    assert progress == "waiting for turn-b's start on GPU 0"
    load = a.load()
    assert load is not None
    assert load.phase == "waiting_for_turn"
    assert rig.runtimes["turn-a"].starts == 0

    rig.health["turn-b"].gate.set()
    lease_b = await within(request_b)
    lease_b.release()
    await within(starting_a)  # b idle: evicted at once, its turn over
    assert state_of(a) is BackendState.READY
    assert state_of(b) is BackendState.STOPPED
    assert a.server.vram_waited_s > 0  # a request held for it counts the wait as `yield`


async def test_a_start_waiting_for_an_equal_still_starting_gives_up_at_its_start_timeout(
    rigs: Rigs,
) -> None:
    rig = rigs.make(total_mib=16000)
    b = rig.add("turn-b", vram_mib=11000)
    a = rig.add("turn-a", vram_mib=11000, start_timeout_s=0.3)
    rig.health["turn-b"].learn_gate.clear()  # b never gets ready
    request_b = asyncio.create_task(b.requests.acquire())
    await within(rig.health["turn-b"].learning.wait())

    began = time.monotonic()
    error = await unavailable(a)
    assert time.monotonic() - began >= 0.3
    assert error.kind == "no_vram"
    assert "backend turn-b 11000 MiB (starting)" in error.message
    assert error.message.endswith(
        "turn-b is still starting, longer than this start waits (0.3s, start_timeout_s)"
    )
    assert rig.runtimes["turn-a"].starts == 0
    assert state_of(b) is BackendState.STARTING  # untouched
    rig.health["turn-b"].learn_gate.set()
    (await within(request_b)).release()


async def test_a_start_whose_request_left_evicts_nobody_when_the_equal_goes_idle(
    rigs: Rigs,
) -> None:
    # No load nobody waits for (issue 36, point 2): the start waited for a busy equal's
    # turn; its request left (within the start's grace, before any cancel); when the
    # equal goes idle, the start would evict it for nobody: it evicts nothing and ends.
    rig = rigs.make(total_mib=16000)
    first = await rig.ready("first", vram_mib=11000, max_hold_s=600)
    second = rig.add("second", vram_mib=11000)
    busy = await within(first.requests.acquire())
    waiting = asyncio.create_task(second.requests.acquire())
    await until(second.start_progress, what="the start to wait for the busy equal")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    busy.release()  # idle: its turn is over, the start plans again at once
    await until(lambda: state_of(second) is BackendState.STOPPED, what="the start to end")
    assert state_of(first) is BackendState.READY  # not evicted
    assert rig.runtimes["first"].stops == 0
    assert rig.runtimes["second"].starts == 0  # nothing launched
    assert not swaps(rig, "second", "first")
    assert second.reason is not None
    assert "(waiting_for_vram): nobody waits for it" in second.reason
    cancelled = {"backend": "second"}
    assert (
        rig.metrics.registry.get_sample_value("microscheduler_start_cancelled_total", cancelled)
        == 1
    )
