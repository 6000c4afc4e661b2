"""The state store (state.db): sections saved all or nothing, the schema versioned and
migrated, an earlier version's state.json imported once, and unreadable files set aside
instead of stopping start-up."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from app.lifecycle.store import StateStore, StateWriteError
from app.store import sqlite as store_sqlite
from app.store.sqlite import MIGRATIONS, SqliteStore
from tests.fakes.state import leftovers, saved_sections, sqlite_disk_full

ZONES = [{"name": "comfy", "gpu": 0, "mib": 12000, "expires_at": None, "stopped": ["a"]}]
YIELD = [{"name": "yield", "kind": "yield", "stopped": ["lazy"]}]


def test_save_then_load_roundtrips(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save({"zones": ZONES})
    assert store.load() == {"zones": ZONES}
    assert StateStore(tmp_path).load()["zones"] == ZONES  # a fresh store reads the same file
    assert saved_sections(tmp_path) == {"zones": ZONES}


def test_save_creates_the_directory_and_leaves_nothing_else(tmp_path: Path) -> None:
    directory = tmp_path / "var" / "lib" / "microscheduler"
    store = StateStore(directory)
    store.save({"zones": [1]})
    store.save({"zones": [2]})
    assert saved_sections(directory) == {"zones": [2]}
    assert leftovers(directory) == []


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_directory_and_the_database_files_are_private(tmp_path: Path) -> None:
    # Usage and activity name every client key: 0700 and 0600 whatever the umask.
    old_umask = os.umask(0o022)
    try:
        directory = tmp_path / "var"
        store = StateStore(directory)
        store.update("zones", ZONES)
        reader = sqlite3.connect(directory / "state.db")  # open: the -wal and -shm stay
        try:
            reader.execute("SELECT count(*) FROM sections").fetchone()
            store.update("zones", [])
            files = sorted(p.name for p in directory.iterdir())
            modes = {p.name: mode(p) for p in directory.iterdir()}
        finally:
            reader.close()
        assert mode(directory) == 0o700
        assert files == ["state.db", "state.db-shm", "state.db-wal"]
        assert modes == dict.fromkeys(files, 0o600)
        # An earlier version's loose directory and file are tightened at the next open.
        directory.chmod(0o755)
        for path in directory.iterdir():
            path.chmod(0o644)
        StateStore(directory).load()
        assert mode(directory) == 0o700
        assert {p.name: mode(p) for p in directory.iterdir()} == {"state.db": 0o600}
    finally:
        os.umask(old_umask)


def test_a_save_replaces_every_section_at_once(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.update("zones", ZONES)
    store.update("profile", "day")
    store.put("zones", [])
    assert saved_sections(tmp_path) == {"zones": [], "profile": "day"}


def test_an_unserialisable_value_keeps_the_previous_state(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.update("zones", ["kept"])
    with pytest.raises(StateWriteError, match="not JSON serializable"):
        store.update("zones", [object()])
    assert store.section("zones") == ["kept"]
    assert saved_sections(tmp_path) == {"zones": ["kept"]}


def test_a_failed_write_changes_nothing_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path)
    store.update("zones", ["kept"])
    sqlite_disk_full(monkeypatch)
    with pytest.raises(StateWriteError, match="disk is full") as info:
        store.update("zones", ["lost"])
    assert str(tmp_path / "state.db") in info.value.message
    monkeypatch.undo()
    assert store.section("zones") == ["kept"]
    assert saved_sections(tmp_path) == {"zones": ["kept"]}


def test_the_schema_is_versioned_and_each_migration_runs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    def v2(db: sqlite3.Connection) -> None:
        ran.append("v2")
        db.execute("CREATE TABLE later (x INTEGER)")

    store = SqliteStore(tmp_path)
    store.open()
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(len(MIGRATIONS),)]
    db.close()
    monkeypatch.setattr(store_sqlite, "MIGRATIONS", (*MIGRATIONS, v2))
    for _ in range(3):
        SqliteStore(tmp_path).open()
    assert ran == ["v2"]
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(len(MIGRATIONS) + 1,)]
    db.close()


def test_a_database_from_a_later_version_is_refused_not_overwritten(tmp_path: Path) -> None:
    SqliteStore(tmp_path).open()
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(StateWriteError, match="schema version 99 is newer"):
        StateStore(tmp_path).load()
    assert (tmp_path / "state.db").exists()


def test_a_state_json_is_imported_once_then_renamed(tmp_path: Path) -> None:
    old = {"zones": YIELD, "profile": "gaming", "processes": {}, "version": 1}
    (tmp_path / "state.json").write_text(json.dumps(old), encoding="utf-8")
    store = StateStore(tmp_path)
    assert store.section("zones") == YIELD
    assert store.section("profile") == "gaming"
    assert not (tmp_path / "state.json").exists()
    assert json.loads((tmp_path / "state.json.migrated").read_text()) == old
    assert saved_sections(tmp_path) == {"zones": YIELD, "profile": "gaming", "processes": {}}
    # Later starts read the database.
    assert StateStore(tmp_path).section("zones") == YIELD


@pytest.mark.parametrize(
    "content",
    [
        b'{"zones": [',  # truncated
        b"not json at all",
        b"[1, 2, 3]",  # not an object
        b'{"zones": []}',  # no version
        b'{"zones": [], "version": 99}',  # a version this gateway does not know
        b'{"zones": [], "version": 1}\xff\xfe',  # not UTF-8
    ],
)
def test_an_unreadable_state_json_is_set_aside_and_nothing_imported(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / "state.json").write_bytes(content)
    store = StateStore(tmp_path)
    assert store.load() == {}
    assert not (tmp_path / "state.json").exists()
    assert (tmp_path / "state.corrupt").read_bytes() == content
    store.update("zones", [])
    assert StateStore(tmp_path).load() == {"zones": []}


@pytest.mark.parametrize(
    "content",
    [b"not a database at all, not even close" * 200, b"SQLite format 3\x00" + b"\x00" * 4000],
)
def test_an_unreadable_database_is_set_aside_and_starts_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    (tmp_path / "state.db").write_bytes(content)
    store = StateStore(tmp_path)
    assert store.load() == {}
    assert (tmp_path / "state.db.corrupt").read_bytes() == content
    assert any("state database unreadable, set aside" in r.getMessage() for r in caplog.records)
    store.update("zones", ZONES)
    assert StateStore(tmp_path).load() == {"zones": ZONES}
    assert (tmp_path / "state.db.corrupt").read_bytes() == content  # kept for the operator
