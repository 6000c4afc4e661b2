"""The gateway's small persistent state (VRAM zones and yield, the active GPU profile, the
process backends it started), one JSON file, atomic writes.

A write goes to a temporary file in the same directory, is fsynced, then replaces the
old file with `os.replace`, so a crash leaves the old or the new state, never half of
one. A file that cannot be read is reported and set aside (renamed `*.corrupt`), and the
gateway starts with empty state rather than not at all.

Two kinds of change, two answers to a write that fails (the directory read-only,
missing or full):

- `update()` (a new hold: a zone acquired, a yield taken, a profile switched) is refused:
  `StateWriteError`, an OpenAI-envelope 500 naming the path and the OS error, and the
  in-memory state stays what it was. `check_writable()` finds that out before the caller
  acts (a zone acquire or a yield checks before it stops anything).
- `put()` (the end of a hold: a release, a restore, an expiry) always takes effect in
  memory, since refusing it would keep backends blocked (and their traffic on paid
  providers) because of a full disk. The file is then behind: a warning is logged,
  `microscheduler_state_save_failures_total` counts it, `status()` (in `/status`) says
  `persisted: false` with the error, and a background task retries the save with a
  doubling delay (`retry_first_s` up to `retry_max_s`) until it succeeds; any later
  successful save (or `close()`) writes the pending state too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from app.errors import GatewayError
from app.metrics import Metrics
from app.runtimes.process_record import ProcessRecord
from app.tasks import cancel_and_wait, spawn

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
FORMAT_VERSION = 1
# A save that failed for `put()` is retried after this, doubling up to RETRY_MAX_S.
RETRY_FIRST_S: Final = 1.0
RETRY_MAX_S: Final = 60.0


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

    def __init__(
        self,
        directory: Path,
        *,
        metrics: Metrics | None = None,
        on_change: Callable[[], None] | None = None,
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self.path = directory / STATE_FILE
        self._data: dict[str, Any] | None = None
        self._metrics = metrics
        self._on_change = on_change  # `persisted` flipped (the live status shows it)
        self._retry_first_s = retry_first_s
        self._retry_max_s = retry_max_s
        # The last save's error while memory is ahead of the file; None: the file is current.
        self._pending: str | None = None
        self._retry: asyncio.Task[None] | None = None
        if metrics is not None:
            metrics.state_persisted.set(1)

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
        """Replace a section and save; a save that fails raises `StateWriteError` and
        changes nothing. For what starts a hold."""
        if self._data is None:
            self._data = self.load()
        data = {**self._data, name: value}
        self.save(data)  # raises StateWriteError: then nothing changed
        self._data = data
        self._saved()

    def put(self, name: str, value: Any) -> None:
        """Replace a section now and save it when the file can be written: never raises
        for a write that fails (see the module docstring). For what ends a hold."""
        if self._data is None:
            self._data = self.load()
        self._data = {**self._data, name: value}
        try:
            self.save(self._data)
        except StateWriteError as exc:
            self._behind(exc)
        else:
            self._saved()

    @property
    def persisted(self) -> bool:
        """Whether the file holds what memory holds."""
        return self._pending is None

    def status(self) -> dict[str, Any]:
        """`/status`'s `state`: the file, whether it is current, and why not."""
        return {"path": str(self.path), "persisted": self.persisted, "error": self._pending}

    def _behind(self, exc: StateWriteError) -> None:
        first = self._pending is None
        self._pending = exc.message
        logger.warning("state kept in memory only, retrying the save path=%s error=%s",
                       self.path, exc.message)  # fmt: skip
        if self._metrics is not None:
            self._metrics.state_persisted.set(0)
        if self._retry is None or self._retry.done():
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # no loop (a synchronous caller): the next save or close()
                pass
            else:
                self._retry = spawn(self._retry_saves(), "state-save-retry")
        if first and self._on_change is not None:
            self._on_change()

    def _saved(self) -> None:
        if self._pending is None:
            return
        self._pending = None
        logger.info("state saved again path=%s", self.path)
        if self._metrics is not None:
            self._metrics.state_persisted.set(1)
        if self._on_change is not None:
            self._on_change()

    async def _retry_saves(self) -> None:
        delay = self._retry_first_s
        while self._pending is not None:
            await asyncio.sleep(delay)
            if self._pending is None or self._data is None:
                return
            try:
                self.save(self._data)
            except StateWriteError as exc:
                self._pending = exc.message
                delay = min(delay * 2, self._retry_max_s)
                logger.warning("state save retry failed path=%s error=%s next_in_s=%g",
                               self.path, exc.message, delay)  # fmt: skip
            else:
                self._saved()

    async def close(self) -> None:
        """Stop retrying; a last try to save what is pending."""
        await cancel_and_wait(self._retry)
        self._retry = None
        if self._pending is not None and self._data is not None:
            try:
                self.save(self._data)
            except StateWriteError as exc:
                logger.error("state not saved at shutdown: the file is behind path=%s error=%s",
                             self.path, exc.message)  # fmt: skip
            else:
                self._saved()

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
            if self._metrics is not None:
                self._metrics.state_save_failures.inc()
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
    Written with `StateStore.put`: a write that fails is kept in memory and retried (the
    process runs all the same; until the file is current, a crash would orphan it)."""

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
        self._store.put(PROCESSES, section)
