"""The store in one SQLite file in the state directory (`state.db`, WAL).

Each operation opens its own connection and ends it with its transaction: a file
removed, a directory replaced or a disk gone under a running gateway is an error at the
next write (an open connection would write on into a deleted file), and a repaired
directory gets the schema back at the next write. The batches of usage and activity (the
one frequent write) keep theirs instead, with the same effect: before each batch one
`os.stat` of the file compares its (device, inode) with the file the connection has open,
and a file gone or replaced (its directory with it) gets a new connection, as a fresh
operation would. (The inode cannot name another file while the connection holds it open.)
A batch that fails closes the kept connection. Operations run one at a time, in the
store's thread (`app.store.writer`).

The schema is versioned: `schema_version` holds the number of `MIGRATIONS` applied; each
migration runs once, in order, in the transaction that records it. A file newer than this
code (a downgrade) is refused with an error naming both versions.

At `open`:
- a file SQLite cannot read as a database (`SQLITE_CORRUPT`, `SQLITE_NOTADB`) is set
  aside (`state.db.corrupt`, with its `-wal`) and the store starts empty, as an
  unreadable state file always was;
- a `state.json` (the JSON state of earlier versions) is imported as the sections, then
  renamed `state.json.migrated`; an unreadable one is set aside as `state.corrupt`
  (the earlier versions' rule) and nothing is imported.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from app.activity import Entry, WaitKind
from app.store.base import StoreError, UsageQuery, UsageRow

logger = logging.getLogger(__name__)

T = TypeVar("T")

DB_FILE: Final = "state.db"
JSON_FILE: Final = "state.json"  # earlier versions' state, imported once
JSON_VERSION: Final = 1
BUSY_TIMEOUT_S: Final = 5.0
PRIVATE_DIR: Final = 0o700  # the state directory
PRIVATE_FILE: Final = 0o600  # state.db, and its -wal and -shm (SQLite copies the mode)
_CORRUPT_CODES: Final = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})

GROUPS: Final = ("model", "key", "route", "day")
_ACTIVITY_COLUMNS: Final = (
    "at, key, model, route, api, status, prompt_tokens, completion_tokens, wait_s, "
    "wait_reason, fallbacks, duration_s"
)

# A batch's activity rows in one statement, as one JSON array that SQLite reads
# (`json_each`): `executemany` steps once a row, and takes the interpreter's lock back
# after each step, a wait for the event loop's thread each time while it serves requests.
_ACTIVITY_FROM_JSON: Final = (
    f"INSERT INTO activity ({_ACTIVITY_COLUMNS}) SELECT "
    + ", ".join(f"json_extract(value, '$[{i}]')" for i in range(_ACTIVITY_COLUMNS.count(",") + 1))
    + " FROM json_each(?)"
)


def _v1(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE sections (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute(
        "CREATE TABLE usage (day TEXT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL, "
        "route TEXT NOT NULL, cloud INTEGER NOT NULL, requests INTEGER NOT NULL, "
        "prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, "
        "cloud_tokens INTEGER NOT NULL, PRIMARY KEY (day, key, model, route))"
    )
    db.execute(
        "CREATE TABLE activity (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, "
        "key TEXT, model TEXT, route TEXT, api TEXT NOT NULL, status INTEGER NOT NULL, "
        "prompt_tokens INTEGER, completion_tokens INTEGER, wait_s REAL NOT NULL, "
        "wait_reason TEXT NOT NULL, fallbacks INTEGER NOT NULL, duration_s REAL NOT NULL)"
    )
    db.execute("CREATE INDEX activity_at ON activity (at)")


# In order; never edit one that shipped: add the next.
MIGRATIONS: Final[tuple[Callable[[sqlite3.Connection], None], ...]] = (_v1,)


def describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"[Errno {exc.errno}] {exc.strerror}{where}"
    return str(exc) or type(exc).__name__


class SqliteStore:
    """`app.store.base.Store` in `directory/state.db`."""

    def __init__(
        self, directory: Path, *, connect: Callable[[str], sqlite3.Connection] | None = None
    ) -> None:
        self.path = directory / DB_FILE
        self._connect_to = connect or _connect
        self._set_aside: str | None = None
        self._opened = False
        self._usage_lost = False
        # The batches' connection and the (device, inode) of the file it has open.
        self._kept: sqlite3.Connection | None = None
        self._kept_file: tuple[int, int] | None = None

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def set_aside(self) -> str | None:
        return self._set_aside

    # -- connections ------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        if not self.path.exists():  # SQLite gives its -wal and -shm the file's mode
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE))
        db = self._connect_to(str(self.path))
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            self._migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def _run(
        self,
        what: str,
        work: Callable[[sqlite3.Connection], T],
        *,
        write: bool = True,
        kept: bool = False,
    ) -> T:
        """`work` in one transaction on a fresh connection, or on the batches' kept one
        (`kept`); a write takes the write lock first. Any failure as `StoreError`, the
        transaction rolled back (and the kept connection closed)."""
        try:
            db = self._kept_connection() if kept else self._connect()
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = work(db)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
                return result
            except BaseException:
                if kept:
                    self._drop_kept()
                raise
            finally:
                if not kept:
                    db.close()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot {what} {self.path}: {describe(exc)}") from None

    def _kept_connection(self) -> sqlite3.Connection:
        """The batches' connection, new when the file it has open is no longer the one
        at `path` (removed, replaced, its directory replaced) or there is none."""
        try:
            found = os.stat(self.path)
            current: tuple[int, int] | None = (found.st_dev, found.st_ino)
        except OSError:  # gone, or its directory is not one: a new connection says why
            current = None
        if self._kept is not None and current is not None and current == self._kept_file:
            return self._kept
        self._drop_kept()
        db = self._connect()
        try:
            opened = os.stat(self.path)
        except OSError:
            db.close()
            raise
        self._kept, self._kept_file = db, (opened.st_dev, opened.st_ino)
        return db

    def _drop_kept(self) -> None:
        db, self._kept, self._kept_file = self._kept, None, None
        if db is not None:
            db.close()

    def _migrate(self, db: sqlite3.Connection) -> None:
        with db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            version = 0 if row is None else int(row[0])
            if version > len(MIGRATIONS):
                raise sqlite3.DatabaseError(
                    f"schema version {version} is newer than this gateway's "
                    f"({len(MIGRATIONS)}): it was written by a later version"
                )
            if version == len(MIGRATIONS):
                return
            db.execute("BEGIN IMMEDIATE")  # one migrator at a time
            row = db.execute("SELECT version FROM schema_version").fetchone()
            version = 0 if row is None else int(row[0])
            for migration in MIGRATIONS[version:]:
                migration(db)
            db.execute("DELETE FROM schema_version")
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (len(MIGRATIONS),))

    # -- opening ----------------------------------------------------------------------

    @property
    def usage_lost(self) -> bool:
        """The database was set aside at `open`: what it held (today's spend) is unknown."""
        return self._usage_lost

    def open(self) -> None:
        """Open (migrate, set aside a corrupt file, import an earlier `state.json`); any
        failure as `StoreError`."""
        if self._opened:
            return
        try:
            self._open()
        except OSError as exc:  # setting a file aside, importing the old one
            raise StoreError(f"cannot open {self.path}: {describe(exc)}") from None

    def _open(self) -> None:
        try:
            db = self._connect()
            try:
                db.execute("SELECT count(*) FROM sections").fetchone()
            finally:
                db.close()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", None) not in _CORRUPT_CODES:
                raise StoreError(f"cannot open {self.path}: {describe(exc)}") from None
            self._put_aside(exc)
        except OSError as exc:
            raise StoreError(f"cannot open {self.path}: {describe(exc)}") from None
        self._make_private()
        self._import_json()
        self._opened = True

    def _make_private(self) -> None:
        """The directory 0700 and the database's files 0600 (usage names every key): an
        earlier version's, or one made under a loose umask, is tightened once, at open."""
        paths = [self.path.parent] + [Path(f"{self.path}{s}") for s in ("", "-wal", "-shm")]
        for path in paths:
            mode = PRIVATE_DIR if path == self.path.parent else PRIVATE_FILE
            try:
                if path.stat().st_mode & 0o777 != mode:
                    path.chmod(mode)
                    logger.info("state made private path=%s mode=%o", path, mode)
            except OSError as exc:  # gone, or not ours: the data stays readable as it was
                if path.exists():
                    logger.warning("state not made private path=%s error=%s", path,
                                   describe(exc))  # fmt: skip

    def _put_aside(self, exc: sqlite3.DatabaseError) -> None:
        aside = self.path.with_name(DB_FILE + ".corrupt")
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(self.path) + suffix)
            if source.exists():
                os.replace(source, Path(str(aside) + suffix))
        self._set_aside = str(aside)
        self._usage_lost = True
        logger.error("state database unreadable, set aside path=%s moved_to=%s error=%s",
                     self.path, aside, describe(exc))  # fmt: skip

    def _import_json(self) -> None:
        source = self.path.with_name(JSON_FILE)
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            version = data.pop("version", None)
            if type(version) is not int or version != JSON_VERSION:  # `true` is not 1
                raise ValueError(f"expected version {JSON_VERSION}, found {version!r}")
        except FileNotFoundError:
            return
        except ValueError as exc:  # bad JSON, bad UTF-8, wrong shape or version
            aside = source.with_suffix(".corrupt")
            os.replace(source, aside)
            self._set_aside = str(aside)
            logger.error("state file unreadable, set aside path=%s moved_to=%s error=%s",
                         source, aside, exc)  # fmt: skip
            return
        rows = [(name, json.dumps(value)) for name, value in data.items()]
        self._run("import the state file into", lambda db: db.executemany(
            "INSERT OR REPLACE INTO sections (name, value) VALUES (?, ?)", rows))  # fmt: skip
        migrated = source.with_name(JSON_FILE + ".migrated")
        os.replace(source, migrated)
        logger.info("state file imported path=%s into=%s sections=%s renamed_to=%s",
                    source, self.path, ",".join(sorted(data)) or "-", migrated)  # fmt: skip

    # -- sections ---------------------------------------------------------------------

    def read_sections(self) -> dict[str, Any]:
        def read(db: sqlite3.Connection) -> dict[str, Any]:
            found: dict[str, Any] = {}
            for name, value in db.execute("SELECT name, value FROM sections"):
                try:
                    found[name] = json.loads(value)
                except ValueError:
                    logger.error("state section unreadable, ignored section=%s", name)
            return found

        return self._run("read the state from", read, write=False)

    def write_sections(self, sections: dict[str, Any]) -> None:
        rows = [(name, json.dumps(value, sort_keys=True)) for name, value in sections.items()]

        def write(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM sections")
            db.executemany("INSERT INTO sections (name, value) VALUES (?, ?)", rows)

        self._run("save the gateway state to", write)

    def write_section(self, name: str, value: str) -> None:
        """One section (`value`: its JSON) replaced: one upsert, on a fresh connection like
        every other state write (in the store's thread, off the event loop)."""

        def write(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO sections (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (name, value),
            )

        self._run("save the gateway state to", write)

    def check_writable(self) -> None:
        def check(db: sqlite3.Connection) -> None:
            # The write lock is taken (the files can be written); a change rolled back.
            db.execute("DELETE FROM sections WHERE name = ''")

        self._run("save the gateway state to", check)

    # -- usage and activity -----------------------------------------------------------

    def write_batch(self, usage: list[UsageRow], activity: list[Entry]) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT INTO usage (day, key, model, route, cloud, requests, prompt_tokens, "
                "completion_tokens, cloud_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (day, key, model, route) DO UPDATE SET "
                "requests = requests + excluded.requests, cloud = excluded.cloud, "
                "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                "completion_tokens = completion_tokens + excluded.completion_tokens, "
                "cloud_tokens = cloud_tokens + excluded.cloud_tokens",
                summed_usage(usage),
            )
            if activity:
                rows = [(e.at, e.key, e.model, e.route, e.api, e.status, e.prompt_tokens,
                         e.completion_tokens, e.wait_s, str(e.wait_reason), e.fallbacks,
                         e.duration_s) for e in activity]  # fmt: skip
                db.execute(_ACTIVITY_FROM_JSON, (json.dumps(rows),))

        self._run("save usage to", write, kept=True)

    def cloud_spent(self, day: str) -> dict[str, int]:
        def read(db: sqlite3.Connection) -> dict[str, int]:
            rows = db.execute(
                "SELECT key, SUM(cloud_tokens) FROM usage WHERE day = ? GROUP BY key", (day,)
            )
            return {key: int(total) for key, total in rows}

        return self._run("read the cloud budgets from", read, write=False)

    def usage(self, query: UsageQuery) -> list[dict[str, Any]]:
        if query.group_by not in GROUPS:
            raise ValueError(f"group_by: one of {', '.join(GROUPS)}")
        column = query.group_by  # from GROUPS: never the request's text
        where, args = _where(query.since, query.until, query.key)
        extra = ", MAX(cloud)" if column == "route" else ""
        order = "1" if column == "day" else "SUM(prompt_tokens) + SUM(completion_tokens) DESC, 1"
        sql = (
            f"SELECT {column}, SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), "
            f"SUM(cloud_tokens){extra} FROM usage{where} GROUP BY {column} ORDER BY {order}"
        )

        def read(db: sqlite3.Connection) -> list[dict[str, Any]]:
            found = []
            for row in db.execute(sql, args):
                item = {column: row[0], "requests": row[1], "prompt_tokens": row[2],
                        "completion_tokens": row[3], "cloud_tokens": row[4]}  # fmt: skip
                if column == "route":
                    item["cloud"] = bool(row[5])
                found.append(item)
            return found

        return self._run("read usage from", read, write=False)

    def usage_by_key_route(self, since: str, until: str) -> list[dict[str, Any]]:
        where, args = _where(since, until, None)

        def read(db: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = db.execute(
                "SELECT key, day, route, MAX(cloud), SUM(prompt_tokens), "
                f"SUM(completion_tokens) FROM usage{where} GROUP BY key, day, route",
                args,
            )
            return [
                {"key": k, "day": d, "route": r, "cloud": bool(c), "prompt_tokens": p,
                 "completion_tokens": o} for k, d, r, c, p, o in rows
            ]  # fmt: skip

        return self._run("read usage from", read, write=False)

    def recent_activity(self, limit: int) -> list[Entry]:
        def read(db: sqlite3.Connection) -> list[Entry]:
            rows = db.execute(
                f"SELECT {_ACTIVITY_COLUMNS} FROM activity ORDER BY id DESC LIMIT ?", (limit,)
            ).fetchall()
            entries = []
            for row in reversed(rows):
                (at, key, model, route, api, status, prompt, completion, wait_s, reason,
                 fallbacks, duration) = row  # fmt: skip
                try:
                    kind = WaitKind(reason)
                except ValueError:
                    kind = WaitKind.NONE
                entries.append(Entry(at, key, model, route, api, status, prompt, completion,
                                     wait_s, kind, fallbacks, duration))  # fmt: skip
            return entries

        return self._run("read the activity from", read, write=False)

    def prune_activity(self, before: float, keep_rows: int) -> int:
        def prune(db: sqlite3.Connection) -> int:
            gone = db.execute("DELETE FROM activity WHERE at < ?", (before,)).rowcount
            edge = db.execute(
                "SELECT id FROM activity ORDER BY id DESC LIMIT 1 OFFSET ?", (keep_rows,)
            ).fetchone()
            if edge is not None:
                gone += db.execute("DELETE FROM activity WHERE id <= ?", (edge[0],)).rowcount
            return int(gone)

        return self._run("prune the activity in", prune)

    def close(self) -> None:
        """Close the batches' connection (nothing else stays open between operations)."""
        self._drop_kept()


def summed_usage(usage: list[UsageRow]) -> list[tuple[str, str, str, str, int, int, int, int, int]]:
    """A batch's rows summed per (day, key, model, route), in first-seen order: one upsert
    per ledger row instead of one per request (the ledger's sums are the same; `cloud` is
    the last request's, as row by row)."""
    sums: dict[tuple[str, str, str, str], list[int]] = {}
    for r in usage:
        row = sums.setdefault((r.day, r.key, r.model, r.route), [0, 0, 0, 0, 0])
        row[0] = int(r.cloud)
        row[1] += 1
        row[2] += r.prompt_tokens
        row[3] += r.completion_tokens
        row[4] += r.cloud_tokens
    return [(*k, v[0], v[1], v[2], v[3], v[4]) for k, v in sums.items()]


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (`with db` commits what BEGIN began;
    # a plain statement outside one commits by itself).
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    return db


def _where(since: str | None, until: str | None, key: str | None) -> tuple[str, list[str]]:
    clauses, args = [], []
    if since is not None:
        clauses.append("day >= ?")
        args.append(since)
    if until is not None:
        clauses.append("day <= ?")
        args.append(until)
    if key is not None:
        clauses.append("key = ?")
        args.append(key)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), args
