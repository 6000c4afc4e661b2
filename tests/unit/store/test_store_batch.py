"""A batch of usage is written as one upsert per ledger row (day, key, model, route), its
requests and tokens summed first: the ledger reads the same as row by row. Batches keep
one connection while the file stays; a file gone or replaced is seen at the next batch."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from app.activity import Entry, WaitKind
from app.store.base import StoreError, UsageQuery, UsageRow
from app.store.sqlite import SqliteStore, summed_usage


def row(key: str, prompt: int, completion: int, *, cloud: bool = False) -> UsageRow:
    return UsageRow("2026-11-26", key, "m", "cloud" if cloud else "b", cloud, prompt, completion)


def test_a_batch_is_summed_per_ledger_row_before_it_is_written(tmp_path: Path) -> None:
    batch = [
        row("a", 3, 4),
        row("b", 1, 1),
        row("a", 5, 6),
        row("a", 1, 0),
        row("c", 2, 2, cloud=True),
    ]
    assert len(summed_usage(batch)) == 3
    store = SqliteStore(tmp_path)
    store.open()
    store.write_batch(batch, [])
    store.write_batch([row("a", 10, 10)], [])
    by_key = {r["key"]: r for r in store.usage(UsageQuery(group_by="key"))}
    assert by_key["a"]["requests"] == 4
    assert (by_key["a"]["prompt_tokens"], by_key["a"]["completion_tokens"]) == (19, 20)
    assert by_key["b"]["requests"] == 1
    assert by_key["c"]["cloud_tokens"] == 4


def counting_connect(calls: list[str]) -> Callable[[str], sqlite3.Connection]:
    def connect(path: str) -> sqlite3.Connection:
        calls.append(path)
        return sqlite3.connect(path, isolation_level=None)

    return connect


def test_batches_share_one_connection_while_the_file_stays(tmp_path: Path) -> None:
    calls: list[str] = []
    store = SqliteStore(tmp_path, connect=counting_connect(calls))
    store.open()
    opened = len(calls)
    for n in range(5):
        store.write_batch([row("a", n, 0)], [])
    assert len(calls) - opened == 1
    store.close()
    assert store.usage(UsageQuery(group_by="key"))[0]["requests"] == 5


def test_a_batch_after_the_file_was_replaced_writes_to_the_new_one(tmp_path: Path) -> None:
    state = tmp_path / "var"
    store = SqliteStore(state)
    store.open()
    store.write_batch([row("a", 1, 1)], [])
    shutil.rmtree(state)  # the kept connection's file is gone with its directory
    state.write_text("not a directory\n")
    with pytest.raises(StoreError, match=r"state\.db"):
        store.write_batch([row("b", 1, 1)], [])
    state.unlink()  # repaired: an empty directory
    store.write_batch([row("c", 1, 1)], [])
    assert [r["key"] for r in store.usage(UsageQuery(group_by="key"))] == ["c"]
    shutil.rmtree(state)  # removed again: the next batch makes the file anew, schema and all
    store.write_batch([row("d", 1, 1)], [])
    assert [r["key"] for r in store.usage(UsageQuery(group_by="key"))] == ["d"]
    store.close()


def test_a_batch_of_activity_reads_back_exactly_as_written(tmp_path: Path) -> None:
    """The batch's activity goes in as one statement (one JSON array SQLite reads): every
    value comes back with its type, None as None, floats to the last bit, any text."""
    entries = [
        Entry(1764400000.123456789, "family", "qwen", "local", "chat", 200, 12, 34, 0.0,
              WaitKind.NONE, 0, 0.0123456789),
        Entry(1764400001.5, None, None, None, "messages", 401, None, None, 2.31,
              WaitKind.WAKE, 2, 3.0),
        Entry(1764400002.0, "k", 'mo"del\\ é ☃ \n', "cloud", "responses", 200, 0, 0,
              1e-9, WaitKind.LIMIT, 1, 1e6),
    ]  # fmt: skip
    store = SqliteStore(tmp_path)
    store.open()
    store.write_batch([], entries)
    store.write_batch([], [])  # nothing to write: no statement, no error
    back = store.recent_activity(10)
    assert back == entries
    assert [type(e.status) for e in back] == [int, int, int]
    assert [type(e.at) for e in back] == [float, float, float]
