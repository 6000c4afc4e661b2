"""A yield's hold is saved before it acts, on the store's thread, with the event loop
serving meanwhile (issue 35, item 1): the yield, and a holder joining one, await the save
(`StateStore.hold`, `ZoneBook.hold_zone`) instead of blocking the loop until the disk is
done. The store's one thread is held here by a gate the test itself opens: that the test
could open it (`opened == [True]`) is what shows the loop kept running during the save.
The arbiter rig of tests/unit/vram/test_arbiter.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.events import EventLog
from app.lifecycle.state import BackendState
from app.lifecycle.store import StateStore, StateWriteError
from app.vram.yield_answers import YieldRequest
from app.vram.yielding import VramYield
from app.vram.zone_book import ZoneBook
from app.vram.zones import YIELD_ZONE, Zone
from tests.fakes.state import saved_sections
from tests.unit.lifecycle.test_state_store_behind import broken
from tests.unit.vram.test_arbiter import Rig, rig, rigs, settle, state_of, within

__all__ = ["rig", "rigs"]  # the fixtures, shared with test_arbiter

GATE_S = 5.0  # the longest the store's thread is held when the test cannot open the gate


def hold_the_store(store: StateStore) -> tuple[threading.Event, list[bool]]:
    """Hold the store's one thread until the returned event is set (at most GATE_S). The
    list gets True when it was set in time, False when the wait ran out."""
    gate = threading.Event()
    opened: list[bool] = []
    store.writer.submit(lambda: opened.append(gate.wait(GATE_S)))
    return gate, opened


@pytest.fixture
async def vram_yield(rig: Rig) -> AsyncIterator[VramYield]:
    await rig.ready("a", vram_mib=3000)  # lazy: in the yield's scope
    taken = VramYield(rig.arbiter, rig.backends, rig.metrics, EventLog(), settle_timeout_s=1.0)
    yield taken
    await taken.close()


async def test_a_yield_waits_for_its_save_while_the_loop_serves(
    rig: Rig, vram_yield: VramYield
) -> None:
    gate, opened = hold_the_store(rig.store)
    task = asyncio.create_task(vram_yield.yield_vram(YieldRequest(reason="game")))
    await settle()
    # The store's thread is busy: the yield waits for it before it acts (nothing stopped).
    assert not task.done()
    assert state_of(rig.backends["a"]) is BackendState.READY
    gate.set()  # this test ran while the yield waited: the loop was not blocked
    outcome = await within(task)
    assert opened == [True]  # the old code blocked the loop until the wait ran out: [False]
    assert state_of(rig.backends["a"]) is BackendState.STOPPED
    assert rig.store.load()["zones"] == [outcome.zone.to_json()]


async def test_a_holder_joining_the_yield_waits_for_its_save_while_the_loop_serves(
    rig: Rig, vram_yield: VramYield
) -> None:
    await within(vram_yield.yield_vram(YieldRequest(reason="game")))
    gate, opened = hold_the_store(rig.store)
    task = asyncio.create_task(vram_yield.yield_vram(YieldRequest(reason="render")))
    await settle()
    assert not task.done()
    assert vram_yield.current is not None
    assert vram_yield.current.holders == ("game",)  # not held for render before it is saved
    gate.set()
    outcome = await within(task)
    assert opened == [True]
    assert outcome.already is True
    assert outcome.zone.holders == ("game", "render")
    assert rig.store.load()["zones"] == [outcome.zone.to_json()]


def zone(name: str) -> Zone:
    return Zone(name, holder="x", gpu=0, mib=1000, granted_at=1.0, expires_at=None, stopped=())


async def test_a_zone_dropped_while_another_is_saved_is_gone_from_the_file_too(
    tmp_path: Path,
) -> None:
    """The drop's save is queued behind the hold's and leaves the new zone out: the
    book saves what memory holds after the hold (both zones would be lost or kept wrong
    otherwise)."""
    directory = tmp_path / "var"
    store = StateStore(directory)
    book = ZoneBook(store)
    await book.hold_zone(zone("old"))
    gate, _ = hold_the_store(store)
    task = asyncio.create_task(book.hold_zone(zone("new")))
    await settle()
    assert book.drop_zone("old", "released") is not None  # during the save
    gate.set()
    await within(task)
    await within(store.settled())
    assert list(book.zones) == ["new"]
    assert saved_sections(directory)["zones"] == [zone("new").to_json()]
    await store.close()


async def test_a_cancelled_hold_leaves_the_file_as_memory_is(tmp_path: Path) -> None:
    directory = tmp_path / "var"
    store = StateStore(directory)
    book = ZoneBook(store)
    gate, _ = hold_the_store(store)
    task = asyncio.create_task(book.hold_zone(zone(YIELD_ZONE)))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()
    await within(store.settled())
    assert book.zones == {}
    assert saved_sections(directory).get("zones", []) == []
    await store.close()


async def test_hold_keeps_what_put_changed_in_another_section_meanwhile(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "var"
    store = StateStore(directory)
    gate, _ = hold_the_store(store)
    task = asyncio.create_task(store.hold("zones", [{"name": "img"}]))
    await settle()
    store.put("durations", {"llm": 2})  # another section, during the hold's save
    gate.set()
    await within(task)
    await within(store.settled())
    assert store.section("durations") == {"llm": 2}
    assert store.section("zones") == [{"name": "img"}]
    assert saved_sections(directory) == {"zones": [{"name": "img"}], "durations": {"llm": 2}}
    await store.close()


async def test_a_hold_that_cannot_be_saved_raises_and_changes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "var"
    store = StateStore(directory, retry_first_s=60.0)
    book = ZoneBook(store)
    await within(book.hold_zone(zone("old")))
    broken(directory)
    with pytest.raises(StateWriteError):
        await within(book.hold_zone(zone("new")))
    assert list(book.zones) == ["old"]
    assert store.section("zones") == [zone("old").to_json()]
    assert store.persisted is True  # nothing was changed, so nothing is behind
    await store.close()


async def test_a_hold_on_a_store_not_read_at_start_is_refused_as_such(tmp_path: Path) -> None:
    directory = tmp_path / "var"
    broken(directory)  # before the first read: the gateway runs on empty state
    store = StateStore(directory)
    with pytest.raises(StateWriteError, match="could not be read at start"):
        await within(store.hold("zones", [{"name": "img"}]))
    assert store.section("zones") is None
    await store.close()


async def test_a_zone_grant_waits_for_its_save_while_the_loop_serves(rig: Rig) -> None:
    await rig.ready("a", vram_mib=3000)
    gate, opened = hold_the_store(rig.store)
    task = asyncio.create_task(
        rig.arbiter.acquire_zone(
            "img", holder="comfy", mib=22000, gpu=0, ttl_s=None, below_priority=None
        )
    )
    await settle()
    assert not task.done()  # its writability check waits for the store's thread
    assert state_of(rig.backends["a"]) is BackendState.READY  # nothing stopped before it
    gate.set()  # this test ran while the grant waited: the loop was not blocked
    grant = await within(task)
    assert opened == [True]  # the old code blocked the loop until the wait ran out: [False]
    assert grant.zone.stopped == ("a",)
    assert rig.store.load()["zones"] == [grant.zone.to_json()]
