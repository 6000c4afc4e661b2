"""One gateway per state directory: `serve` holds an OS lock on `STATE_DIR/gateway.lock`
for its process's life (`flock`: a crash or a `kill -9` frees it), so a second gateway on
the same directory refuses to start instead of taking the first one's backends for
leftovers (stopping them, or adopting and stopping them at its own exit) and its
records for its own. The file says who holds it (pid, address, since when), for the
refusal's message; its contents are never trusted for the lock itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

LOCK_FILE: Final = "gateway.lock"


class StateDirBusy(Exception):
    """Another process holds the directory's lock; `holder` is what its file says."""

    def __init__(self, directory: Path, holder: dict[str, Any]) -> None:
        self.directory = directory
        self.holder = holder
        super().__init__(busy_message(directory, holder))


def busy_message(directory: Path, holder: dict[str, Any]) -> str:
    who = "another gateway"
    if isinstance(holder.get("pid"), int):
        who += f" (pid {holder['pid']}"
        if holder.get("host") is not None and isinstance(holder.get("port"), int):
            who += f", listening on {holder['host']}:{holder['port']}"
        if isinstance(holder.get("since"), (int, float)):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
            who += f", since {since}"
        who += ")"
    return (
        f"the state directory {directory} is in use by {who}: two gateways on one state "
        "directory stop each other's backends. Stop that one, or give this one its own "
        "state directory (MICROSCHEDULER_STATE_DIR, or a config directory of another name)"
    )


@dataclass
class StateDirLock:
    """The lock, held while the descriptor is open (`release` or the process's end)."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def take(directory: Path, *, host: str, port: int, pid: int | None = None) -> StateDirLock:
    """Lock `directory` (created 0700 if missing) for this process; raises `StateDirBusy`
    when another holds it, `OSError` when the lock file cannot be opened at all (a
    read-only directory: the caller decides)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise StateDirBusy(directory, holder) from None
    except BaseException:
        os.close(fd)
        raise
    record = {"pid": pid or os.getpid(), "host": host, "port": port, "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode() + b"\n", 0)
    return StateDirLock(path, fd)


def _read(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
