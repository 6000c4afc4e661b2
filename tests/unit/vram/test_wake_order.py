"""Wake order after a yield (issue 36, point 5): a restore brings the pinned backends back
one after the other, the most recently used first, each once the one before is ready (or
failed); a yield that comes meanwhile ends the sequence. The arbiter with real `Backend`s,
gated fake runtimes and the simulated GPU (tests/unit/vram/test_arbiter.py's rig)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.events import EventLog
from app.lifecycle.state import BackendState
from app.runtimes.base import RuntimeFailure
from app.vram.yield_answers import RestoreReport, YieldRequest
from app.vram.yielding import VramYield
from tests.fakes.waits import until
from tests.unit.vram.test_arbiter import Rig, rig, rigs, settle, state_of, within

__all__ = ["rig", "rigs"]  # the fixtures, shared with test_arbiter

NAMES = ("a", "b", "c")  # config order
USED = ("b", "a", "c")  # least recently used first: c was used last, then a, then b


@pytest.fixture
async def yielded(rig: Rig) -> AsyncIterator[tuple[Rig, VramYield, EventLog]]:
    """Three pinned backends, used in the order `USED`, taken by a yield; their starts
    held at the runtime's gate from now on."""
    for name in NAMES:
        await rig.ready(name, vram_mib=3000, pinned=True)
    for name in USED:
        (await within(rig.backends[name].requests.acquire())).release()
    events = EventLog()
    vram_yield = VramYield(
        rig.arbiter, rig.backends, rig.metrics, events, settle_timeout_s=1.0, restore_wait_s=0.0
    )
    await within(vram_yield.yield_vram(YieldRequest(reason="game", include_pinned=True)))
    assert {state_of(rig.backends[n]) for n in NAMES} == {BackendState.STOPPED}
    for runtime in rig.runtimes.values():
        runtime.start_gate.clear()
        runtime.start_called.clear()
    yield rig, vram_yield, events
    await vram_yield.close()


def asked(rig: Rig) -> list[str]:
    """The backends whose runtime was asked to start since the yield."""
    return [n for n in NAMES if rig.runtimes[n].start_called.is_set()]


async def test_a_restore_starts_the_most_recently_used_first_one_at_a_time(
    yielded: tuple[Rig, VramYield, EventLog],
) -> None:
    rig, vram_yield, events = yielded
    report = await within(vram_yield.restore())
    assert isinstance(report, RestoreReport)
    assert report.order == ("c", "a", "b")
    assert report.starting == ("c", "a", "b")  # none back yet: it answered at once
    [event] = [e for e in events.recent() if e["kind"] == "vram_restore"]
    assert event["order"] == ["c", "a", "b"]

    for turn, name in enumerate(("c", "a", "b")):
        await within(rig.runtimes[name].start_called.wait())
        await settle()
        assert asked(rig) == sorted(("c", "a", "b")[: turn + 1])  # the next waits its turn
        rig.runtimes[name].start_gate.set()
        await _until_ready(rig, name)
    assert {state_of(rig.backends[n]) for n in NAMES} == {BackendState.READY}


async def test_a_failed_start_lets_the_next_one_go(
    yielded: tuple[Rig, VramYield, EventLog],
) -> None:
    rig, vram_yield, _ = yielded
    await within(vram_yield.restore())
    first = rig.runtimes["c"]
    await within(first.start_called.wait())
    first.start_error = RuntimeFailure("boom")  # its runtime cannot start it
    first.start_gate.set()
    await within(rig.runtimes["a"].start_called.wait())
    assert state_of(rig.backends["c"]) is BackendState.FAILED


async def test_a_yield_during_the_sequence_ends_it(
    yielded: tuple[Rig, VramYield, EventLog],
) -> None:
    rig, vram_yield, _ = yielded
    await within(vram_yield.restore())
    await within(rig.runtimes["c"].start_called.wait())
    outcome = await within(vram_yield.yield_vram(YieldRequest(reason="game", include_pinned=True)))
    assert outcome.already is False
    await settle()
    assert asked(rig) == ["c"]  # a and b were never started
    assert {state_of(rig.backends[n]) for n in NAMES} == {BackendState.STOPPED}

    for runtime in rig.runtimes.values():
        runtime.start_gate.set()
    report = await within(vram_yield.restore())
    assert isinstance(report, RestoreReport)
    assert report.order == ("c", "a", "b")
    for name in NAMES:
        await _until_ready(rig, name)


async def _until_ready(rig: Rig, name: str) -> None:
    backend = rig.backends[name]
    await until(lambda: state_of(backend) is BackendState.READY, what=f"{name} ready")
