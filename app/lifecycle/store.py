"""The gateway's small persistent state (VRAM zones and yield, the active GPU profile, the
process backends it started), one JSON file, atomic writes.

A write goes to a temporary file in the same directory, is fsynced, then replaces the
old file with `os.replace`, so a crash leaves the old or the new state, never half of
one. A file that cannot be read is reported and set aside (renamed `*.corrupt`), and the
gateway starts with empty state rather than not at all.

A write that fails (the directory read-only, missing or full) raises `StateWriteError`,
an OpenAI-envelope 500 naming the path and the OS error; the in-memory state stays what
the file holds. `check_writable()` lets a caller find that out before it acts (a zone
acquire or a yield checks before it stops anything).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from app.errors import GatewayError
from app.runtimes.process_record import ProcessRecord

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
FORMAT_VERSION = 1


class StateWriteError(GatewayError):
    """The state file could not be written: 500, `internal_error`, naming the path and the
    OS error. Nothing was changed (in memory or on disk)."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(f"cannot save the gateway state to {path}: {_describe(exc)}")
        self.path = path


def _describe(exc: OSError) -> str:
    if exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"[Errno {exc.errno}] {exc.strerror}{where}"
    return str(exc) or type(exc).__name__


class StateStore:
    """Sections (`zones`, `profile`, ...) owned by different parts of the gateway, saved
    together: `update(section, value)` rewrites the file with that section replaced."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / STATE_FILE
        self._data: dict[str, Any] | None = None

    def names(self) -> list[str]:
        """The sections the file holds."""
        if self._data is None:
            self._data = self.load()
        return sorted(self._data)

    def section(self, name: str, default: Any = None) -> Any:
        if self._data is None:
            self._data = self.load()
        return self._data.get(name, default)

    def update(self, name: str, value: Any) -> None:
        if self._data is None:
            self._data = self.load()
        data = {**self._data, name: value}
        self.save(data)  # raises StateWriteError: then nothing changed
        self._data = data

    def check_writable(self) -> None:
        """Write and remove a temporary file next to the state file, fsynced, so a
        read-only, missing or full directory is found before anything acts on it; raises
        `StateWriteError`."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".state-check-", dir=self.path.parent)
        except OSError as exc:
            raise StateWriteError(self.path, exc) from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write("{}\n")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise StateWriteError(self.path, exc) from None
        finally:
            Path(tmp).unlink(missing_ok=True)

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            version = data.get("version")
            if type(version) is not int or version != FORMAT_VERSION:  # `true` is not 1
                raise ValueError(f"expected version {FORMAT_VERSION}, found {version!r}")
        except FileNotFoundError:
            return {}
        except ValueError as exc:  # bad JSON, bad UTF-8, wrong shape or version
            aside = self.path.with_suffix(".corrupt")
            os.replace(self.path, aside)
            logger.error("state file unreadable, set aside path=%s moved_to=%s error=%s",
                         self.path, aside, exc)  # fmt: skip
            return {}
        return data

    def save(self, data: dict[str, Any]) -> None:
        """Write `data` (plus the format version) atomically; an OS error is raised as
        `StateWriteError` with no temporary file left behind."""
        payload = json.dumps({**data, "version": FORMAT_VERSION}, indent=2, sort_keys=True)
        try:
            self._write(payload)
        except OSError as exc:
            raise StateWriteError(self.path, exc) from None

    def _write(self, payload: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


PROCESSES = "processes"


class ProcessRecords:
    """The `processes` section: one record per process backend the gateway started
    (`app.runtimes.process_record`), so that a crashed gateway's servers are found again.
    A write that fails is logged, not raised: the process runs all the same, only its
    adoption after a crash is lost."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    def records(self) -> dict[str, ProcessRecord]:
        raw = self._store.section(PROCESSES, {})
        found: dict[str, ProcessRecord] = {}
        for name, data in raw.items() if isinstance(raw, dict) else ():
            record = ProcessRecord.from_json(data)
            if record is None or record.backend != name:
                logger.warning("process record unreadable, ignored backend=%s", name)
                continue
            found[name] = record
        return found

    def put(self, record: ProcessRecord) -> None:
        raw = self._store.section(PROCESSES, {})
        self._save({**(raw if isinstance(raw, dict) else {}), record.backend: record.to_json()})

    def drop(self, backend: str) -> None:
        raw = self._store.section(PROCESSES, {})
        if isinstance(raw, dict) and backend in raw:
            self._save({name: data for name, data in raw.items() if name != backend})

    def _save(self, section: dict[str, Any]) -> None:
        try:
            self._store.update(PROCESSES, section)
        except StateWriteError as exc:
            logger.error("cannot save process records; a crash would leave them orphaned "
                         "error=%s", exc.message)  # fmt: skip
