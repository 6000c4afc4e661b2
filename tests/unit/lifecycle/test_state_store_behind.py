"""`StateStore.put`: the end of a hold takes effect in memory whatever the disk says; the
save is retried with a bounded, doubling delay, and the store says it is behind."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from app.lifecycle.metrics import LifecycleMetrics as Metrics
from app.lifecycle.store import StateStore, StateWriteError
from tests.fakes.state import saved_sections
from tests.fakes.waits import until


def broken(directory: Path) -> None:
    """A state directory nothing can be written under, for any user (root included)."""
    directory.mkdir(exist_ok=True)
    for child in directory.iterdir():
        child.unlink()
    directory.rmdir()
    directory.write_text("not a directory\n")


def repaired(directory: Path) -> None:
    directory.unlink()
    directory.mkdir()


def on_disk(store: StateStore) -> dict[str, object]:
    return saved_sections(Path(store.location).parent)


def failures(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("microscheduler_state_save_failures_total")
    assert value is not None
    return value


async def test_put_takes_effect_and_the_retry_writes_it_once_the_disk_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "var"
    metrics = Metrics()
    changes: list[bool] = []
    store = StateStore(
        directory,
        metrics=metrics,
        on_change=lambda: changes.append(store.persisted),
        retry_first_s=0.01,
        retry_max_s=0.04,
    )
    store.update("zones", [{"name": "yield"}])
    broken(directory)

    store.put("zones", [])  # no exception: the hold ended
    assert store.section("zones") == []
    await store.settled()  # the save was queued, not waited for
    assert store.persisted is False
    status = store.status()
    assert status["persisted"] is False
    assert store.location in str(status["error"])
    assert metrics.registry.get_sample_value("microscheduler_state_persisted") == 0
    assert changes == [False]

    # Retried while it fails, the delay doubling up to the bound.
    assert await until(lambda: failures(metrics) >= 5, what="five failed saves")
    delays = [
        float(m.group(1))
        for r in caplog.records
        if (m := re.search(r"next_in_s=([0-9.]+)", r.getMessage()))
    ]
    assert delays[:3] == [0.02, 0.04, 0.04]
    # A new hold is still refused, and changes nothing.
    with pytest.raises(StateWriteError):
        store.update("profile", "gaming")
    assert store.section("profile") is None

    repaired(directory)
    assert await until(lambda: store.persisted, what="the retried save")
    assert on_disk(store)["zones"] == []
    assert store.status()["error"] is None
    assert metrics.registry.get_sample_value("microscheduler_state_persisted") == 1
    assert changes == [False, True]
    # A restart reads the ended hold, not the one before it.
    assert StateStore(directory).section("zones") == []
    await store.close()


async def test_a_later_save_that_works_writes_what_was_pending(tmp_path: Path) -> None:
    directory = tmp_path / "var"
    store = StateStore(directory, retry_first_s=60.0)  # the retry would come too late
    store.update("zones", [{"name": "img"}])
    broken(directory)
    store.put("zones", [])
    await store.settled()
    repaired(directory)
    store.update("profile", "day")  # a new hold, saved: the whole state goes with it
    assert store.persisted is True
    assert on_disk(store)["zones"] == []
    await store.close()


async def test_close_saves_what_is_pending_or_says_it_could_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "var"
    store = StateStore(directory, retry_first_s=60.0)
    store.update("zones", [{"name": "img"}])
    broken(directory)
    store.put("zones", [])
    await store.settled()
    with caplog.at_level(logging.ERROR, logger="app.lifecycle.store"):
        await store.close()
    assert any("not saved at shutdown" in r.getMessage() for r in caplog.records)

    store = StateStore(tmp_path / "other", retry_first_s=60.0)
    store.update("zones", [{"name": "img"}])
    broken(tmp_path / "other")
    store.put("zones", [])
    await store.settled()  # its save failed in the store's thread (not racing the repair)
    repaired(tmp_path / "other")
    await store.close()
    assert store.persisted is True
    assert on_disk(store)["zones"] == []


def test_put_without_a_running_loop_keeps_the_change_for_the_next_save(tmp_path: Path) -> None:
    directory = tmp_path / "var"
    store = StateStore(directory)
    store.update("zones", [{"name": "img"}])
    broken(directory)
    store.put("zones", [])  # a synchronous caller: no retry task, no exception
    assert store.section("zones") == []
    assert store.persisted is False
    repaired(directory)
    store.put("other", 1)
    assert store.persisted is True
    assert on_disk(store)["zones"] == []
