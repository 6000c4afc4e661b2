"""`StateStore.put` on the event loop queues its save and goes on: a start, a wake or a
release never waits for the disk. The saves keep their order; the store says when one
failed, once it has."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.lifecycle.store import StateStore
from app.store.base import StoreError
from app.store.sqlite import SqliteStore
from tests.fakes.state import saved_sections
from tests.unit.lifecycle.test_state_store_behind import broken


def busy(store: StateStore) -> threading.Event:
    """Hold the store's one thread until the returned event is set."""
    gate = threading.Event()
    store.writer.submit(gate.wait, 10)
    return gate


async def test_put_does_not_wait_for_the_disk_and_its_saves_keep_their_order(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "var"
    store = StateStore(directory)
    store.update("zones", [{"name": "img"}])  # a new hold: saved before it acts
    gate = busy(store)
    # The thread is held: a waiting put would hang here (10 s), a queued one returns.
    for n in range(3):
        store.put("durations", {"llm": n})
    store.put("zones", [])
    assert store.section("durations") == {"llm": 2}  # memory at once
    assert saved_sections(directory) == {"zones": [{"name": "img"}]}  # the disk not yet
    gate.set()
    await store.settled()
    assert saved_sections(directory) == {"zones": [], "durations": {"llm": 2}}
    assert store.persisted is True
    await store.close()


async def test_a_queued_save_that_fails_is_taken_up_on_the_loop(tmp_path: Path) -> None:
    directory = tmp_path / "var"
    store = StateStore(directory, retry_first_s=60.0)
    store.update("zones", [{"name": "img"}])
    broken(directory)
    store.put("zones", [])
    assert store.persisted is True  # not known yet: the save is queued
    await store.settled()
    assert store.persisted is False
    assert "cannot save the gateway state to" in (store.status()["error"] or "")
    await store.close()


def test_opening_a_store_whose_old_file_cannot_be_set_aside_raises_store_error_only(
    tmp_path: Path,
) -> None:
    """An earlier version's unreadable `state.json` that cannot be set aside (here a
    directory stands where it goes: `os.replace` fails, for root too) was a raw OSError
    out of `open`, which crashed the start."""
    directory = tmp_path / "var"
    directory.mkdir()
    (directory / "state.json").write_text("not json\n")
    (directory / "state.corrupt").mkdir()
    (directory / "state.corrupt" / "keep").write_text("")
    with pytest.raises(StoreError, match=r"cannot open .*state\.db: "):
        SqliteStore(directory).open()
