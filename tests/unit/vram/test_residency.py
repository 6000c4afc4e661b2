"""min_resident_s in admission: a start that needs a protected backend's memory waits for
the protection to end, then evicts it; zones and the yield force past it. The arbiter with
real `Backend`s, gated fake runtimes and the simulated GPU (tests/unit/vram/test_arbiter.py's
rig). Protections last a few tenths of a second of real time: the thing under test is a
clock.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from app.errors import BackendUnavailable
from app.events import EventLog
from app.lifecycle.state import BackendState
from app.vram.residency import protected_for_s
from app.vram.yield_answers import YieldRequest
from app.vram.yielding import VramYield
from tests.fakes.waits import until
from tests.unit.vram.test_arbiter import Rig, rig, rigs, settle, state_of, within

__all__ = ["rig", "rigs"]  # the fixtures, shared with test_arbiter

PROTECTED_S = 0.4


def swaps(rig: Rig, backend: str, evicted: str) -> float | None:
    return rig.metrics.registry.get_sample_value(
        "microscheduler_swaps_total", {"backend": backend, "evicted": evicted}
    )


def swap_wait(rig: Rig, backend: str, stat: str) -> float | None:
    return rig.metrics.registry.get_sample_value(
        f"microscheduler_swap_wait_seconds_{stat}", {"backend": backend}
    )


async def test_a_start_waits_for_a_protected_resident_then_evicts_it(rig: Rig) -> None:
    resident = await rig.ready("resident", vram_mib=16000, priority=10, min_resident_s=PROTECTED_S)
    assert resident.ready_since is not None
    protected_until = resident.ready_since + PROTECTED_S
    starter = rig.add("starter", vram_mib=16000, priority=50)

    starting = asyncio.create_task(starter.start())
    progress = await until(starter.start_progress, what="the start to say what it waits for")
    assert progress.startswith("waiting for VRAM: resident is resident for ")
    assert progress.endswith("s more (min_resident_s)")
    # The resident keeps serving meanwhile: a request gets a lease at once, no start.
    lease = await within(resident.requests.acquire(), 0.1)
    assert state_of(resident) is BackendState.READY
    assert rig.runtimes["starter"].starts == 0
    lease.release()

    await within(starting)
    assert time.monotonic() >= protected_until
    assert state_of(starter) is BackendState.READY
    assert state_of(resident) is BackendState.STOPPED
    assert resident.reason is not None
    assert resident.reason.endswith("(eviction)")
    assert rig.stops("resident", "eviction") == 1.0
    assert swaps(rig, "starter", "resident") == 1.0
    assert swap_wait(rig, "starter", "count") == 1.0
    waited = swap_wait(rig, "starter", "sum")
    assert waited is not None
    assert PROTECTED_S * 0.5 < waited < 5.0
    assert rig.placed() == {0: 16000}


async def test_a_request_in_flight_at_the_end_of_the_protection_is_drained_first(
    rig: Rig,
) -> None:
    resident = await rig.ready("resident", vram_mib=16000, priority=10, min_resident_s=PROTECTED_S)
    starter = rig.add("starter", vram_mib=16000, priority=50)
    lease = await within(resident.requests.acquire())

    starting = asyncio.create_task(starter.start())
    await until(lambda: resident.state is BackendState.STOPPING, what="the eviction")
    assert protected_for_s(resident) == 0.0
    await settle()
    assert rig.runtimes["resident"].stops == 0  # its request is still being answered
    lease.release()
    await within(starting)
    assert state_of(starter) is BackendState.READY
    assert rig.runtimes["resident"].stops == 1


async def test_an_unprotected_resident_is_evicted_before_a_protected_one(rig: Rig) -> None:
    # "protected" is the lower priority, so without min_resident_s it would go first.
    await rig.ready("protected", vram_mib=8000, priority=5, min_resident_s=60)
    free = await rig.ready("free", vram_mib=8000, priority=20)
    starter = rig.add("starter", vram_mib=16000, priority=50)
    await within(starter.start())
    assert state_of(free) is BackendState.STOPPED
    assert state_of(rig.backends["protected"]) is BackendState.READY
    assert swaps(rig, "starter", "free") == 1.0
    assert swaps(rig, "starter", "protected") is None


async def test_other_starts_that_fit_are_not_held_up_by_the_wait(rig: Rig) -> None:
    await rig.ready("resident", vram_mib=16000, priority=10, min_resident_s=60)
    waiting = rig.add("waiting", vram_mib=16000, priority=50, start_timeout_s=120)
    small = rig.add("small", vram_mib=4000, priority=50)
    starting = asyncio.create_task(waiting.start())
    await until(waiting.start_progress, what="the start to wait for min_resident_s")
    # The wait holds no GPU lock: a start that fits goes ahead, and says nothing of it.
    await within(small.start(), 1.0)
    assert state_of(small) is BackendState.READY
    assert not starting.done()
    assert swap_wait(rig, "small", "count") == 0.0
    starting.cancel()


async def test_a_protection_longer_than_the_start_may_wait_is_refused_at_once(
    rig: Rig,
) -> None:
    await rig.ready("resident", vram_mib=16000, priority=10, min_resident_s=600)
    starter = rig.add("starter", vram_mib=16000, priority=50, start_timeout_s=30)
    with pytest.raises(BackendUnavailable) as info:
        await within(starter.start(), 1.0)
    assert info.value.kind == "no_vram"
    message = info.value.message
    assert "backend resident 16000 MiB (min_resident_s, " in message
    assert "resident stay resident for 600s more (min_resident_s), longer than this start " in (
        message
    )
    assert "(30s, start_timeout_s)" in message
    assert state_of(rig.backends["resident"]) is BackendState.READY
    assert rig.runtimes["starter"].starts == 0
    assert swap_wait(rig, "starter", "count") == 0.0


async def test_a_zone_during_the_wait_evicts_the_protected_resident_at_once(rig: Rig) -> None:
    resident = await rig.ready("resident", vram_mib=16000, priority=10, min_resident_s=60)
    starter = rig.add("starter", vram_mib=16000, priority=50, start_timeout_s=120)
    starting = asyncio.create_task(starter.start())
    await until(starter.start_progress, what="the start to wait for min_resident_s")

    grant = await rig.zone(16000)  # does not wait for the protection, nor for the start
    assert grant.zone.stopped == ("resident",)
    assert state_of(resident) is BackendState.STOPPED
    assert rig.stops("resident", "zone") == 1.0

    # The waiting start plans again and finds the zone in the way: a clear refusal.
    with pytest.raises(BackendUnavailable) as info:
        await within(starting)
    assert info.value.kind == "no_vram"
    assert "zone comfy (holder comfyui) 16000 MiB" in info.value.message
    assert rig.runtimes["starter"].starts == 0
    assert not swaps(rig, "starter", "resident")


async def test_a_yield_during_the_wait_cancels_the_waiting_start(rig: Rig) -> None:
    resident = await rig.ready("resident", vram_mib=16000, priority=10, min_resident_s=60)
    starter = rig.add("starter", vram_mib=16000, priority=50, start_timeout_s=120)
    starting = asyncio.create_task(starter.start())
    await until(starter.start_progress, what="the start to wait for min_resident_s")
    vram_yield = VramYield(rig.arbiter, rig.backends, rig.metrics, EventLog(), settle_timeout_s=1.0)

    outcome = await within(vram_yield.yield_vram(YieldRequest(reason="gaming")))
    assert set(outcome.zone.stopped) == {"resident", "starter"}
    assert state_of(resident) is BackendState.STOPPED
    assert state_of(starter) is BackendState.STOPPED
    assert starter.start_progress() is None
    with pytest.raises(BackendUnavailable):
        await within(starting)
    assert rig.runtimes["starter"].starts == 0
    assert rig.placed() == {0: outcome.zone.mib}


async def test_residency_is_counted_from_ready_and_only_for_lazy_backends(rig: Rig) -> None:
    lazy = await rig.ready("lazy", vram_mib=4000, min_resident_s=30)
    assert 29 < protected_for_s(lazy) <= 30
    assert lazy.ready_since is not None
    assert protected_for_s(lazy, lazy.ready_since + 31) == 0.0
    plain = await rig.ready("plain", vram_mib=4000)
    assert protected_for_s(plain) == 0.0
    pinned = await rig.ready("pinned", vram_mib=4000, pinned=True)
    assert protected_for_s(pinned) == 0.0
