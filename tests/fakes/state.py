"""The gateway's saved state as a test reads it: the sections of `state.db`, read with
sqlite3 directly (not through the store under test), and the store's faults."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Final

import pytest

DB: Final = "state.db"
_connect = sqlite3.connect  # the real one, whatever a fault patches later


def saved_sections(state_dir: Path) -> dict[str, Any]:
    """Every section saved in `state_dir/state.db` ({} when there is no database)."""
    path = state_dir / DB
    if not path.exists():
        return {}
    db = _connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {name: json.loads(value) for name, value in db.execute(
            "SELECT name, value FROM sections")}  # fmt: skip
    finally:
        db.close()


def leftovers(state_dir: Path) -> list[str]:
    """Files in the state directory other than the database (and its journal files)."""
    return sorted(p.name for p in state_dir.iterdir() if not p.name.startswith(DB))


def sqlite_disk_full(monkeypatch: pytest.MonkeyPatch) -> str:
    """SQLite's answer on a full disk (SQLITE_FULL), injected at the sqlite3 boundary."""

    def full(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(sqlite3, "connect", full)
    return "database or disk is full"
