"""The gateway's small persistent state (VRAM zones and yield, the active GPU profile, the
process backends it started, learned routes, start durations): named sections, kept in
memory and saved in the store (`app.store`: the `sections` table of `state.db` in the state
directory), all of them in one transaction, so a crash leaves the old or the new state,
never half of one. A database that cannot be read is reported and set aside
(`state.db.corrupt`), and the gateway starts with empty state rather than not at all; the
`state.json` of earlier versions is imported once (then renamed `state.json.migrated`).

Two kinds of change, two answers to a write that fails (the directory read-only,
missing or full):

- `update()` (a new hold: a zone acquired, a yield taken, a profile switched) is refused:
  `StateWriteError`, an OpenAI-envelope 500 naming the database and the error, and the
  in-memory state stays what it was. `check_writable()` finds that out before the caller
  acts (a zone acquire or a yield checks before it stops anything).
- `put()` (the end of a hold: a release, a restore, an expiry) always takes effect in
  memory, since refusing it would keep backends blocked (and their traffic on paid
  providers) because of a full disk. The store is then behind: a warning is logged,
  `microscheduler_state_save_failures_total` counts it, `status()` (in `/status`) says
  `persisted: false` with the error, and a background task retries the save with a
  doubling delay (`retry_first_s` up to `retry_max_s`) until it succeeds; any later
  successful save (or `close()`) writes the pending state too.

- A store that cannot be opened at start (the directory read-only, a file, gone) is not
  fatal: the gateway runs on empty state and says so (an error in the log, `persisted:
  false` in `/status` with the reason, the metric at 0). For the rest of its run it refuses
  every new hold and writes nothing there, so what it could not read is never overwritten
  with empty state; a restart reads it once the directory is usable.

Every store operation runs in the store's thread (`app.store.writer.StoreWriter`).
`update()` waits for its save (a new hold is saved before it is acted on), blocking its
thread; `hold()` is the same awaited on the event loop (the loop serves while the store's
thread saves); `put()` on the event loop queues its one-section upsert behind the
operations before it and goes on (a start, a wake, a release never wait for the disk).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, ParamSpec, TypeVar

from app.errors import GatewayError
from app.lifecycle.metrics import LifecycleMetrics
from app.runtimes.process_record import ProcessRecord
from app.settings.root import STATE_ROOT, default_state_dir
from app.store.base import StoreError
from app.store.sqlite import DB_FILE, JSON_FILE, SqliteStore
from app.store.writer import StoreWriter
from app.tasks import cancel_and_wait, spawn

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
# A save that failed for `put()` is retried after this, doubling up to RETRY_MAX_S.
RETRY_FIRST_S: Final = 1.0
RETRY_MAX_S: Final = 60.0


def earlier_shared_state(state_dir: Path, config_dir: Path) -> Path | None:
    """The state file an earlier version left in `var/`, where it kept the state of every
    configuration, when this one now keeps its own elsewhere by default
    (`app.settings.root.default_state_dir`: `var/<config directory name>`) and has none
    there yet: the start-up says so, and how to carry it over, so nothing is lost silently.
    None when `state_dir` is `var` (the default configuration keeps using it) or set."""
    if state_dir == STATE_ROOT or state_dir != default_state_dir(config_dir):
        return None
    if any((state_dir / name).exists() for name in (DB_FILE, JSON_FILE)):
        return None
    return next((STATE_ROOT / n for n in (DB_FILE, JSON_FILE) if (STATE_ROOT / n).is_file()), None)


class StateWriteError(GatewayError):
    """The state could not be saved: 500, `internal_error`, naming the store and the
    error. Nothing was changed (in memory or in the store)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class StateStore:
    """Sections (`zones`, `profile`, ...) owned by different parts of the gateway, saved
    together: `update(section, value)` saves every section with that one replaced.

    `writer` is the store's (shared with usage and activity); without one, the store is
    `state.db` in `directory`, opened here and closed by `close()`."""

    def __init__(
        self,
        directory: Path,
        *,
        metrics: LifecycleMetrics | None = None,
        on_change: Callable[[], None] | None = None,
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
        writer: StoreWriter | None = None,
    ) -> None:
        self._owns_writer = writer is None
        self.writer = writer if writer is not None else StoreWriter(SqliteStore(directory))
        self._data: dict[str, Any] | None = None
        self._metrics = metrics
        self._on_change = on_change  # `persisted` flipped (the live status shows it)
        self._retry_first_s = retry_first_s
        self._retry_max_s = retry_max_s
        # The last save's error while memory is ahead of the store; None: it is current.
        self._pending: str | None = None
        # Why the store could not be read at start; None once it was read.
        self._unread: str | None = None
        self._retry: asyncio.Task[None] | None = None
        self._queued: set[asyncio.Future[None]] = set()  # `put()` saves not yet done
        if metrics is not None:
            metrics.state_persisted.set(1)

    @property
    def location(self) -> str:
        return self.writer.store.location

    def names(self) -> list[str]:
        """The sections the store holds."""
        return sorted(self._loaded())

    def section(self, name: str, default: Any = None) -> Any:
        return self._loaded().get(name, default)

    def _loaded(self) -> dict[str, Any]:
        if self._data is None:
            try:
                self._data = self.load()
            except StateWriteError as exc:
                self._start_unread(exc)
                self._data = {}
        return self._data

    def _refuse_unread(self) -> None:
        if self._unread is not None:  # a save now would write over what was not read
            raise StateWriteError(self._unread)

    def _start_unread(self, exc: StateWriteError) -> None:
        """The store could not be opened at all (the directory read-only, a file, gone):
        the gateway runs on empty state rather than not at all, and for this run never
        writes it (what it could not read is never overwritten) and refuses new holds."""
        self._unread = (
            f"the gateway state at {self.location} could not be read at start "
            f"({exc.message}): new holds are refused; restart the gateway once it can be read"
        )
        self._pending = self._unread
        logger.error("state not read, running on empty state: new holds are refused until "
                     "a restart path=%s error=%s", self.location, exc.message)  # fmt: skip
        if self._metrics is not None:
            self._metrics.state_persisted.set(0)

    def update(self, name: str, value: Any) -> None:
        """Replace a section and save; a save that fails raises `StateWriteError` and
        changes nothing. Waits for the disk: for start-up and tools, off the event loop
        (on the loop, a hold is `hold()`)."""
        data = {**self._loaded(), name: value}
        self._refuse_unread()
        self.save(data)  # raises StateWriteError: then nothing changed
        self._data = data
        self._saved()

    async def hold(self, name: str, value: Any) -> None:
        """`update()` awaited on the event loop: the save runs on the store's thread, in
        order with every store operation queued before it, and the loop serves meanwhile
        (the caller waits, a hold is still saved before it acts). A save that fails raises
        `StateWriteError` and changes nothing. What other sections `put()` changed during
        the wait is kept; a change of this same section meanwhile is the caller's to
        merge (its save was queued after this one)."""
        data = {**self._loaded(), name: value}  # first: a store not read refuses below
        self._refuse_unread()
        saved = asyncio.wrap_future(self.writer.submit(self.writer.store.write_sections, data))
        try:
            await saved
        except (StoreError, TypeError, ValueError) as exc:
            raise self._failed(exc) from None
        self._data = {**self._loaded(), name: value}
        self._saved()

    async def ensure_writable(self) -> None:
        """`check_writable()` awaited on the event loop (the store's thread does it)."""
        self._refuse_unread()
        try:
            await asyncio.wrap_future(self.writer.submit(self.writer.store.check_writable))
        except StoreError as exc:
            raise StateWriteError(exc.message) from None

    def put(self, name: str, value: Any) -> None:
        """Replace a section now and save it when the store can be written: never raises
        for a write that fails (see the module docstring). For what ends a hold, and
        what only informs (start durations, learned routes, process records).

        On the event loop the save is queued, not waited for: one upsert of the section,
        in order with every other store operation on the store's thread (its one worker
        runs them first come, first served); a failure is taken up on the loop
        (`_behind`). Without a running loop (start-up, tools) it is done at once."""
        self._data = {**self._loaded(), name: value}
        if self._unread is not None:  # memory only: the store was never read
            return
        store = self.writer.store
        if self._pending is not None:  # behind: this save writes every section, then current
            call: tuple[Callable[..., None], tuple[Any, ...]] = (
                store.write_sections,
                (dict(self._data),),
            )
        else:
            try:
                text = json.dumps(value, sort_keys=True)
            except (TypeError, ValueError) as exc:
                self._behind(self._failed(exc))
                return
            call = (store.write_section, (name, text))
        fn, args = call
        try:  # a sync caller (start-up, tools): done at once
            asyncio.get_running_loop()
        except RuntimeError:
            try:
                self._in_thread(fn, *args)
            except (StoreError, TypeError, ValueError) as exc:
                self._behind(self._failed(exc))
            else:
                if fn == store.write_sections:
                    self._saved()
            return
        queued = asyncio.wrap_future(self.writer.submit(fn, *args))  # it ends on the loop
        self._queued.add(queued)
        queued.add_done_callback(functools.partial(self._put_done, full=fn == store.write_sections))

    async def settled(self) -> None:
        """Until every save `put()` queued so far has ended and been taken up."""
        if self._queued:  # each one's `_put_done` runs before this wait ends
            await asyncio.wait(set(self._queued))

    def _put_done(self, done: asyncio.Future[None], *, full: bool) -> None:
        """A queued save ended (on the loop). One section's success does not make the
        store current when an earlier save failed; a save of every section (`full`) does."""
        self._queued.discard(done)
        exc = done.exception()
        if isinstance(exc, StoreError | TypeError | ValueError):
            self._behind(self._failed(exc))
        elif exc is not None:
            logger.error("state save failed path=%s", self.location, exc_info=exc)
            self._behind(StateWriteError(f"cannot save the gateway state: {exc}"))
        elif full:
            self._saved()

    @property
    def persisted(self) -> bool:
        """Whether the store holds what memory holds."""
        return self._pending is None

    def status(self) -> dict[str, Any]:
        """`/status`'s `state`: the store, whether it is current, and why not."""
        return {
            "path": self.location,
            "persisted": self.persisted,
            "error": self._pending,
            "usage": self.writer.status(),  # usage and activity waiting for their batch
        }

    def _behind(self, exc: StateWriteError) -> None:
        first = self._pending is None
        self._pending = exc.message
        logger.warning("state kept in memory only, retrying the save path=%s error=%s",
                       self.location, exc.message)  # fmt: skip
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
        logger.info("state saved again path=%s", self.location)
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
                await self.writer.run(self.save, self._data)
            except StateWriteError as exc:
                self._pending = exc.message
                delay = min(delay * 2, self._retry_max_s)
                logger.warning("state save retry failed path=%s error=%s next_in_s=%g",
                               self.location, exc.message, delay)  # fmt: skip
            else:
                self._saved()

    async def close(self) -> None:
        """Wait for the queued saves; stop retrying; a last try to save what is pending."""
        await self.settled()
        await cancel_and_wait(self._retry)
        self._retry = None
        if self._unread is not None:
            logger.error("state not saved at shutdown: it was not read at start path=%s",
                         self.location)  # fmt: skip
        elif self._pending is not None and self._data is not None:
            try:
                await self.writer.run(self.save, self._data)
            except StateWriteError as exc:
                logger.error("state not saved at shutdown: the store is behind path=%s "
                             "error=%s", self.location, exc.message)  # fmt: skip
            else:
                self._saved()
        if self._owns_writer:
            await self.writer.close()

    def check_writable(self) -> None:
        """Take the store's write lock and let it go, so a read-only, missing or full
        directory is found before anything acts on it; raises `StateWriteError`."""
        self._refuse_unread()
        try:
            self._in_thread(self.writer.store.check_writable)
        except StoreError as exc:
            raise StateWriteError(exc.message) from None

    def load(self) -> dict[str, Any]:
        """Every section as saved (the store opened, migrated or set aside first)."""
        try:
            self._in_thread(self.writer.store.open)
            return self._in_thread(self.writer.store.read_sections)
        except StoreError as exc:
            raise StateWriteError(exc.message) from None

    def save(self, data: dict[str, Any]) -> None:
        """Save every section of `data` in one transaction; an error is raised as
        `StateWriteError` (and counted), the store unchanged."""
        try:
            self._in_thread(self.writer.store.write_sections, data)
        except (StoreError, TypeError, ValueError) as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: StoreError | TypeError | ValueError) -> StateWriteError:
        """A save's failure, counted, as the `StateWriteError` that says it."""
        if self._metrics is not None:
            self._metrics.state_save_failures.inc()
        if isinstance(exc, StoreError):
            return StateWriteError(exc.message)
        return StateWriteError(f"cannot save the gateway state to {self.location}: {exc}")

    def _in_thread(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return self.writer.call(fn, *args, **kwargs)


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
