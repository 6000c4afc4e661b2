"""The state file: atomic saves, and unreadable files set aside instead of stopping start-up."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.lifecycle.store import FORMAT_VERSION, StateStore, StateWriteError


def leftovers(directory: Path) -> list[str]:
    """Files in `directory` other than the state file itself (temporary files, backups)."""
    return sorted(p.name for p in directory.iterdir() if p.name != "state.json")


def test_save_then_load_roundtrips(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    zones = [{"name": "comfy", "gpu": 0, "mib": 12000, "expires_at": None, "stopped": ["a"]}]
    store.save({"zones": zones})
    assert store.load() == {"zones": zones, "version": FORMAT_VERSION}
    assert StateStore(tmp_path).load()["zones"] == zones  # a fresh store reads the same file


def test_a_missing_file_loads_as_empty_state(tmp_path: Path) -> None:
    assert StateStore(tmp_path / "nowhere").load() == {}
    assert not (tmp_path / "nowhere").exists()  # loading creates nothing


def test_save_creates_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "var" / "lib" / "microscheduler"
    StateStore(directory).save({"zones": []})
    assert json.loads((directory / "state.json").read_text()) == {
        "zones": [],
        "version": FORMAT_VERSION,
    }


def test_save_replaces_the_file_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save({"zones": [1]})
    store.save({"zones": [2]})
    assert store.load()["zones"] == [2]
    assert leftovers(tmp_path) == []


def test_an_unserialisable_value_keeps_the_previous_state(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save({"zones": ["kept"]})
    before = store.path.read_bytes()
    with pytest.raises(TypeError):
        store.save({"zones": [object()]})
    assert store.path.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_a_failed_replace_removes_the_temporary_file_and_keeps_the_previous_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path)
    store.save({"zones": ["kept"]})
    before = store.path.read_bytes()

    def replace_fails(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError(28, "No space left on device")

    # Fault injection at the OS boundary: the write went to a temporary file, the
    # final rename fails.
    monkeypatch.setattr(os, "replace", replace_fails)
    with pytest.raises(StateWriteError, match="No space left") as info:
        store.save({"zones": ["lost"]})
    assert str(store.path) in info.value.message
    monkeypatch.undo()
    assert store.path.read_bytes() == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "content",
    [
        '{"zones": [',  # truncated
        "not json at all",
        "[1, 2, 3]",  # not an object
        '{"zones": []}',  # no version
        '{"zones": [], "version": 99}',  # a version this gateway does not know
    ],
)
def test_an_unreadable_file_is_set_aside_and_loads_as_empty(tmp_path: Path, content: str) -> None:
    store = StateStore(tmp_path)
    store.path.write_text(content, encoding="utf-8")
    assert store.load() == {}
    assert not store.path.exists()
    assert (tmp_path / "state.corrupt").read_text(encoding="utf-8") == content
    # The next save starts a clean file; the bad one stays for the operator.
    store.save({"zones": []})
    assert store.load() == {"zones": [], "version": FORMAT_VERSION}
    assert (tmp_path / "state.corrupt").read_text(encoding="utf-8") == content


def test_a_file_that_is_not_utf8_is_set_aside_and_loads_as_empty(tmp_path: Path) -> None:
    # Regression: UnicodeDecodeError used to escape load() and stop the gateway's start.
    store = StateStore(tmp_path)
    content = b'{"zones": [], "version": 1}\xff\xfe'
    store.path.write_bytes(content)
    assert store.load() == {}
    assert (tmp_path / "state.corrupt").read_bytes() == content
